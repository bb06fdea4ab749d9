"""Recovering a run from a lost host (judged lost by testbed.run.liveness): its repair and set-up, the run uploaded
to it again, where the checkpoint is and how many steps a restart redoes, and the run's goodput.

The supervisor calls these between the end of a failed attempt and the relaunch; they return data, which it
records as events (``repaired``, ``resumed``, ``goodput``) for ``status``, the manifest and the report.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from testbed import remote, rx
from testbed.errors import TestbedError
from testbed.records import RunEvent, RunPlan, RunStep
from testbed.resolved import Resolved
from testbed.run import ranks as run_remote
from testbed.run.runner import plan_run
from testbed.setup.repair import repair as repair_host
from testbed.suite import path_word
from testbed.textfmt import plural

if TYPE_CHECKING:
    from collections.abc import Callable

    from testbed.setup.repair import Repair
    from testbed.state import Store

LOG_TAIL = 1 << 20
"""Bytes of a rank's log read for its step lines (the end of a long log is what tells the last steps)."""
PACE_TAIL = 64 << 10
"""Bytes of the checkpoint rank's log read at each poll for the last step reached (the pace, for the goodput)."""


def repair(plan: RunPlan, store: Store, host: str, *, setup: bool, timeout: float,
           progress: Callable[[str], None] | None = None) -> Repair:
    """Repair ``host`` and set it up again as the testbed was last set up, within ``timeout`` seconds (the
    provider's own waits are bounded too; past the deadline the run stops waiting and fails, naming the host)."""
    tb = Resolved.open(plan.testbed, store, recorded_ok=True)
    out: list[Any] = []

    def work() -> None:
        try:
            out.append(repair_host(tb, host, setup=setup, progress=progress))
        except BaseException as e:  # handed to the caller's thread
            out.append(e)

    t = threading.Thread(target=work, daemon=True, name=f"repair-{host}")
    t.start()
    t.join(timeout)
    if not out:
        raise TestbedError(f"the repair of {host} did not finish within {timeout:g} s", where=f"testbed {plan.testbed}",
                           fix=f"raise the repair step's timeout, or repair it by hand: testbed provision "
                               f"{plan.testbed} --repair {host}")
    if isinstance(out[0], BaseException):
        raise out[0]
    done: Repair = out[0]
    return done


def moved(plan: RunPlan, store: Store) -> bool:
    """Whether a host of the run is now at another address than the plan's (a replaced server's private IP)."""
    now = {h.name: h.mesh_address for h in store.hosts(plan.testbed)}
    return any(now.get(h.name, h.address) != h.address for h in plan.hosts)


def replan(plan: RunPlan, store: Store) -> RunPlan:
    """The same run rendered again on the hosts as they are now (addresses changed by a repair)."""
    return plan_run(plan.suite, plan.testbed, plan.params, faults=[f.name for f in plan.faults],
                    only_hosts=plan.host_names, run_id=plan.run_id, overrides=plan.source_overrides, store=store)


def readmit_steps(plan: RunPlan, hosts: list[str]) -> list[RunStep]:
    """The sources and prepare steps again, on ``hosts`` only (a repaired host may have a new, empty disk)."""
    out = []
    for s in [*plan.sources, *plan.prepare]:
        on = [h for h in s.hosts if h in hosts]
        if on:
            envs = {h: s.environments[h] for h in on} if s.environments is not None else None
            out.append(s.model_copy(update={"hosts": on, "commands": {h: s.commands[h] for h in on},
                                            "environments": envs}))
    return out


@dataclass
class Steps:
    """What the checkpoint rank's log tells: the last step reached and the step of the last checkpoint."""

    last: int | None = None
    saved: int | None = None


def log_steps(plan: RunPlan) -> Steps:
    """The last ``progress`` and ``saved`` steps in the checkpoint rank's log (None where it cannot be read)."""
    ck = plan.checkpoint
    if ck is None or not (ck.progress or ck.saved):
        return Steps()
    r = plan.rank(ck.rank)
    cmd = remote.sh(f"{run_remote.cd_run(plan.run_dir)} && tail -c {LOG_TAIL} rank{ck.rank}.out")
    res = remote.run(plan.testbed, [r.host], cmd, timeout=30)[0]
    if not res.ok:
        return Steps()
    return steps_in(plan, res.stdout)


def steps_in(plan: RunPlan, text: str) -> Steps:
    """The last ``progress`` and ``saved`` steps in ``text`` (the end of the checkpoint rank's log)."""
    ck = plan.checkpoint
    if ck is None:
        return Steps()
    return Steps(_last(ck.progress, text), _last(ck.saved, text))


def _last(pattern: str | None, text: str) -> int | None:
    if not pattern:
        return None
    found = None
    for m in rx.compile(pattern).finditer(text):
        try:
            found = int(m.group(1))
        except (IndexError, ValueError, TypeError):
            continue
    return found


def checkpoint_file(plan: RunPlan) -> dict[str, Any] | None:
    """The checkpoint as it is now: the first of its hosts that holds it, its size and time; None when none does."""
    ck = plan.checkpoint
    if ck is None:
        return None
    path = ck.file if ck.file.startswith(("/", "~/")) else f"{plan.run_dir}/{ck.file}"
    res = remote.run(plan.testbed, ck.hosts, remote.sh(f"stat -L -c '%s %Y' -- {path_word(path)}"), timeout=30)
    for r in res:
        parts = r.stdout.split()
        if r.ok and len(parts) == 2 and all(p.isdigit() for p in parts):
            return {"host": r.host, "file": ck.file, "bytes": int(parts[0]), "mtime": int(parts[1])}
    return None


def resume_point(plan: RunPlan, before: Steps, replaced: list[str]) -> dict[str, Any]:
    """Where the relaunch resumes: the checkpoint found (or why none), its step, and the steps redone."""
    ck = plan.checkpoint
    if ck is None:
        return {}
    found = checkpoint_file(plan)
    lost = sorted(set(ck.hosts) & set(replaced))
    out: dict[str, Any] = {"checkpoint": found, "last_step": before.last}
    if found is None:
        out["why"] = (f"the checkpoint lived on {', '.join(lost)}, replaced with a new disk" if lost
                      else f"no {ck.file} on {', '.join(ck.hosts)} yet")
    step = (before.saved or 0) if found is not None else 0
    out["resumed_step"] = step
    if before.last is not None:
        out["steps_lost"] = max(0, before.last - step)
    return out


def goodput(steps: int | None, launched: float, ended: float,
            samples: dict[int, list[tuple[float, int]]]) -> dict[str, Any]:
    """Useful steps per wall-clock second, against a fault-free run estimated from the run itself: the first
    attempt's start-up (launch to step 0) plus every step at the pace kept between faults (``samples``: per attempt,
    (time, step) seen while it ran well; the attempt that covered most steps gives the pace). ``ratio`` is the
    fault-free time over the real one (1.0: the faults cost nothing)."""
    out: dict[str, Any] = {"steps": steps, "seconds": round(ended - launched, 2)}
    if steps is None or ended <= launched:
        return out
    out["steps_per_second"] = round(steps / (ended - launched), 3)
    spans = [(v[-1][1] - v[0][1], v) for v in samples.values() if len(v) > 1 and v[-1][0] > v[0][0]]
    first = samples.get(0) or []
    if spans and first:
        _, best = max(spans, key=lambda x: x[0])
        rate = (best[-1][1] - best[0][1]) / (best[-1][0] - best[0][0])
        t0, s0 = first[0]
        startup = max(0.0, t0 - launched - s0 / rate)
        fault_free = startup + steps / rate
        out.update(fault_free_seconds=round(fault_free, 2), fault_free_steps_per_second=round(steps / fault_free, 3),
                   ratio=round(fault_free / (ended - launched), 3))
    return out


def outage_lines(events: list[RunEvent]) -> list[str]:
    """Two lines on a run's recovery, from its recorded events (none when it recovered from no lost host): the
    lost host's downtime and its parts (the repair from an image, and what its set-up ran), then the goodput
    against a fault-free run, estimated from the run itself (:func:`goodput`)."""
    res = next((e.detail for e in events if e.kind == "resumed" and e.detail.get("hosts_repaired")), None)
    if res is None:
        return []
    rep = next((e.detail for e in events if e.kind == "repaired" and e.host), {})
    how = f" from image {rep['image']}" if rep.get("image") else " (no image of its set-up: a whole set-up)"
    roles = rep.get("setup_roles")
    ran = ("" if roles is None else f": {', '.join(roles)} only" if roles else ": nothing to run, recorded")
    parts = [f"detected {res.get('detect_seconds')} s", f"drained {res.get('drain_seconds')} s",
             f"repaired {res.get('repair_seconds')} s{how}",
             f"set-up {res.get('setup_seconds')} s{ran}", f"relaunch {res.get('relaunch_seconds')} s"]
    out = [f"downtime of {', '.join(res['hosts_repaired'])}: {res.get('downtime_seconds')} s "
           f"({'; '.join(parts)})"]
    good = next((e.detail for e in events if e.kind == "goodput"), {})
    if good.get("ratio"):
        steps = plural(int(good.get("steps") or 0), "step")
        out.append(f"goodput: {good['ratio']:.0%} of a fault-free run ({steps} in {good.get('seconds')} s; "
                   f"fault-free {good.get('fault_free_seconds')} s, estimated from this run: its start-up and its "
                   "pace between faults)")
    return out
