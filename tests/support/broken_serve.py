"""`traceless serve` on an engine whose every step raises (a bug outside the per-batch error
handling), run as `python -m tests.support.broken_serve SERVE-ARGS`: the real command, with the
engine the real code builds and restarts, but LLMEngine.step replaced in this process. Only this
test double knows of it: traceless/ has no hook. Run it with --no-scrub-freed-memory (scrubbing
re-executes `traceless.cli` itself, which would leave this module behind)."""

from __future__ import annotations

import sys

from traceless.engine.llm_engine import LLMEngine


def _failing_step(self):
    raise RuntimeError("simulated engine bug")


if __name__ == "__main__":
    from traceless_tools.cli import main

    LLMEngine.step = _failing_step  # type: ignore[method-assign]  # every engine, restarted ones too
    sys.exit(main(["serve", *sys.argv[1:]]))
