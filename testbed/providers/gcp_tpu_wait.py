"""How the TPU provider waits: polls that back off with jitter, bounded by a deadline (the real service's pacing:
creates take minutes, queued resources can wait for hours)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass


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


class Pacer:
    """The pauses of one bounded wait: growing with jitter up to a cap, never past ``deadline``."""

    def __init__(self, polling: Polling, deadline: float, cap: float | None = None):
        self.polling, self.deadline = polling, deadline
        self.cap = cap if cap is not None else polling.max_interval
        self.delay = polling.interval

    def reset(self) -> None:
        """Something changed: poll briskly again."""
        self.delay = self.polling.interval

    def next(self) -> float:
        """The next pause in seconds (and grow the one after it)."""
        p = self.polling
        d = self.delay * (1 + random.uniform(-p.jitter, p.jitter))
        self.delay = min(self.cap, self.delay * p.multiplier)
        return max(0.0, min(d, self.deadline - time.monotonic()))

    def sleep(self) -> float:
        d = self.next()
        time.sleep(d)
        return d


def duration(seconds: float) -> str:
    """``95`` -> ``1 min 35 s``; ``7260`` -> ``2 h 1 min``."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
