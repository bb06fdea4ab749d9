"""The run supervisor: a detached controller process per run (``python -m testbed.run.supervisor RUN``).

It uploads the run dir, runs sources and prepare steps, launches the ranks, then polls them: it fires faults,
fails fast (the other ranks are stopped after a grace period; the failure names the host and why), runs
recovery steps after a fault, runs post steps and checks, and records everything in state. The CLI only
follows state, so killing the CLI (or Ctrl-C) leaves the run going; ``status``/``logs`` restart a supervisor
that died (it resumes monitoring without relaunching).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from testbed import remote
from testbed.errors import TestbedError
from testbed.exitcodes import Exit
from testbed.providers import PROVIDERS, provider_class
from testbed.providers.base import Provider
from testbed.records import ACTIVE, FaultPlan, Rank, RelaunchStep, RepairStep, RunInfo, RunStep, recovery_steps
from testbed.resolved import Resolved
from testbed.run import bookkeeping as rs
from testbed.run import faults as faults_mod
from testbed.run import liveness
from testbed.run import ranks as run_remote
from testbed.run import recovery as rec
from testbed.state import Store
from testbed.textfmt import plural

log = logging.getLogger("testbed.supervisor")


def step_log_name(phase: str, step: str, host: str) -> str:
    """The file a step's output on ``host`` is kept in: one plain file name whatever the step is called (a name
    such as 'repair technique/replay/replay.py' names a path, not a folder to write into)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{phase}-{step}-{host}")[:200] + ".log"


class Abort(Exception):
    """The run ends now with ``reason``."""

    def __init__(self, reason: str, host: str | None = None, status: str = "failed"):
        super().__init__(reason)
        self.reason = reason
        self.host = host
        self.status = status


@dataclass
class Attempt:
    """Monitoring state of the ranks currently launched."""

    ranks: list[Rank]
    launched: float
    done: dict[int, tuple[str, int | None, str]] = field(default_factory=dict)  # rank -> (status, code, reason)
    vanished: dict[int, int] = field(default_factory=dict)
    unreachable_since: dict[str, float] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)  # hosts judged lost (liveness): their ranks failed with them
    first_failure: tuple[float, str, str] | None = None  # (time, reason, host)
    stop_sent: float | None = None
    killed: bool = False
    timed_out: bool = False  # the first failure was timeouts.run


class Supervisor:
    def __init__(self, run_id: str):
        self.run_id = run_id
        self.st = Store.open_default()
        self.plan = rs.load_plan(run_id)
        self.t = self.plan.timeouts
        run = rs.require(self.st, run_id)
        self.info = run.info
        self.fired: list[str] = list(self.info.fired)
        self.recovered: list[str] = list(self.info.recovered)
        self.attempt: int = self.info.attempt
        self.started: float = float(run.started or self.info.launched_at or time.time())
        self.repaired: list[str] = list(self.info.repaired)
        self.fired_at: dict[str, float] = {}
        self.samples: dict[int, list[tuple[float, int]]] = {}  # attempt -> (time, step): the goodput's reference
        self.sampled = 0.0
        self.stale: dict[int, int | None] = {}  # attempt -> the step its rank's log showed when it was first read
        self.recovered_any = False
        self.judge = liveness.Judge(self.t.unreachable, self.t.probes)
        self.prober = liveness.Prober(self.look, self.judge.spacing,  # bounded by the run's own limits
                                      until=time.time() + self.t.prepare + self.t.run + self.t.post + 3600)
        self.suspect: dict[str, str] = {}  # host -> its failed poll's error: probed in the background, not polled
        self.last_probe: dict[str, liveness.Probe] = {}
        self.repaired_at: dict[str, float] = {}  # a probe started before a host's repair ended tells nothing of it
        self.judged: dict[str, dict[str, Any]] = {}  # host -> why it was judged lost (until it is repaired)
        self._provider: Provider | None = None
        self._provider_lock = threading.Lock()
        self.polls = PollTimes()  # logged when the run ends

    # helpers -------------------------------------------------------------------------------------------
    def status(self) -> str:
        r = self.st.run(self.run_id)
        return r.status if r else "stopped"

    def save(self, launched_at: float | None = None, ranks: list[Rank] | None = None) -> None:
        info = RunInfo(fired=self.fired, recovered=self.recovered, attempt=self.attempt, repaired=self.repaired)
        if launched_at is not None:
            info.launched_at, info.ranks = launched_at, ranks
        self.st.update_run(self.run_id, info=info)

    def step(self, step: RunStep, phase: str, timeout: float) -> None:
        """Run one synchronous step; a failure on any host aborts the run naming that host."""
        if self.status() == "stopped":
            raise Abort("stopped")
        t0 = time.time()
        results = run_remote.run_step(self.plan, step, timeout)
        logs = rs.run_home(self.run_id)
        for r in results:
            (logs / step_log_name(phase, step.name, r.host)).write_text(r.stdout + r.stderr)
        bad = [r for r in results if not r.ok]
        rs.event(self.st, self.run_id, "step", None, ts=t0, phase=phase, step=step.name,
                 hosts=step.hosts, seconds=round(time.time() - t0, 2), ok=not bad)
        if bad:
            r = bad[0]
            why = r.error or rs.describe_exit(r.exit_code or 0)
            tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
            raise Abort(f"{phase} step '{step.name}' failed on {r.host}: {why}"
                        + (f" ({' | '.join(tail)})" if tail and not r.error else ""), r.host)

    # phases --------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        bad = [r for r in run_remote.upload(self.plan, self.plan.host_names) if not r.ok]
        if bad:
            r = bad[0]
            raise Abort(f"{r.host}: " + (f"host unreachable ({r.error})" if r.error else
                                         f"cannot create the run dir: {r.stderr.strip()[-200:]}"), r.host)
        for s in self.plan.sources:
            self.step(s, "sources", self.t.prepare)
        for s in self.plan.prepare:
            self.step(s, "prepare", self.t.prepare)

    def launch(self, ranks: list[Rank], attempt: int) -> Attempt:
        if self.status() == "stopped":
            raise Abort("stopped")
        now = time.time()
        bad = [r for r in run_remote.launch(self.plan, ranks, attempt,
                                            launchers=self.launchers({rk.host for rk in ranks})) if not r.ok]
        if bad:
            b = bad[0]
            raise Abort(f"{b.host}: cannot start ranks: {b.error or b.stderr.strip()[-200:]}", b.host)
        for rk in ranks:
            self.st.set_rank(self.run_id, rk.host, rk.rank, status="running", started=now, ended=None,
                             exit_code=None, reason=None)
        self.save(launched_at=now, ranks=ranks)
        return Attempt(ranks, now)

    def monitor(self, att: Attempt) -> None:
        """Poll until every rank ended; fire faults; fail fast; recover. Returns when the run succeeded."""
        t = self.t
        while True:
            if self.status() == "stopped":
                raise Abort("stopped")
            now = time.time()
            live = [r for r in att.ranks if r.rank not in att.done]
            want: dict[str, list[int]] = {}
            for r in live:
                want.setdefault(r.host, []).append(r.rank)
            patterns: dict[str, dict[str, tuple[int, str]]] = {}
            for f in self.plan.faults:
                if f.name not in self.fired and f.when is not None:
                    patterns.setdefault(f.watch_host, {})[f.name] = (f.watch_rank, f.when)
                    want.setdefault(f.watch_host, [])
            tails = self.pace_tail(att, want, now)
            for host in self.suspect:  # probed in the background until one answers: a hung poll holds nothing up
                want.pop(host, None)
                tails.pop(host, None)
            t_poll = time.monotonic()
            polls = run_remote.poll(self.plan, want, patterns, timeout=self.probe_timeout,
                                    tails=tails) if want else {}
            if want:
                self.polls.add(len(want), time.monotonic() - t_poll)
            for host, hp in polls.items():
                if hp.ok:
                    self.answers(host, self.judge.answered(host))
                else:
                    self.suspected(host, hp.error or "no answer")
            self.probe_suspects()
            matched = {name for hp in polls.values() for name in hp.triggers}
            for host, hp in polls.items():
                self.absorb(att, host, hp, now)
            for host in list(self.suspect):
                if host not in polls:
                    self.unanswered(att, host, now)
            for f in self.plan.faults:
                if f.name not in self.fired and faults_mod.due(f, att.launched, now, matched):
                    self.fire(f)
            self.fail_fast(att, time.time())
            if tails and att.first_failure is None:
                self.sample(polls, now)
            if len(att.done) == len(att.ranks):
                failed = [(k, v) for k, v in att.done.items() if v[0] == "failed"]
                # a timeout (or any failure) stops the ranks: they end "stopped", or even 0 if they handle TERM;
                # the attempt failed all the same
                if not failed and att.first_failure is None:
                    return
                first = att.first_failure
                assert first is not None
                if att.timed_out:  # no recovery after the time is up
                    raise Abort(first[1], None, "timed-out")
                pending = [f for f in self.plan.faults if f.name in self.fired and f.name not in self.recovered]
                if pending:
                    att = self.recover(pending[0], att)
                    continue
                if att.lost and recovery_steps(self.plan.recovery, self.attempt + 1):
                    att = self.recover(None, att)  # a host was lost with no fault fired: a real failure
                    continue
                raise Abort(first[1], first[2])
            if now - self.started > t.run and att.first_failure is None:
                att.timed_out = True
                self.failure(att, now, f"timed out after {t.run:g} s (timeouts.run)", None)
            if self.suspect:  # woken as soon as a probe lands
                self.prober.landed.wait(t.poll)
            else:
                time.sleep(t.poll)

    def pace_tail(self, att: Attempt, want: dict[str, list[int]], now: float) -> dict[str, tuple[int, int]]:
        """The checkpoint rank's log end to read in this poll (host -> (rank, bytes)) when a pace sample is due:
        at each poll of an attempt not yet failing whose checkpoint has a ``progress`` pattern."""
        ck = self.plan.checkpoint
        if att.first_failure or ck is None or not ck.progress or now - self.sampled < self.t.poll:
            return {}
        host = self.plan.rank(ck.rank).host
        want.setdefault(host, [])
        return {host: (ck.rank, rec.PACE_TAIL)}

    def sample(self, polls: dict[str, run_remote.HostPoll], now: float) -> None:
        """The step the checkpoint rank has reached, read from the log end its host's poll brought back (the pace
        without faults, for the goodput)."""
        ck = self.plan.checkpoint
        assert ck is not None
        hp = polls.get(self.plan.rank(ck.rank).host)
        if hp is None or hp.log_tail is None:
            return
        self.sampled = now
        step = rec.steps_in(self.plan, hp.log_tail).last
        seen = self.samples.setdefault(self.attempt, [])
        # the log is appended across attempts: until a relaunched attempt logs its own first step, the last step
        # read is the previous attempt's (a sample then would count this attempt's start-up as its pace)
        stale = self.stale.setdefault(self.attempt, step if self.attempt else None)
        if step is None or (not seen and step == stale):
            return
        if not seen or step > seen[-1][1]:
            seen.append((now, step))

    def absorb(self, att: Attempt, host: str, hp: run_remote.HostPoll, now: float) -> None:
        ranks_here = [r for r in att.ranks if r.host == host and r.rank not in att.done]
        if not hp.ok:
            self.unanswered(att, host, now)
            return
        att.unreachable_since.pop(host, None)
        if hp.no_run_dir:  # nothing there can tell how the ranks end: they failed, whatever they still do
            for r in ranks_here:
                self.end_rank(att, r, "failed", None, f"the run folder {self.plan.run_dir} vanished on {host}")
            return
        for r in ranks_here:
            st = hp.ranks.get(r.rank)
            if st is None:
                continue
            if st.exit_code is not None:
                status = "succeeded" if st.exit_code == 0 else "failed"
                if att.stop_sent is not None and status == "failed":
                    status = "stopped"
                reason = rs.describe_exit(st.exit_code)
                if status == "stopped" and att.first_failure:
                    reason = f"{reason}; stopped after {att.first_failure[1]}"
                self.end_rank(att, r, status, st.exit_code, reason, st.ended)
            elif st.started is None and st.alive is None and now - att.launched > 30:
                self.end_rank(att, r, "failed", None, "never started (no rank start file after 30 s)")
            elif st.alive is False:
                att.vanished[r.rank] = att.vanished.get(r.rank, 0) + 1
                if att.vanished[r.rank] >= 3:
                    self.end_rank(att, r, "failed", None, "process vanished without an exit code")
            else:
                att.vanished.pop(r.rank, None)

    # liveness -------------------------------------------------------------------------------------------
    @property
    def probe_timeout(self) -> float:
        """Seconds one poll or probe of a host may take; past it the host is slow, not lost."""
        return max(5.0, self.t.poll * 5)

    def provider(self) -> Provider:
        """The testbed's provider, opened once (the caller holds ``_provider_lock``)."""
        if self._provider is None:
            self._provider = Resolved.open(self.plan.testbed, Store(self.st.path), recorded_ok=True).provider()
        return self._provider

    def locked_provider(self) -> Provider:
        """:meth:`provider` for a fault that fires or is undone (the supervisor's one provider, under its lock)."""
        with self._provider_lock:
            return self.provider()

    def launchers(self, hosts: set[str]) -> dict[str, list[str]]:
        """host -> the command its ranks start under (:meth:`Provider.rank_launcher`), from the hosts as recorded
        now (a repaired host's new job); none asked of a provider that has no launcher."""
        if self.plan.provider not in PROVIDERS or \
                provider_class(self.plan.provider).rank_launcher is Provider.rank_launcher:
            return {}
        with self._provider_lock:
            p = self.provider()
            known = {h.name: h for h in self.st.hosts(self.plan.testbed)}
            return {h: p.rank_launcher(known[h]) for h in hosts if h in known}

    def states(self) -> dict[str, str] | None:
        """Each host's state as the testbed's provider reports it now (None: it cannot tell); one question at a
        time, on a state connection of its own (the probes' threads ask it)."""
        with self._provider_lock:
            states: dict[str, str] | None = self.provider().reported_states()
        return states

    def notes(self) -> dict[str, str]:
        """What the provider said of each host's machine when :meth:`states` last asked (a Slurm node's state)."""
        with self._provider_lock:
            return dict(self.provider().state_notes()) if self._provider is not None else {}

    def look(self, hosts: list[str]) -> dict[str, liveness.Probe]:
        """One probe of each of ``hosts`` (a fresh login; the provider asked about those that do not answer)."""
        return liveness.probe(self.plan.testbed, hosts, timeout=self.probe_timeout, run_dir=self.plan.run_dir,
                              states=self.states, notes=self.notes) if hosts else {}

    def suspected(self, host: str, error: str) -> None:
        """``host``'s poll failed: from now on it is probed in the background (each probe a fresh login) rather
        than polled, until a probe answers; its multiplexed connection is closed (it may hang on a dead host)."""
        if host not in self.suspect:
            threading.Thread(target=remote.close_connections, args=(self.plan.testbed, [host]), daemon=True).start()
        self.suspect[host] = error
        self.prober.watch(host)

    def probe_suspects(self) -> None:
        """Take in the probes that finished."""
        for p in self.prober.take():
            self.note(p)

    def unanswered(self, att: Attempt, host: str, now: float) -> None:
        """``host`` gave no answer to its poll: its ranks fail once it is judged lost (the provider says its machine
        is gone, or no route to it over the bound), or once its polls failed for ``timeouts.unreachable`` with
        probes that found it there but turning the testbed away (a refused key, a changed host key: waiting does not
        help). A host that is slow, refuses connections or drops its handshakes is waited for: its ranks run on."""
        ranks_here = [r for r in att.ranks if r.host == host and r.rank not in att.done]
        since = att.unreachable_since.setdefault(host, now)
        if host in self.judged:
            att.lost.add(host)
            for r in ranks_here:
                self.end_rank(att, r, "failed", None, f"host unreachable: judged lost ({self.judged[host]['summary']})")
            return
        lp = self.last_probe.get(host)
        if lp is not None and lp.ssh == "answered" and lp.at >= since:
            # it answered a probe since this spell began: that spell ended, and a failed poll now starts another
            since = att.unreachable_since[host] = now
        if lp is None or lp.at < since or lp.waits:
            return  # no probe of this spell back yet; slow, refusing or lost-not-yet-judged: waited for
        if now - since >= self.t.unreachable:
            why = lp.detail or self.suspect.get(host) or lp.ssh
            for r in ranks_here:
                self.end_rank(att, r, "failed", None, f"host unreachable ({why})")

    def note(self, p: liveness.Probe) -> None:
        """Record probe ``p``: the end of a spell without an answer (the host polled again), the start of a slow
        spell, or a host judged lost."""
        if p.at < self.repaired_at.get(p.host, 0.0):
            return
        first_slow = p.ssh in ("slow", "refused") and not p.lost and \
            not any(q.ssh == p.ssh for q in self.judge.spell(p.host))
        self.last_probe[p.host] = p
        self.answers(p.host, self.judge.add(p))
        if p.ssh == "answered":
            self.suspect.pop(p.host, None)
            self.prober.unwatch(p.host)
        if first_slow:
            rs.event(self.st, self.run_id, "host-slow", p.host, probe=p.to_json(),
                     note="a slow answer is not a lost host: the run waits" if p.ssh == "slow" else
                     "a refused connection proves the machine is there: the run waits")
        if self.judge.lost(p.host) and p.host not in self.judged:
            self.judged[p.host] = self.judge.evidence(p.host)
            rs.event(self.st, self.run_id, "host-lost", p.host, **self.judged[p.host])
            log.info("%s judged lost: %s", p.host, self.judged[p.host]["summary"])

    def answers(self, host: str, spell: list[liveness.Probe]) -> None:
        """``host`` answered again after ``spell`` (the probes that found no answer): recorded when there were any."""
        if spell:
            rs.event(self.st, self.run_id, "host-back", host, seconds=round(time.time() - spell[0].at, 2),
                     probes=[p.to_json() for p in spell[-liveness.KEEP:]], summary=liveness.summary(spell))

    def end_rank(self, att: Attempt, r: Rank, status: str, code: int | None, reason: str,
                 ended: float | None = None) -> None:
        att.done[r.rank] = (status, code, reason)
        now = time.time()
        self.st.set_rank(self.run_id, r.host, r.rank, status=status, exit_code=code, reason=reason,
                         ended=ended or now)
        if status == "failed":
            self.failure(att, now, f"{r.host} rank {r.rank}: {reason}", r.host, r.rank)

    def failure(self, att: Attempt, now: float, reason: str, host: str | None, rank: int | None = None) -> None:
        rs.event(self.st, self.run_id, "failed", host, rank=rank, reason=reason, attempt=self.attempt)
        if att.first_failure is None:
            att.first_failure = (now, reason, host or "")
            log.info("failure: %s", reason)

    def fail_fast(self, att: Attempt, now: float) -> None:
        """After the first failure and the grace period, stop the ranks still running (TERM, then KILL)."""
        if att.first_failure is None or len(att.done) == len(att.ranks):
            return
        live = [r for r in att.ranks if r.rank not in att.done]
        if att.stop_sent is None and now - att.first_failure[0] >= self.t.grace:
            reachable = [r for r in live if r.host not in att.unreachable_since]
            run_remote.signal_ranks(self.plan, reachable, "TERM")
            att.stop_sent = now
            rs.event(self.st, self.run_id, "stopping", None, ranks=[r.rank for r in live],
                     reason=f"after {att.first_failure[1]}")
        elif att.stop_sent is not None and not att.killed and now - att.stop_sent >= 5:
            run_remote.signal_ranks(self.plan, live, "KILL")
            att.killed = True
        elif att.killed and now - att.stop_sent >= 5 + self.t.unreachable + 5:  # type: ignore[operator]
            for r in live:
                self.end_rank(att, r, "stopped", None, f"no answer after being stopped ({att.first_failure[1]})")

    def fire(self, f: FaultPlan) -> None:
        ts = time.time()
        try:
            detail = faults_mod.fire(self.plan, f, self.locked_provider)
        except Exception as e:  # a fault that cannot fire is recorded, not fatal
            detail = {"fault": f.name, "action": f.action, "ok": False, "error": getattr(e, "what", None) or str(e)}
        self.fired.append(f.name)
        self.fired_at[f.name] = ts
        self.save()
        rs.event(self.st, self.run_id, "fault", f.host, ts=ts, info=detail)
        log.info("fault fired: %s", detail)

    def recover(self, f: FaultPlan | None, att: Attempt) -> Attempt:
        """Run recovery number attempt+1 after ``f`` (None: a host lost with no fault fired): restore what the
        fault undoes, then its steps in order (repair lost hosts, commands, relaunch from the checkpoint)."""
        assert att.first_failure is not None
        self.attempt += 1
        if f is not None:
            self.recovered.append(f.name)
        self.save()
        ts = time.time()
        steps = f.recovery_steps(self.attempt) if f is not None else recovery_steps(self.plan.recovery, self.attempt)
        rs.event(self.st, self.run_id, "recovery", None, ts=ts, fault=f.name if f else None, attempt=self.attempt,
                 steps=[s.name for s in steps], after=att.first_failure[1])
        restored = None
        if f is not None:
            restored = faults_mod.restore(self.plan, f, self.locked_provider)
            if restored:
                rs.event(self.st, self.run_id, "restore", f.host, info=restored)
        before = rec.log_steps(self.plan)  # read before anything is relaunched (the log is appended)
        fault_at = self.fired_at.get(f.name) if f is not None else None
        times: dict[str, Any] = {"attempt": self.attempt, "fault": f.name if f else None,
                                 "failed_at": att.first_failure[0], "recovery_at": ts,
                                 "detect_seconds": round(att.first_failure[0] - fault_at, 2) if fault_at else None,
                                 "drain_seconds": round(ts - att.first_failure[0], 2)}
        self.recovered_any = True
        replaced: list[str] = []
        new: Attempt | None = None
        for i in range(len(steps)):
            s = (f.recovery_steps(self.attempt) if f is not None
                 else recovery_steps(self.plan.recovery, self.attempt))[i]  # the plan may be new after a repair
            if isinstance(s, RelaunchStep):
                resume = rec.resume_point(self.plan, before, replaced)
                t0 = time.time()
                new = self.launch(s.ranks, self.attempt)
                rs.event(self.st, self.run_id, "relaunched", None, attempt=self.attempt,
                         ranks=[r.rank for r in s.ranks])
                times["relaunch_seconds"] = round(time.time() - t0, 2) + times.pop("readmit_seconds", 0.0)
                rs.event(self.st, self.run_id, "resumed", None, **times, **resume,
                         downtime_seconds=round(time.time() - (fault_at or att.first_failure[0]), 2))
            elif isinstance(s, RepairStep):
                replaced += self.repair(s, times, restored=bool(restored))
            else:
                self.step(s, "recovery", self.t.prepare)
        if new is None:
            raise Abort(att.first_failure[1] + " (recovery did not relaunch)", att.first_failure[2])
        return new

    def confirm_lost(self, fresh_only: bool) -> tuple[list[str], dict[str, liveness.Probe]]:
        """The run's hosts judged lost right before a repair, and each host's last probe. A host judged lost whose
        last probe (lost) ended within ``spacing`` seconds stays judged so (the probes go on while the run drains);
        every other host is probed again, and again every ``spacing`` while it is lost but not yet judged so
        (``fresh_only``: every host, e.g. after a fault was undone)."""
        for p in self.prober.take():
            self.note(p)
        last = {} if fresh_only else self.fresh_losses()
        if len(last) < len(self.judged):  # a host judged lost without a recent probe: the probes running land first
            self.prober.wait(self.probe_timeout + 2)
            for p in self.prober.take():
                self.note(p)
            last = {} if fresh_only else self.fresh_losses()
        others = [h for h in self.plan.host_names if h not in last]
        _, found = liveness.confirm(self.judge, others, self.look, self.note)
        last.update(found)
        return [h for h in self.plan.host_names if h in last and self.judge.lost(h)], last

    def fresh_losses(self) -> dict[str, liveness.Probe]:
        """The hosts judged lost whose last probe (lost) ended within ``spacing`` seconds: that probe."""
        now = time.time()
        out = {}
        for host in self.judged:
            p = self.judge.last(host)
            if p is not None and self.judge.lost(host) and now - p.at - p.seconds <= self.judge.spacing:
                out[host] = p
        return out

    def repair(self, s: RepairStep, times: dict[str, Any], restored: bool = False) -> list[str]:
        """Repair every host of the run judged lost (several probes over the bound, see testbed.run.liveness),
        set it up again, upload the run to it; the hosts testbed made anew. Aborts naming the host when one cannot
        be repaired or the run's limit is reached. ``restored``: a fault was undone (every host probed afresh)."""
        t0 = time.time()
        lost, last = self.confirm_lost(fresh_only=restored)
        for host in lost:
            if host not in self.judged:  # judged here, not while polling (a fault's recovery)
                self.judged[host] = self.judge.evidence(host)
                rs.event(self.st, self.run_id, "host-lost", host, **self.judged[host])
        if not lost:
            silent = {h: p for h, p in last.items() if p.ssh != "answered"}
            note = ("every host answers" if not silent else "no host judged lost: " + "; ".join(
                f"{h}: {liveness.summary([p])}" for h, p in silent.items()))
            rs.event(self.st, self.run_id, "repaired", None, hosts=[], note=note,
                     probes={h: p.to_json() for h, p in silent.items()})
            return []
        if len(self.repaired) + len(lost) > s.attempts:
            raise Abort(f"{', '.join(lost)} lost; the run may repair {plural(s.attempts, 'host')} (step '{s.name}': "
                        f"attempts) and has repaired {len(self.repaired)}", lost[0])
        times.update(repair_seconds=0.0, setup_seconds=0.0)
        rs.event(self.st, self.run_id, "repairing", None, hosts=lost, setup=s.setup,
                 why={h: self.judged[h]["summary"] for h in lost})
        replaced: list[str] = []
        for host in lost:
            try:
                done = rec.repair(self.plan, self.st, host, setup=s.setup, timeout=s.timeout or self.t.prepare,
                                  progress=lambda m: log.info("repair: %s", m))
            except TestbedError as e:
                raise Abort(f"{host} was lost and could not be repaired: {e.what}"
                            + (f" ({e.fix})" if e.fix else ""), host) from None
            self.repaired.append(host)
            evidence = self.judged.pop(host, None)
            self.judge.answered(host)
            self.suspect.pop(host, None)
            self.prober.unwatch(host)
            self.last_probe.pop(host, None)
            self.repaired_at[host] = time.time()
            self.save()
            replaced += done.replaced
            times["repair_seconds"] += done.repair_seconds
            times["setup_seconds"] += done.setup_seconds
            rs.event(self.st, self.run_id, "repaired", host, evidence=evidence,
                     **{k: v for k, v in done.to_json().items() if k != "host"})
        times["hosts_repaired"] = lost
        if rec.moved(self.plan, self.st):  # a replaced server's new private address: render the run again
            self.plan = rec.replan(self.plan, self.st)
            rs.save_plan(self.plan)
            rs.event(self.st, self.run_id, "replanned", None, hosts={h.name: h.address for h in self.plan.hosts})
        t1 = time.time()
        bad = [r for r in run_remote.upload(self.plan, lost) if not r.ok]
        if bad:
            raise Abort(f"{bad[0].host}: repaired, but the run cannot be uploaded to it: "
                        f"{bad[0].error or bad[0].stderr.strip()[-200:]}", bad[0].host)
        for step in rec.readmit_steps(self.plan, lost):
            self.step(step, "repair", self.t.prepare)
        times["readmit_seconds"] = round(time.time() - t1, 2)
        log.info("repaired %s in %.1f s", ", ".join(lost), time.time() - t0)
        return replaced

    def post(self) -> None:
        for s in self.plan.post:
            self.step(s, "post", self.t.post)
        for c in self.plan.checks:
            cmd = f"ls {c.file} >/dev/null 2>&1 || {{ echo 'no file {c.file}' >&2; exit 1; }}"
            if c.contains:
                import shlex

                cmd += f"; grep -E -q -e {shlex.quote(c.contains)} {c.file} || " \
                       f"{{ echo 'no line matches' >&2; exit 1; }}"
            self.step(RunStep(name=f"check {c.name}", hosts=c.hosts, commands={h: cmd for h in c.hosts}), "check", 120)

    # main ------------------------------------------------------------------------------------------------
    def run(self) -> str:
        t0 = time.time()
        try:
            if self.info.launched_at:
                att = Attempt(self.info.ranks or self.plan.ranks, self.info.launched_at)
                rs.event(self.st, self.run_id, "reattached", None, attempt=self.attempt)
            else:
                self.prepare()
                att = self.launch(self.plan.ranks, 0)
                self.started = att.launched
                self.st.update_run(self.run_id, status="running", started=att.launched, only_active=True)
                rs.event(self.st, self.run_id, "started", None, ts=att.launched, ranks=len(att.ranks),
                         hosts=sorted({r.host for r in att.ranks}), prepare_seconds=round(att.launched - t0, 2))
            self.monitor(att)
            self.post()
            if self.recovered_any and self.plan.checkpoint is not None:
                steps = rec.log_steps(self.plan).last
                rs.event(self.st, self.run_id, "goodput", None,
                         **rec.goodput(steps, self.started, time.time(), self.samples))
            return self.finish("succeeded", None)
        except Abort as e:
            if e.reason == "stopped":
                self.prober.stop()
                return "stopped"
            return self.finish(e.status, e.reason, e.host)
        except Exception as e:
            log.error("internal error: %s", traceback.format_exc())
            return self.finish("failed", f"internal error in the supervisor: {type(e).__name__}: {e}")

    def missed(self) -> None:
        """Record every chosen fault that never fired (its log line never appeared, or the run ended first)."""
        for f in self.plan.faults:
            if f.name in self.fired:
                continue
            if f.when is not None:
                why = (f"rank {f.watch_rank} on {f.watch_host} never logged a line matching /{f.when}/ "
                       f"(rank{f.watch_rank}.out and .err)")
            else:
                why = f"the run ended before {float(f.at or 0):g} s after launch"
            rs.event(self.st, self.run_id, "fault-missed", f.host, fault=f.name, reason=why)
            log.info("fault never fired: %s: %s", f.name, why)

    def finish(self, status: str, reason: str | None, host: str | None = None) -> str:
        self.prober.stop()
        self.prober.wait(self.probe_timeout + 2)  # no probe outlives the run
        now = time.time()
        if self.polls.count:
            log.info("%s", self.polls.summary(self.t.poll))
        row = self.st.run(self.run_id)
        if row is not None and row.status in ACTIVE:
            self.missed()
        if self.st.update_run(self.run_id, status=status, reason=reason, ended=now, only_active=True):
            self.st.end_active_ranks(self.run_id, "stopped", now, "run ended", keep_reason=True)
            rs.event(self.st, self.run_id, "ended", host, ts=now, status=status, reason=reason)
        return status


class PollTimes:
    """How long a run's polls took, in bounded memory (a run may poll every second for weeks): the count, the
    slowest, how many outran the pause between polls, and the last 10,000 durations of the polls that reached the
    most hosts (the last polls of a run reach only the ranks left)."""

    KEEP = 10_000

    def __init__(self) -> None:
        self.count = self.most = 0
        self.slowest = 0.0
        self.full: deque[float] = deque(maxlen=self.KEEP)
        self.durations: deque[float] = deque(maxlen=self.KEEP)  # every poll's, to count those over the pause

    def add(self, hosts: int, seconds: float) -> None:
        self.count += 1
        self.slowest = max(self.slowest, seconds)
        self.durations.append(seconds)
        if hosts > self.most:
            self.most = hosts
            self.full.clear()
        if hosts == self.most:
            self.full.append(seconds)

    def summary(self, interval: float) -> str:
        """One line against the pause between polls (``timeouts.poll``): a poll longer than that pause is what slows
        the detection of an ended rank."""
        full = sorted(self.full)
        over = sum(t > interval for t in self.durations)
        of = f"{self.count:,}" if self.count <= self.KEEP else f"the last {self.KEEP:,}"
        return (f"polls: {plural(self.count, 'poll')} of up to {plural(self.most, 'host')}: median "
                f"{full[len(full) // 2]:.3f} s over the {plural(len(full), 'poll')} of {self.most:,}, slowest "
                f"{self.slowest:.3f} s; {over:,} of {of} longer than the {interval:g} s between polls (timeouts.poll)")


def main(argv: list[str]) -> int:
    run_id = argv[0]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        handlers=[logging.FileHandler(rs.run_home(run_id) / "supervisor.log")])
    status = Supervisor(run_id).run()
    log.info("run %s ended: %s", run_id, status)
    return Exit.OK  # the run's outcome is in state, not in this detached process's status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
