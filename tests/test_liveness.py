"""Judging a host lost (testbed.run.liveness): what one probe finds, several probes spaced over a bound, and a slow
answer never counted as a loss. Real ssh against loopback sockets for what a probe reads; the local tests
(tests/test_false_recovery.py) run it on real hosts."""

from __future__ import annotations

import contextlib
import itertools
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import remote, scripts
from testbed.run import liveness
from testbed.run.liveness import Judge, Probe


def _ssh(port: int, timeout: float) -> remote.HostResult:
    """A real ssh login attempt to 127.0.0.1:``port`` through the transport (no config, no key, no prompt)."""
    argv = ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", f"ConnectTimeout={int(timeout)}", "-p", str(port),
            "127.0.0.1", "true"]
    return remote.call(argv, host="h", timeout=timeout)


@contextlib.contextmanager
def _silent_listener() -> Iterator[int]:
    """A port that accepts connections and never says a word (a host too busy to answer): its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(srv.accept()[0])

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join(2)
        for c in held:
            c.close()
        srv.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_a_refused_connection_is_not_lost_and_a_silent_host_is_slow() -> None:
    """Real ssh: a port nobody listens on refuses, which proves a machine answers for the address (never lost by
    itself, only with the provider saying it is gone); a host that accepts and never answers makes the probe time
    out, which is slow, never lost, whatever the wait."""
    kind, detail = liveness.classify(_ssh(_closed_port(), 5))
    assert kind == "refused" and "Connection refused" in detail
    assert not Probe("h", 0, 0.01, kind, detail).lost and not Probe("h", 0, 0.01, kind, detail, provider="up").lost
    assert Probe("h", 0, 0.01, kind, detail, provider="down").lost
    with _silent_listener() as port:
        t0 = time.monotonic()
        res = _ssh(port, 2)
        assert time.monotonic() - t0 >= 1.5
    kind, detail = liveness.classify(res)
    assert kind == "slow", (res, detail)
    assert not Probe("h", 0, 2, kind, detail).lost


@pytest.mark.parametrize("res,kind", [
    (remote.HostResult("h", 0, "boot x\n", ""), "answered"),
    (remote.HostResult("h", 1, "", "sh: oops"), "answered"),  # the host ran it: it is there
    (remote.HostResult("h", None, "", "", error="timed out after 5 s"), "slow"),
    (remote.HostResult("h", 255, "", "ssh: connect to host 10.0.0.3 port 22: No route to host\r\n"), "no-route"),
    (remote.HostResult("h", 255, "", "ssh: connect to host 10.0.0.3 port 22: Network is unreachable"), "no-route"),
    (remote.HostResult("h", 255, "", "ssh: connect to host 10.0.0.3 port 22: Connection timed out"), "slow"),
    (remote.HostResult("h", 255, "", "Connection timed out during banner exchange"), "slow"),
    (remote.HostResult("h", 255, "", "channel 0: open failed: connect failed: Connection refused\n"
                                     "stdio forwarding failed"), "refused"),  # through a jump host
    (remote.HostResult("h", 255, "", "root@10.0.0.3: Permission denied (publickey)."), "rejected"),
    (remote.HostResult("h", 255, "", "Host key verification failed."), "rejected"),
    # a handshake that failed without a reason: a throttled link or an overloaded sshd, unknown (waited for)
    (remote.HostResult("h", 255, "", "kex_exchange_identification: read: Connection reset by peer"), "slow"),
    (remote.HostResult("h", 255, "", ""), "slow"),  # a master connection that died under the client: nothing said
    (remote.HostResult("h", 255, "", "Connection closed by 10.0.0.3 port 22"), "slow"),
    (remote.HostResult("h", 255, "", "ssh_dispatch_run_fatal: Connection to 10.0.0.3 port 22: Broken pipe"), "slow"),
    (remote.HostResult("h", None, "", "", error="cannot start ssh: No such file or directory"), "other"),
])
def test_what_one_probe_found(res: remote.HostResult, kind: str) -> None:
    assert liveness.classify(res)[0] == kind


def test_a_jump_that_cannot_reach_the_host_is_named() -> None:
    """Through a jump host whose master connection holds the reason, ssh says only that the connection closed
    before the greeting: the probe's detail says what that means (unknown, never lost by itself)."""
    for text in ("kex_exchange_identification: Connection closed by remote host\r\n"
                 "Connection closed by UNKNOWN port 65535", "stdio forwarding failed"):
        kind, detail = liveness.classify(remote.HostResult("h", 255, "", text))
        assert kind == "slow" and "no SSH greeting: a jump host could not reach it" in detail, detail
        assert not Probe("h", 0, 0.1, kind, detail).lost and Probe("h", 0, 0.1, kind, detail).waits


@pytest.mark.parametrize("ssh,provider,lost", [
    ("no-route", None, True), ("no-route", "down", True), ("refused", "down", True), ("refused", "deleted", True),
    # a refusal proves the machine is there: never lost unless the provider says it is gone
    ("refused", None, False), ("refused", "up", False),
    ("no-route", "up", False),  # the provider says it runs: a link dropping its neighbour lookups, not a lost host
    ("slow", None, False), ("slow", "up", False),
    ("slow", "down", True), ("slow", "error", True), ("slow", "gone", True), ("other", "preempted", True),
    ("slow", "shutoff", False), ("answered", "down", False), ("other", None, False), ("rejected", None, False),
])
def test_a_probe_is_lost_only_when_gone_at_the_provider_or_unroutable(ssh: str, provider: str | None,
                                                                      lost: bool) -> None:
    assert Probe("h", 0.0, 0.1, ssh, provider=provider).lost is lost


@pytest.mark.parametrize("ssh,waits", [("slow", True), ("refused", True), ("no-route", True), ("rejected", False),
                                       ("other", False)])
def test_the_run_waits_for_a_slow_refusing_or_unroutable_host_not_for_one_that_turns_it_away(ssh: str,
                                                                                             waits: bool) -> None:
    assert Probe("h", 0.0, 0.1, ssh, provider="up").waits is waits


def _p(at: float, ssh: str = "no-route", host: str = "h", provider: str | None = None) -> Probe:
    return Probe(host, at, 0.05, ssh, provider=provider)


def test_a_host_is_judged_lost_by_count_probes_in_a_row_spanning_the_bound() -> None:
    j = Judge(bound=3, count=3)
    assert j.spacing == 1.5
    for at in (0.0, 1.0, 2.0):  # three lost probes, but only 2 s apart
        j.add(_p(at))
    assert not j.lost("h")
    j.add(_p(3.0))
    assert j.lost("h") and len(j.streak("h")) == 4
    ev = j.evidence("h")
    assert ev["bound"] == 3 and ev["count"] == 3 and len(ev["probes"]) == 4 and all(p["lost"] for p in ev["probes"])
    assert ev["summary"].startswith("4 probes over 3.0 s (bound 3 s): no-route x4")
    assert "every one lost" in ev["summary"]

    j = Judge(bound=3, count=3)
    j.add(_p(0.0))
    j.add(_p(10.0))  # two probes 10 s apart: too few
    assert not j.lost("h")


def test_a_machine_the_provider_says_is_gone_twice_in_a_row_is_lost_before_the_bound() -> None:
    """The provider's word (down, deleted, preempted, ...) at two probes in a row proves the loss the bound waits
    for; once is not enough, and a provider that says nothing (or up) leaves the bound to decide."""
    j = Judge(bound=8, count=4)
    j.add(_p(0.0, provider="down"))
    assert not j.lost("h")  # once
    j.add(_p(0.3, provider="down"))
    assert j.lost("h")  # twice, 0.3 s apart: lost without waiting 8 s
    j = Judge(bound=8, count=4)
    for at, said in ((0.0, "down"), (1.0, None), (2.0, "down")):  # the provider did not say so at the middle one
        j.add(_p(at, provider=said))
    assert not j.lost("h")
    j = Judge(bound=8, count=4)
    for at in (0.0, 1.0, 2.0):
        j.add(_p(at, ssh="slow", provider="down"))  # slow, yet gone by the provider's word: a probe it proves lost
    assert j.lost("h")


def test_a_refusal_starts_the_count_again() -> None:
    """A refused connection between probes that found no route: the machine answered, so the count starts again."""
    j = Judge(bound=3, count=3)
    for at, ssh in ((0.0, "no-route"), (1.5, "no-route"), (3.0, "refused"), (4.5, "no-route"), (6.0, "no-route")):
        j.add(_p(at, ssh))
    assert not j.lost("h") and [p.at for p in j.streak("h")] == [4.5, 6.0]


def test_a_slow_probe_starts_the_count_again_and_an_answer_ends_the_spell() -> None:
    j = Judge(bound=3, count=3)
    for at, ssh in ((0.0, "no-route"), (1.5, "slow"), (3.0, "no-route"), (4.5, "no-route")):
        j.add(_p(at, ssh))
    assert not j.lost("h") and [p.at for p in j.streak("h")] == [3.0, 4.5]
    j.add(_p(6.0))
    assert j.lost("h")
    spell = j.add(_p(7.0, "answered"))
    assert [p.at for p in spell] == [0.0, 1.5, 3.0, 4.5, 6.0] and not j.lost("h") and j.last("h") is None
    j.add(_p(9.0))
    j.add(_p(8.0))  # probes land out of order: kept in the order they started
    assert [p.at for p in j.spell("h")] == [8.0, 9.0]


def test_a_host_slow_for_ever_is_never_judged_lost() -> None:
    j = Judge(bound=3, count=3)
    for i in range(200):
        j.add(_p(i * 1.5, "slow"))
    assert not j.lost("h") and j.streak("h") == []
    assert "slow x200" in liveness.summary(j.spell("h")) and "none lost" in liveness.summary(j.spell("h"))


def test_confirm_probes_again_every_spacing_until_judged_and_is_bounded() -> None:
    """node1 has no route every probe: judged lost after 3 rounds, 1.5 s apart; node0 answers; node2 is slow (no
    second probe: it cannot be judged lost); node3 has no route once, then is slow; node4 refuses (the machine is
    there: no second probe). Never more rounds than ``count``."""
    clock = [100.0]
    sleeps: list[float] = []
    seen: list[list[str]] = []
    script = {"node0": ["answered"] * 3, "node1": ["no-route"] * 3, "node2": ["slow"] * 3,
              "node3": ["no-route", "slow", "slow"], "node4": ["refused"] * 3}

    def look(hosts: list[str]) -> dict[str, Probe]:
        seen.append(list(hosts))
        i = len(seen) - 1
        return {h: Probe(h, clock[0], 0.01, script[h][i]) for h in hosts}

    def sleep(s: float) -> None:
        sleeps.append(s)
        clock[0] += s

    j = Judge(bound=3, count=3)
    lost, last = liveness.confirm(j, list(script), look, j.add, sleep=sleep)
    assert lost == ["node1"] and sleeps == [1.5, 1.5]
    assert seen == [["node0", "node1", "node2", "node3", "node4"], ["node1", "node3"], ["node1"]]
    assert last["node2"].ssh == "slow" and last["node3"].ssh == "slow" and last["node4"].ssh == "refused"

    j = Judge(bound=3, count=3)
    lost, _ = liveness.confirm(j, ["node1"], lambda hs: {h: Probe(h, clock[0], 0.01, "no-route") for h in hs},
                               j.add, sleep=lambda s: None)  # no time passes: never judged, and it stops
    assert lost == [] and len(j.spell("node1")) == 3


def test_the_prober_probes_a_watched_host_every_spacing_side_by_side() -> None:
    """A watched host is probed at once and every ``spacing`` (0.1 s) while each probe takes 0.35 s: probes run side
    by side (three at most), start 0.1 s apart and land in the order they started; ``landed`` wakes the run; once
    unwatched, no probe starts; a probe that raises is recorded as 'other', never lost."""
    def look(hosts: list[str]) -> dict[str, Probe]:
        t0 = time.time()
        if hosts == ["bad"]:
            raise RuntimeError("boom")
        time.sleep(0.35)
        return {h: Probe(h, t0, 0.35, "slow") for h in hosts}

    pr = liveness.Prober(look, spacing=0.1, until=time.time() + 60)
    pr.watch("h")
    pr.watch("h")  # already watched: nothing more
    assert pr.landed.wait(5)
    time.sleep(0.5)
    pr.unwatch("h")
    assert not pr.watching("h")
    pr.wait(5)
    got = pr.take()
    assert not pr.landed.is_set() and 3 <= len(got) <= 9, len(got)
    assert got == sorted(got, key=lambda p: p.at)
    gaps = [b.at - a.at for a, b in itertools.pairwise(got)]
    assert sum(gaps) / len(gaps) >= 0.09, gaps  # spaced, however long each takes
    assert min(gaps) < 0.3  # side by side: the next did not wait for the last one to end
    time.sleep(0.3)
    assert pr.take() == []  # unwatched: no more
    pr.watch("bad")
    assert pr.landed.wait(5)
    pr.stop()
    pr.wait(5)
    bad = [p for p in pr.take() if p.host == "bad"]
    assert bad and bad[0].ssh == "other" and "boom" in bad[0].detail and not bad[0].lost

    ended = liveness.Prober(look, spacing=0.1, until=time.time() - 1)  # past the run's end: never probes
    ended.watch("h")
    time.sleep(0.2)
    assert ended.take() == []


def test_alive_sh_reports_what_the_host_knows(tmp_path: Path) -> None:
    """The probe's script, run here: its boot id, uptime and load, and how long ago a rank log of the run was
    written."""
    (tmp_path / "rank0.out").write_text("step 1\n")
    r = subprocess.run(["sh", "-c", scripts.program("alive.sh", str(tmp_path))], capture_output=True, text=True,
                       check=False, timeout=30)
    assert r.returncode == 0, r.stderr
    rep = liveness.parse_report(r.stdout)
    assert rep["boot"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert float(rep["up"]) > 0 and float(rep["load"]) >= 0 and 0 <= int(rep["log"]) < 30
    r = subprocess.run(["sh", "-c", scripts.program("alive.sh", "")], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and "log" not in liveness.parse_report(r.stdout)


def test_the_provider_is_asked_about_the_hosts_that_did_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """probe(): one ssh per host through the transport; the provider's view for the silent ones, and a provider
    that cannot be asked is noted, never fatal."""
    def fake_run(testbed: str, hosts: list[str], command: str, **kw: object) -> list[remote.HostResult]:
        assert kw["mux"] == "none" and kw["timeout"] == 5 and "alive" not in command  # the script travels encoded
        return [remote.HostResult("a", 0, "boot b1\nup 12.5\nload 0.1\n", ""),
                remote.HostResult("b", 255, "", "ssh: connect to host x port 22: Connection refused"),
                remote.HostResult("c", None, "", "", error="timed out after 5 s")]

    monkeypatch.setattr(remote, "run", fake_run)
    asked: list[int] = []

    def states() -> dict[str, str]:
        asked.append(1)
        return {"a": "up", "b": "down", "c": "up"}

    got = liveness.probe("tb", ["a", "b", "c"], timeout=5, run_dir="~/.testbed-runs/r", states=states)
    assert asked == [1] and got["a"].report == {"boot": "b1", "up": "12.5", "load": "0.1"} and got["a"].provider is None
    assert (got["b"].ssh, got["b"].provider, got["b"].lost) == ("refused", "down", True)
    assert (got["c"].ssh, got["c"].provider, got["c"].lost) == ("slow", "up", False)

    from testbed.errors import TestbedError

    def broken() -> dict[str, str]:
        raise TestbedError("no credentials", where="env", fix="source openrc")

    got = liveness.probe("tb", ["a", "b", "c"], timeout=5, states=broken)
    assert got["c"].provider is None and "the provider could not be asked: no credentials" in got["c"].detail
    assert not got["c"].lost and not got["b"].lost  # a refusal alone: the machine is there


@pytest.mark.parametrize("lost_after,bound", [(None, 3.0), (60, 60.0), (1, 3.0)])
def test_the_bound_is_the_suites_raised_by_the_testbeds_lost_after(tb_home: Path, lost_after: float | None,
                                                                   bound: float) -> None:
    """timeouts.unreachable sets the bound and timeouts.probes the count; a testbed's lost_after raises the bound
    (never lowers it): a bare-metal host that takes minutes to reboot is not judged lost in 3 s."""
    from testbed.run import runner

    (tb_home / "experiments").mkdir()
    (tb_home / "inventories").mkdir()
    (tb_home / "experiments" / "s.yml").write_text(
        "name: s\nsteps:\n  launch:\n    command: sleep 1\ntimeouts: {unreachable: 3, probes: 4}\n")
    extra = f"lost_after: {lost_after}\n" if lost_after is not None else ""
    (tb_home / "inventories" / "lab.yml").write_text(
        "provider:\n  kind: lab\n  hosts:\n    - {name: a, address: 192.0.2.1}\n" + extra)
    plan = runner.plan_run("s", "lab", {}, dry_run=True)
    assert plan.timeouts.unreachable == bound and plan.timeouts.probes == 4
    assert plan.to_json()["timeouts"]["probes"] == 4


def test_status_lines_say_why_a_host_was_judged_lost_or_waited_for() -> None:
    from testbed.records import RunEvent
    from testbed.run.runner import describe_event

    def ev(kind: str, host: str | None, **d: object) -> str:
        return describe_event(RunEvent(seq=1, run_id="r", ts=0.0, kind=kind, host=host, detail=d))

    why = "3 probes over 3.1 s (bound 3 s): refused x3; every one lost"
    assert ev("host-lost", "node1", summary=why) == f"node1 judged lost: {why}"
    assert ev("repairing", None, hosts=["node1"], setup=False, why={"node1": why}) == \
        f"repairing node1 (judged lost: node1: {why})"
    assert ev("host-slow", "node1", probe={"seconds": 5.0, "detail": "timed out after 5 s"},
              note="a slow answer is not a lost host: the run waits") == \
        "node1 slow: no answer in 5.0 s (timed out after 5 s); a slow answer is not a lost host: the run waits"
    assert ev("host-back", "node1", seconds=41.0, summary="9 probes over 40.0 s: slow x9; none lost") == \
        "node1 answers again after 41.0 s without an answer: 9 probes over 40.0 s: slow x9; none lost"


def _watching_supervisor(unreachable: float = 3.0) -> tuple[Any, Any, list[str]]:
    """A supervisor's liveness state alone (no run, no state): its ``unanswered`` judgement of one rank on
    ``h``, the reasons its ranks ended with."""
    from types import SimpleNamespace

    from testbed.records import Rank
    from testbed.run.supervisor import Attempt, Supervisor

    sup = Supervisor.__new__(Supervisor)
    sup.t = SimpleNamespace(unreachable=unreachable)
    sup.judged, sup.last_probe, sup.suspect = {}, {}, {"h": "exit 255"}
    ended: list[str] = []

    def end_rank(att: Attempt, r: Rank, status: str, code: int | None, reason: str, at: float | None = None) -> None:
        att.done[r.rank] = (status, code, reason)
        ended.append(reason)

    sup.end_rank = end_rank
    att = Attempt([Rank(rank=0, host="h", address="10.0.0.2", command="true")], launched=0.0)
    return sup, att, ended


@pytest.mark.parametrize("ssh", ["slow", "refused", "no-route"])
def test_a_host_slow_refusing_or_unroutable_for_long_is_waited_for(ssh: str) -> None:
    """Polls failing for 60 s (twenty times the bound) while every probe finds the host slow, refusing, or without a
    route the provider does not confirm: its rank runs on (the run's own timeout ends a run that waits too long)."""
    sup, att, ended = _watching_supervisor()
    for t in range(0, 60, 2):
        sup.last_probe["h"] = Probe("h", float(t), 0.5, ssh, provider="up")
        sup.unanswered(att, "h", float(t) + 0.5)
    assert ended == [] and not att.done


def test_a_failed_poll_right_after_a_host_answered_again_starts_a_new_spell() -> None:
    """A throttled link: 40 s of slow probes, then the host answers a probe, then one poll fails (a master connection
    dropped under its client: ssh's exit 255, nothing said). The spell that ended must not be counted against the
    new one: the rank runs on."""
    sup, att, ended = _watching_supervisor()
    for t in range(0, 40, 2):
        sup.last_probe["h"] = Probe("h", float(t), 5.0, "slow")
        sup.unanswered(att, "h", float(t) + 5)
    sup.last_probe["h"] = Probe("h", 44.0, 0.2, "answered")
    sup.unanswered(att, "h", 45.0)  # the failed poll after the answer
    assert ended == [], ended


def test_a_host_that_turns_the_testbed_away_fails_its_ranks_after_the_bound() -> None:
    """The host answers but refuses the key: waiting does not help; once its polls failed for the bound, its ranks
    fail naming why."""
    sup, att, ended = _watching_supervisor()
    detail = "h refused the key (Permission denied): check the user and that the testbed key is installed"
    for t in (0.0, 1.5, 3.0, 4.5):
        sup.last_probe["h"] = Probe("h", t, 0.1, "rejected", detail)
        sup.unanswered(att, "h", t + 0.1)
    assert ended == [f"host unreachable ({detail})"]
