"""How a service stops on Ctrl-C or SIGTERM: a bounded drain, said on stderr.

    signal ........ new connections refused, idle ones closed; open requests may finish
    |               (event service.stopping, on stderr like every event)
    |<------------------- timeout_s ------------------->|
                         a second Ctrl-C ..............>| end_requests(): every open request ends
                                                        | properly (a stream: an error event, then
                                                        | `data: [DONE]`; its engine requests are
                                                        | aborted, their blocks freed and zeroed;
                                                        | event service.ending_requests)
                                                        |<-- END_GRACE_S -->| what is still open is
                                                                            cancelled (a cut)

A service without `end_requests` (the hops) has its open requests cancelled when the drain times
out, or at once on a second Ctrl-C. A third Ctrl-C always stops at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import uvicorn

from traceless.events import emit

DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0
# After end_requests: time for the ended streams to send their last events and close.
END_GRACE_S = 3.0


@dataclass(frozen=True, slots=True)
class Shutdown:
    """`timeout_s`: how long open requests may run on after the signal. `end_requests`: called on
    the event loop when that time is up (or at a second Ctrl-C): ends every open request properly."""

    timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    end_requests: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if not self.timeout_s >= 0:
            raise ValueError("the shutdown timeout must be zero or more seconds")

    @property
    def uvicorn_timeout_s(self) -> float:
        """uvicorn's own bound (timeout_graceful_shutdown): past it, open request tasks are cancelled."""
        return self.timeout_s + (END_GRACE_S if self.end_requests is not None else 0.0)


class GracefulServer(uvicorn.Server):
    """uvicorn's Server with the drain above; `component` names the service on stderr. Its config's
    timeout_graceful_shutdown must be `policy.uvicorn_timeout_s` (http/serve.py sets it)."""

    def __init__(self, config: uvicorn.Config, component: str, policy: Shutdown):
        super().__init__(config)
        self.component, self.policy = component, policy
        self._end_now = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in the signal handler: only flags are set here; the event loop acts on them.
        if self.should_exit and not self._end_now and self.policy.end_requests is not None:
            self._end_now = True  # the second signal: end the open requests now, properly
            return
        super().handle_exit(sig, frame)  # the first signal; without end_requests the second forces

    async def shutdown(self, sockets=None) -> None:
        emit("service.stopping", component=self.component, drain_s=self.policy.timeout_s)
        deadline = asyncio.create_task(self._deadline())
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()

    async def _deadline(self) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + self.policy.timeout_s
        while loop.time() < end and not self._end_now:
            await asyncio.sleep(0.05)
        if self.server_state.tasks:
            emit(
                "service.ending_requests",
                component=self.component,
                reason="second_signal" if self._end_now else "drain_timed_out",
            )
        if self.policy.end_requests is not None:
            self.policy.end_requests()  # else uvicorn cancels what is still open, at its own timeout (now)
