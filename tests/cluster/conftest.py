from contextlib import ExitStack

import pytest

from tests.support.log_service import running_log_service


@pytest.fixture
def log_service():
    """start(log_dir, witness_keys=()) -> base URL of a log service on a free loopback port, stopped
    after the test."""
    with ExitStack() as stack:
        yield lambda log_dir, witness_keys=(): stack.enter_context(running_log_service(log_dir, witness_keys))
