"""No false recoveries: a run repairs a host only once several probes spaced over the suite's bound found it lost
(connection refused, no route, or its machine gone at the provider); a host that is only slow is never replaced.

Each test runs the 'survivor' suite (repair: true) on a real local testbed, its supervisor in this process."""

from __future__ import annotations

import time

import pytest
from localbed import SURVIVOR, disturb_mid_run, lose_a_host_mid_run, starved

pytestmark = pytest.mark.local

SLOW_SECONDS = 45.0
"""How long the slowed host stays slow: nine probe timeouts (5 s), and longer than the old single 15 s probe."""
LONG = SURVIVOR.replace("-lt 12", "-lt 40")  # each rank counts to 40 (20 s unslowed): it runs through the slowdown


def _times(evs: list, at: float, host: str) -> dict[str, float | None]:  # type: ignore[type-arg]
    """Seconds from the loss to: the host's ranks failing, it being judged lost, its repair starting."""
    def first(kind: str, on: str | None = host) -> float | None:
        ts = next((e.ts for e in evs if e.kind == kind and (on is None or e.host == on)), None)
        return None if ts is None else round(ts - at, 2)

    return {"failed": first("failed"), "judged_lost": first("host-lost"), "repairing": first("repairing", None)}


def _boot_id(bed, host: str) -> str:  # type: ignore[no-untyped-def]
    return bed.ssh(host, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


def test_a_slow_starved_host_is_never_repaired_and_the_run_completes(local_testbed) -> None:
    """node1's link is slowed (netem: every packet 3 s late) and its processes get 1% of a CPU, for 45 s (nine
    times a probe's timeout): its probes time out, which is slow, not lost. The run waits it out: no recovery, no
    repair, the same boot of node1, every rank succeeds on its first attempt; the slow spell is recorded."""
    from testbed.run import state as rs

    bed = local_testbed(hosts=2)
    boot = _boot_id(bed, "node1")
    at: list[float] = []
    how: list[str] = []

    def slow(victim: str) -> None:
        with starved(bed, victim, delay_ms=3000, cpu_percent=1) as what:
            how.append(what)
            time.sleep(SLOW_SECONDS)

    status, evs = disturb_mid_run(bed, bed.name, slow, suite=LONG, at=at)
    kinds = [e.kind for e in evs]
    print("slowed by:", how, "events:", [(round(e.ts - at[0], 1), e.kind, e.host) for e in evs if e.ts >= at[0]])
    print("lost:", [e.detail.get("summary") for e in evs if e.kind == "host-lost"])
    assert status == "succeeded", [e.detail for e in evs if e.kind in ("failed", "ended")]
    assert not {"recovery", "repairing", "host-lost", "relaunched"} & set(kinds), kinds
    assert not any(e.kind == "repaired" for e in evs)
    assert _boot_id(bed, "node1") == boot  # never restarted
    assert {r.status for r in rs.ranks(bed.store, evs[0].run_id)} == {"succeeded"}
    slowed = [e for e in evs if e.kind == "host-slow"]
    assert slowed and {e.host for e in slowed} == {"node1"} and slowed[0].detail["probe"]["ssh"] == "slow"
    spells = [e for e in evs if e.kind == "host-back"]
    probes = [p for e in spells for p in e.detail["probes"]]
    for e in spells:
        print("spell:", e.detail["seconds"], "s:", e.detail["summary"])
    assert {e.host for e in spells} == {"node1"}
    assert sum(p["ssh"] == "slow" for p in probes) >= 3 and not any(p["lost"] for p in probes)
    assert all(p["seconds"] >= 4.5 for p in probes if p["ssh"] == "slow")  # each ran to its timeout: no refusal


@pytest.mark.parametrize("how,result", [("kill", "refused"), ("netns", "no-route")])
def test_a_gone_host_is_judged_lost_by_probes_over_the_bound_then_repaired(local_testbed, how: str,
                                                                          result: str) -> None:
    """node1 really gone (every process killed: its kernel refuses connections; or its namespace and link taken
    away: no route to it) is judged lost by 3 probes spaced over timeouts.unreachable (3 s), each lost, the provider
    saying its machine is down; the run records them, repairs node1 and completes."""
    bed = local_testbed(hosts=2)
    at: list[float] = []
    status, evs = lose_a_host_mid_run(bed, bed.name, how=how, at=at)
    times = _times(evs, at[0], "node1")
    print(f"{how}: seconds from the loss:", times)
    assert status == "succeeded", [e.detail for e in evs if e.kind in ("failed", "ended")]
    lost = next(e for e in evs if e.kind == "host-lost")
    d = lost.detail
    print(f"{how}: judged lost:", d["summary"])
    assert lost.host == "node1" and d["bound"] == 3 and d["count"] == 3
    probes = d["probes"]
    assert len(probes) >= 3 and all(p["lost"] for p in probes)
    assert probes[-1]["at"] - probes[0]["at"] >= 3.0
    assert all(p["ssh"] in ("refused", "no-route") for p in probes) and any(p["ssh"] == result for p in probes)
    assert probes[-1]["provider"] == "down"
    kinds = [e.kind for e in evs]
    assert kinds.index("host-lost") < kinds.index("repairing") < kinds.index("resumed")
    repairing = next(e for e in evs if e.kind == "repairing").detail
    assert repairing["hosts"] == ["node1"] and "3 probes" in repairing["why"]["node1"]
    assert [e.host for e in evs if e.kind == "repaired" and e.host] == ["node1"]
    assert times["judged_lost"] is not None and times["judged_lost"] < 15


def test_a_host_that_refuses_the_key_is_not_replaced_and_the_run_fails_naming_it(local_testbed) -> None:
    """node1 stops accepting the testbed key (its authorized keys removed, its SSH sessions dropped) while its rank
    runs: it answers, it is not lost. The run fails naming node1 and why, and nothing replaces it."""
    bed = local_testbed(hosts=2)
    boot = _boot_id(bed, "node1")

    def lock_out(victim: str) -> None:
        r = bed.provider.console(victim, "rm -f /etc/ssh/testbed_authorized_keys; "
                                         "pkill -9 -f '^sshd(-session)?: [a-z]+@'")  # the sessions, not the listener
        assert r.returncode in (0, 1), r.stderr

    status, evs = disturb_mid_run(bed, bed.name, lock_out, suite=LONG)
    kinds = [e.kind for e in evs]
    ended = next(e for e in evs if e.kind == "ended")
    print("ended:", ended.detail)
    assert status == "failed" and ended.host == "node1"
    assert ended.detail["reason"].startswith("node1 rank 1: host unreachable") and "refused the key" in \
        ended.detail["reason"]
    assert not {"recovery", "repairing", "repaired", "host-lost"} & set(kinds), kinds
    assert bed.provider.console("node1", "cat /proc/sys/kernel/random/boot_id").stdout.strip() == boot
