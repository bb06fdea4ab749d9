"""No false recoveries: a run repairs a host only once several probes spaced over the suite's bound found it lost
(connection refused, no route, or its machine gone at the provider); a host that is only slow is never replaced.

Each test runs the 'survivor' suite (repair: true) on a real local testbed, its supervisor in this process."""

from __future__ import annotations

import time

import pytest
from localbed import SURVIVOR, assert_succeeded, disturb_mid_run, lose_a_host_mid_run, sshd_refusing, starved, throttle

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
    from testbed.run import bookkeeping as rs

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
    assert_succeeded(status, evs)
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


def test_a_throttled_link_is_waited_for_and_the_run_completes(local_testbed) -> None:
    """node1's link is throttled to 1 kbit/s (a token bucket: what every kernel has, netem or not) for 45 s while its
    rank runs: polls and probes stall, time out or drop mid-handshake; none of that is a lost host. The run waits,
    records the spell, and completes with no repair and no relaunch."""
    import subprocess

    from testbed.run import bookkeeping as rs

    bed = local_testbed(hosts=2)
    boot = _boot_id(bed, "node1")
    at: list[float] = []

    def squeeze(victim: str) -> None:
        veth = bed.provider.slot(victim).veth
        throttle(veth)
        try:
            time.sleep(SLOW_SECONDS)
        finally:
            subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], capture_output=True, check=False)

    status, evs = disturb_mid_run(bed, bed.name, squeeze, suite=LONG, at=at)
    kinds = [e.kind for e in evs]
    print("events:", [(round(e.ts - at[0], 1), e.kind, e.host) for e in evs if e.ts >= at[0]])
    assert_succeeded(status, evs, ("failed", "ended", "host-lost"))
    assert not {"recovery", "repairing", "repaired", "host-lost", "relaunched", "failed"} & set(kinds), kinds
    assert _boot_id(bed, "node1") == boot
    assert {r.status for r in rs.ranks(bed.store, evs[0].run_id)} == {"succeeded"}
    spells = [e for e in evs if e.kind == "host-back"]
    assert spells and {e.host for e in spells} == {"node1"}
    assert not any(p["lost"] for e in spells for p in e.detail["probes"])


REFUSING_SECONDS = 13.0
"""How long the refusing host's sshd stays down: over four times the bound (3 s) that would judge a lost host."""


def test_a_host_whose_sshd_refuses_while_its_ranks_run_is_waited_for_never_rebuilt(local_testbed) -> None:
    """node1's sshd refuses connections for 13 s (listener and sessions killed) while its rank runs on and the
    provider says it is up. A refusal proves the machine is there: the run records the spell and waits; nothing is
    judged lost, nothing repaired, the same boot of node1, and every rank succeeds on its first attempt."""
    from testbed.run import bookkeeping as rs

    bed = local_testbed(hosts=2)
    boot = _boot_id(bed, "node1")
    at: list[float] = []

    def refuse(victim: str) -> None:
        with sshd_refusing(bed, victim):
            time.sleep(REFUSING_SECONDS)

    status, evs = disturb_mid_run(bed, bed.name, refuse, suite=LONG, at=at)
    kinds = [e.kind for e in evs]
    print("events:", [(round(e.ts - at[0], 1), e.kind, e.host) for e in evs if e.ts >= at[0]])
    assert_succeeded(status, evs, ("failed", "ended", "host-lost"))
    assert not {"recovery", "repairing", "repaired", "host-lost", "relaunched"} & set(kinds), kinds
    assert _boot_id(bed, "node1") == boot  # never rebuilt
    assert {r.status for r in rs.ranks(bed.store, evs[0].run_id)} == {"succeeded"}
    waited = [e for e in evs if e.kind == "host-slow"]
    assert waited and waited[0].host == "node1" and waited[0].detail["probe"]["ssh"] == "refused"
    assert "machine is there" in waited[0].detail["note"]
    back = [e for e in evs if e.kind == "host-back"]
    probes = [p for e in back for p in e.detail["probes"]]
    assert back and {e.host for e in back} == {"node1"} and not any(p["lost"] for p in probes)
    assert sum(p["ssh"] == "refused" for p in probes) >= 3 and {p.get("provider") for p in probes} == {"up"}


@pytest.mark.parametrize("how,result", [("kill", "refused"), ("netns", "no-route")])
def test_a_gone_host_is_judged_lost_on_the_providers_word_then_repaired(local_testbed, how: str,
                                                                        result: str) -> None:
    """node1 really gone (every process killed: its kernel refuses connections; or its namespace and link taken
    away: no route to it) is judged lost by 2 probes in a row, each lost and the provider saying its machine is
    down at both, without waiting for timeouts.unreachable (3 s: the bound a host the provider says nothing of, or
    says is up, waits for); the run records them, repairs node1 and completes."""
    bed = local_testbed(hosts=2)
    at: list[float] = []
    status, evs = lose_a_host_mid_run(bed, bed.name, how=how, at=at)
    times = _times(evs, at[0], "node1")
    print(f"{how}: seconds from the loss:", times)
    assert_succeeded(status, evs)
    lost = next(e for e in evs if e.kind == "host-lost")
    d = lost.detail
    print(f"{how}: judged lost:", d["summary"])
    assert lost.host == "node1" and d["bound"] == 3 and d["count"] == 3
    probes = d["probes"]
    assert len(probes) >= 2 and all(p["lost"] for p in probes)
    assert [p["provider"] for p in probes[-2:]] == ["down", "down"]
    assert all(p["ssh"] in ("refused", "no-route") for p in probes) and any(p["ssh"] == result for p in probes)
    kinds = [e.kind for e in evs]
    assert kinds.index("host-lost") < kinds.index("repairing") < kinds.index("resumed")
    repairing = next(e for e in evs if e.kind == "repairing").detail
    assert repairing["hosts"] == ["node1"] and "probes" in repairing["why"]["node1"]
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
