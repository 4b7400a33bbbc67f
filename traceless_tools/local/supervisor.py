"""Keeping `traceless up`'s services running: a service that stops is started again after a
backoff while the others serve on; one that keeps failing ends the deployment.

Each service is started by a callable that returns its process (the same command line every time,
so it comes back on the same address). A service that ran at least `stable_s` before it stopped
starts again after the first backoff; each further quick failure waits the next one, and after
`max_failures` quick failures in a row the supervisor gives up (`GaveUp`): something is wrong
that a restart does not fix, and `up` exits non-zero.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    backoff_s: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
    stable_s: float = 60.0  # a run this long resets the count of quick failures
    max_failures: int = 5

    def __post_init__(self) -> None:
        if not self.backoff_s or min(self.backoff_s) < 0 or self.stable_s <= 0 or self.max_failures < 1:
            raise ValueError("restart policy: non-negative backoffs, stable_s > 0, max_failures >= 1")

    def delay(self, failures: int) -> float:
        return self.backoff_s[min(failures, len(self.backoff_s)) - 1]


class GaveUp(RuntimeError):
    """A service failed `max_failures` times in a row, each soon after it started."""

    def __init__(self, name: str, returncode: int | None):
        super().__init__(f"{name} keeps stopping (last exit status {returncode}); giving up")
        self.name = name


@dataclass
class _Service:
    proc: subprocess.Popen
    started_at: float
    failures: int = 0  # quick failures in a row
    restart_at: float | None = None  # set while it waits out its backoff


class Supervisor:
    def __init__(self, start: Callable[[str], subprocess.Popen], policy: RestartPolicy = RestartPolicy()):
        self._start = start
        self.policy = policy
        self._services: dict[str, _Service] = {}

    def watch(self, name: str, proc: subprocess.Popen, now: float) -> None:
        self._services[name] = _Service(proc, now)

    def poll(self, now: float) -> list[tuple[str, str]]:
        """Look at every service once: (name, what happened) for each that stopped ("stopped",
        with the delay scheduled) or was started again ("restarted"). Raises GaveUp."""
        happened = []
        for name, service in self._services.items():
            if service.restart_at is None:
                code = service.proc.poll()
                if code is None:
                    continue
                quick = now - service.started_at < self.policy.stable_s
                service.failures = service.failures + 1 if quick else 1
                if service.failures > self.policy.max_failures:
                    raise GaveUp(name, code)
                service.restart_at = now + self.policy.delay(service.failures)
                happened.append(
                    (name, f"stopped (exit status {code}); restarting in {self.policy.delay(service.failures):.0f}s")
                )
            elif now >= service.restart_at:
                service.proc, service.started_at, service.restart_at = self._start(name), now, None
                happened.append((name, "restarted"))
        return happened
