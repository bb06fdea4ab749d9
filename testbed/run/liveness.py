"""Whether a run's host is lost: several probes spaced over a bound, and a slow answer is never a lost host.

A repair replaces a host, on a cloud with a new disk; one slow probe must never cause one. A probe is a fresh SSH
login (no multiplexed connection) running testbed/scripts/alive.sh, which reports what the host itself knows (its
boot id, uptime and load, how long ago the dead-man's agent last wrote its status and a rank of the run its log);
when the host does not answer, the provider is asked what it knows of the machine. A probe's SSH result is one of:

- ``answered``: the host ran the command, however long it took;
- ``slow``: no answer within the probe's timeout, the connection timed out, or the handshake failed without saying
  why (closed or reset before the greeting, ssh's exit 255 with nothing said): what a throttled or congested link
  and an overloaded sshd look like; unknown, never lost;
- ``refused``: the host's address refuses connections: its kernel answers, so the machine is there (its sshd is
  down or restarting); never lost by itself;
- ``no-route``: nothing answers for the address (no route to the host, network unreachable);
- ``rejected``: the host answered and turned the testbed away (a refused key, a changed host key): it is there,
  and waiting does not help;
- ``other``: ssh could not be run on the controller.

Loss is proven, never inferred. A probe is *lost* when the provider says its machine is gone (down, ERROR, deleted,
preempted, terminated), or when it found no route to the host and the provider does not say the machine is up (a
link that drops even its neighbour lookups is slow, not gone). A host is judged lost when ``count`` probes in a row
were lost, the first and the last at least ``bound`` seconds apart (the suite's ``timeouts.unreachable``, raised by
the testbed's ``lost_after``), or sooner, when the provider said the machine is gone at two probes in a row (its
word is the proof the bound waits for; a repair from an image then starts seconds after the loss); any other
probe starts the count again. A refusal, a slow or failed handshake and a
throttled link never make a host lost: the run waits, and fails at its own timeout.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed import remote, scripts
from testbed.errors import TestbedError
from testbed.remote import sh

WAIT_SSH = frozenset({"slow", "refused", "no-route"})
"""What SSH found of a host that may still answer: the run waits for it (``rejected``/``other`` do not change)."""
GONE_STATES = frozenset({"down", "gone", "error", "deleted", "soft_deleted", "preempted", "terminated"})
"""Host states (``Provider.reported_states``) that say the machine is gone."""
KEEP = 12
"""Probes of one host kept in a record (the last ones)."""
_NO_ROUTE = ("No route to host", "Network is unreachable", "Host is unreachable")
_REJECTED = ("Permission denied", "Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED",
             "Too many authentication failures")


@dataclass
class Probe:
    """One look at one host: when, how long it took, what SSH found, what the provider says, what the host said."""

    host: str
    at: float
    seconds: float
    ssh: str
    detail: str = ""
    provider: str | None = None  # the machine's state at the provider (None: not asked, or it cannot tell)
    report: dict[str, str] = field(default_factory=dict)

    @property
    def lost(self) -> bool:
        """Whether this probe proves the machine gone: the provider says so, or no route to an address the
        provider does not say is up (a refusal proves the machine alive; a timeout proves nothing)."""
        if self.ssh == "answered":
            return False
        if (self.provider or "") in GONE_STATES:
            return True
        return self.ssh == "no-route" and self.provider != "up"

    @property
    def waits(self) -> bool:
        """Whether the run waits for the host after this probe (it may yet answer): slow, refusing, or lost but
        not yet judged so."""
        return self.ssh in WAIT_SSH or self.lost

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at": round(self.at, 2), "seconds": round(self.seconds, 2), "ssh": self.ssh,
                               "lost": self.lost}
        if self.detail:
            out["detail"] = self.detail
        if self.provider is not None:
            out["provider"] = self.provider
        if self.report:
            out["report"] = self.report
        return out


def classify(res: remote.HostResult) -> tuple[str, str]:
    """What one probe's SSH call found (answered, slow, refused, no-route, rejected, other: see the module) and
    the line that says so."""
    if res.error is None and res.exit_code not in (None, 255):
        return "answered", ""
    text = res.stderr.strip()
    last = text.splitlines()[-1] if text else (res.error or f"exit {res.exit_code}")
    if res.exit_code is None and res.error:  # stopped by the transport (no answer in time), or never started
        return ("slow" if res.error.startswith(("timed out", "no data")) else "other"), res.error
    if "Connection refused" in text:
        return "refused", last
    if any(s in text for s in _REJECTED):
        return "rejected", res.error or last  # the transport's sentence (a refused key: what to check)
    if "stdio forwarding failed" in text or ("kex_exchange_identification" in text and "closed" in text):
        # no SSH greeting: through a jump host (whose own reason stays with it, or with its master connection),
        # the jump could not reach the host; direct, its sshd closed at once (overloaded: MaxStartups)
        return "slow", f"{last} (no SSH greeting: a jump host could not reach it, or its sshd refused the session)"
    if any(s in text for s in _NO_ROUTE):
        return "no-route", last
    if not text:
        return "slow", f"{last}: ssh failed and said nothing (a connection dropped mid-handshake)"
    return "slow", f"{last} (the handshake failed: a throttled or congested link, or an overloaded sshd)"


def probe_command(run_dir: str | None) -> str:
    """The command of a probe: testbed/scripts/alive.sh with the run folder (its rank logs' age)."""
    return sh(scripts.program("alive.sh", run_dir or ""))


def parse_report(stdout: str) -> dict[str, str]:
    """alive.sh's ``key value`` lines."""
    out = {}
    for ln in stdout.splitlines():
        key, _, value = ln.strip().partition(" ")
        if key in ("boot", "up", "load", "agent", "log") and value and value != "-":
            out[key] = value.strip()
    return out


States = Callable[[], dict[str, str] | None]
"""The provider's view: host -> state (None: it cannot tell); may raise TestbedError."""
Notes = Callable[[], dict[str, str]]
"""What the provider said of each host's machine when last asked (``Provider.state_notes``)."""


def probe(testbed: str, hosts: list[str], *, timeout: float, run_dir: str | None = None,
          states: States | None = None, notes: Notes | None = None) -> dict[str, Probe]:
    """One probe of each of ``hosts`` in parallel, each within ``timeout`` seconds; the provider is asked (once)
    about those that did not answer, and what it says of their machines (``notes``: a Slurm node's name and
    state) goes into their probes' detail."""
    t0 = time.time()
    res = remote.run(testbed, hosts, probe_command(run_dir), timeout=timeout, connect_timeout=timeout, mux="none")
    out: dict[str, Probe] = {}
    for r in res:
        kind, detail = classify(r)
        out[r.host] = Probe(r.host, t0, r.seconds, kind, detail,
                            report=parse_report(r.stdout) if kind == "answered" else {})
    silent = [p for p in out.values() if p.ssh != "answered"]
    if silent and states is not None:
        try:
            known = states()
        except Exception as e:  # the provider's view is more evidence, never a reason for the run to fail
            why = e.what if isinstance(e, TestbedError) else f"{type(e).__name__}: {e}"
            for p in silent:
                p.detail = f"{p.detail}; the provider could not be asked: {why}".lstrip("; ")
        else:
            said = notes() if notes is not None else {}
            for p in silent:
                p.provider = (known or {}).get(p.host)
                if said.get(p.host):
                    p.detail = f"{p.detail}; {said[p.host]}".lstrip("; ")
    return out


class Judge:
    """Per host, the probes since it last answered, and whether they make it lost (see the module)."""

    def __init__(self, bound: float, count: int):
        self.bound = bound
        self.count = max(2, count)
        self.spacing = bound / (self.count - 1)
        self.spells: dict[str, list[Probe]] = {}

    def add(self, p: Probe) -> list[Probe]:
        """Record ``p`` (in the order the probes started); when the host answered, its spell without an answer
        ends: those probes (else [])."""
        if p.ssh == "answered":
            return self.answered(p.host)
        spell = self.spells.setdefault(p.host, [])
        spell.append(p)
        spell.sort(key=lambda q: q.at)
        return []

    def answered(self, host: str) -> list[Probe]:
        """The host answered (a probe or a poll): the probes of its spell without an answer, which ends."""
        return self.spells.pop(host, [])

    def spell(self, host: str) -> list[Probe]:
        return self.spells.get(host, [])

    def last(self, host: str) -> Probe | None:
        s = self.spells.get(host)
        return s[-1] if s else None

    def streak(self, host: str) -> list[Probe]:
        """The lost probes of ``host`` in a row, up to the last."""
        out: list[Probe] = []
        for p in reversed(self.spell(host)):
            if not p.lost:
                break
            out.append(p)
        return out[::-1]

    def lost(self, host: str) -> bool:
        s = self.streak(host)
        if len(s) >= 2 and all((p.provider or "") in GONE_STATES for p in s[-2:]):  # gone, by the provider, twice
            return True
        return len(s) >= self.count and s[-1].at - s[0].at >= self.bound - 1e-6

    def evidence(self, host: str) -> dict[str, Any]:
        """Why ``host`` is (or is not yet) judged lost: the bound, the count, its last probes, one sentence."""
        spell = self.spell(host)
        return {"bound": self.bound, "count": self.count, "probes": [p.to_json() for p in spell[-KEEP:]],
                "summary": summary(self.streak(host) if self.lost(host) else spell, self.bound)}


def summary(probes: list[Probe], bound: float | None = None) -> str:
    """One sentence: how many probes over how long, what SSH found and what the provider said."""
    if not probes:
        return "no probe"
    span = probes[-1].at - probes[0].at
    found = Counter(p.ssh for p in probes)
    said = Counter(p.provider for p in probes if p.provider)
    out = f"{len(probes)} probe{'s' if len(probes) > 1 else ''} over {span:.1f} s"
    if bound is not None:
        out += f" (bound {bound:g} s)"
    out += ": " + ", ".join(f"{k} x{n}" if n > 1 else k for k, n in found.most_common())
    if said:
        out += "; the provider: " + ", ".join(f"{k} x{n}" if n > 1 else k for k, n in said.most_common())
    lost = sum(p.lost for p in probes)
    out += "; every one lost" if lost == len(probes) else ("; none lost" if not lost else f"; {lost} lost")
    details = list(dict.fromkeys(p.detail for p in probes if p.detail))[:2]
    return out + (f" ({'; '.join(details)})" if details else "")


class Prober:
    """Probes in the background: each watched host is probed at once and then every ``spacing`` seconds until it is
    no longer watched (or ``until``, a time past which the run cannot be going), each probe in a thread of its own
    (at most ``per_host`` at once for one host), so that a probe's wait (a timeout, an address being resolved) holds
    neither the run's polls nor the next probe back. ``landed`` is set whenever a probe finishes."""

    def __init__(self, look: Callable[[list[str]], dict[str, Probe]], spacing: float, until: float,
                 per_host: int = 3):
        self._look = look
        self.spacing = spacing
        self._until = until
        self._per_host = per_host
        self._lock = threading.Lock()
        self._done: list[Probe] = []
        self._flying: Counter[str] = Counter()
        self._watched: dict[str, threading.Event] = {}
        self.landed = threading.Event()

    def watch(self, host: str) -> None:
        """Probe ``host`` now and every ``spacing`` seconds until :meth:`unwatch` (nothing when it is watched)."""
        with self._lock:
            if host in self._watched:
                return
            stop = self._watched[host] = threading.Event()
        threading.Thread(target=self._pace, args=(host, stop), daemon=True, name=f"probes-{host}").start()

    def unwatch(self, host: str) -> None:
        with self._lock:
            stop = self._watched.pop(host, None)
        if stop is not None:
            stop.set()

    def watching(self, host: str) -> bool:
        with self._lock:
            return host in self._watched

    def stop(self) -> None:
        """No host watched any more (the probes running finish on their own, within their timeout)."""
        with self._lock:
            hosts = list(self._watched)
        for h in hosts:
            self.unwatch(h)

    def _pace(self, host: str, stop: threading.Event) -> None:
        while not stop.is_set() and time.time() < self._until:  # bounded: unwatched, stopped, or the run's end
            with self._lock:
                free = self._flying[host] < self._per_host
                if free:
                    self._flying[host] += 1
            if free:
                threading.Thread(target=self._run, args=(host,), daemon=True, name=f"probe-{host}").start()
            stop.wait(self.spacing)

    def _run(self, host: str) -> None:
        t0 = time.time()
        try:
            p = self._look([host]).get(host) or Probe(host, t0, time.time() - t0, "other", "no probe result")
        except Exception as e:  # a bug, recorded as what the probe found rather than lost with the thread
            p = Probe(host, t0, time.time() - t0, "other", f"the probe failed: {type(e).__name__}: {e}")
        with self._lock:
            self._done.append(p)
            self._flying[host] -= 1
            self.landed.set()

    def take(self) -> list[Probe]:
        """The probes finished since the last call, in the order they started."""
        with self._lock:
            self.landed.clear()
            out, self._done = sorted(self._done, key=lambda q: q.at), []
        return out

    def wait(self, timeout: float) -> None:
        """Until no probe is running (``timeout`` seconds at most)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not +self._flying:
                    return
            time.sleep(0.05)


def confirm(judge: Judge, hosts: list[str], look: Callable[[list[str]], dict[str, Probe]],
            record: Callable[[Probe], None], sleep: Callable[[float], None] = time.sleep
            ) -> tuple[list[str], dict[str, Probe]]:
    """Probe ``hosts`` now and, while some are lost but not yet judged so, again every ``spacing`` seconds
    (``count`` rounds at most), each probe given to ``record`` (which adds it to ``judge``): the hosts judged lost,
    and each host's last probe."""
    last: dict[str, Probe] = {}
    todo = list(hosts)
    for i in range(judge.count):
        if i:
            sleep(judge.spacing)
        for h, p in look(todo).items():
            last[h] = p
            record(p)
        todo = [h for h in todo if h in last and last[h].lost and not judge.lost(h)]
        if not todo:
            break
    return [h for h in hosts if judge.lost(h)], last
