"""How the TPU provider waits: polls that back off with jitter, bounded by a deadline (the real service's pacing:
creates take minutes, queued resources can wait for hours)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.providers.base import Pacer


@dataclass(frozen=True)
class Polling:
    """How often and how long the provider asks the API and the workers (tests pass small values).

    A wait polls after ``interval`` s, then ``multiplier`` times longer each time up to ``max_interval`` (queued
    resources: ``queue_max_interval``), each sleep jittered by +-``jitter`` and never past the wait's deadline;
    a state change polls briskly again."""

    interval: float = 5.0  # first pause between polls of nodes, queued resources and operations
    max_interval: float = 30.0  # TPU creates take minutes
    queue_max_interval: float = 60.0  # queued resources can wait for hours
    multiplier: float = 1.5
    jitter: float = 0.2
    ssh_interval: float = 2.0  # between SSH handshake attempts on a worker
    rpc_timeout: float = 60.0  # per API request
    retry_initial: float = 1.0  # first back-off when a read gets 503/500/429
    retry_maximum: float = 10.0
    report_every: float = 30.0  # heartbeat progress line while nothing changes
    delete_timeout: float = 900.0


FAST_POLLING = Polling(interval=0.02, max_interval=0.05, queue_max_interval=0.05, ssh_interval=0.1, rpc_timeout=5,
                       retry_initial=0.01, retry_maximum=0.05, report_every=1.0, delete_timeout=10)


def pace(polling: Polling, deadline: float, cap: float | None = None) -> Pacer:
    """The pauses of one TPU wait (``cap``: the longest pause; default ``polling.max_interval``)."""
    return Pacer(polling.interval, deadline, cap=cap if cap is not None else polling.max_interval,
                 multiplier=polling.multiplier, jitter=polling.jitter)


def duration(seconds: float) -> str:
    """``95`` -> ``1 min 35 s``; ``7260`` -> ``2 h 1 min``."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
