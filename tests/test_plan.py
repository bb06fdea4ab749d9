"""``testbed plan`` and ``run --matrix --budget``: declared estimates (parsed, validated with file:line), budgets
parsed strictly, prices per provider, the campaign's wall time over its hosts, estimates from earlier runs in
state, points a campaign finished not counted again, the fit in an expiry; and on a real local testbed with a
price table of the test's own, a budget that stops a 3-point campaign after the point that fits, and a second
run that resumes it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import estimate as est
from testbed.errors import UsageError

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]

PACED = """\
name: paced
parameters:
  n: {type: int, default: 1}
  host_count: {type: int, default: 4}
matrix:
  n: [1, 2, 3]
placement: {hosts: "{{ host_count }}"}
estimate:
  by: n
  cases: {"1": 10s, "2": 60s, "3": 10s}
steps:
  launch:
    command: "echo point {{ n }} rank {{ rank }}"
timeouts: {poll: 0.5, grace: 2, unreachable: 3}
"""


# --- estimates ---------------------------------------------------------------------------------------------------
def test_an_estimate_is_a_sum_of_durations_times_numbers_and_parameters() -> None:
    assert est.parse_estimate("5m").seconds({}) == 300
    e = est.parse_estimate("2m + 40s * epochs * 1.5")
    assert e.names == ["epochs"] and e.seconds({"epochs": 3}) == 120 + 180
    d = est.parse_estimate("3m * (epochs or 2)")
    assert d.seconds({"epochs": None}) == 360 and d.seconds({"epochs": 1}) == 180
    with pytest.raises(ValueError, match="'epochs' is None here, not a number"):
        e.seconds({"epochs": None})
    for bad, why in (("", "empty"), ("5", "no duration"), ("epochs", "no duration"), ("5m 3m", "no \\+ or \\*"),
                     ("5m *", "ends with an operator"), ("+5m", "without a value"), ("5m * 3m", "two durations"),
                     ("5x", "cannot read")):
        with pytest.raises(ValueError, match=why):
            est.parse_estimate(bad)


def test_a_suite_estimate_is_validated_with_file_and_line(tb_home: Path) -> None:
    from testbed.suite import load_suite

    (tb_home / "experiments").mkdir()
    base = ("name: s\nparameters:\n  epochs: {type: int, default: 2}\n  model: {type: str, default: a, "
            "choices: [a, b]}\nsteps:\n  launch: {command: 'true'}\n")
    cases = {"estimate: 1m + 10s * epoch\n": ("'epoch' is not a parameter", 7),
             "estimate: 1m * model\n": ("'model' is a str, not a number", 7),
             "estimate: 1m 2m\n": ("no + or *", 7),
             "estimate:\n  by: model\n  cases: {a: 1m, c: 2m}\n": ("case 'c' is not a value of model", 9),
             "estimate:\n  by: size\n  cases: {a: 1m}\n": ("'size' is not a parameter", 8),
             "estimate:\n  by: model\n  cases:\n    a: 1m\n    b: 2h 3\n": ("two values", 11)}
    for text, (what, line) in cases.items():
        (tb_home / "experiments" / "s.yml").write_text(base + text)
        with pytest.raises(UsageError) as e:
            load_suite("s")
        assert what in e.value.what and e.value.where.endswith(f"s.yml:{line}"), (text, e.value.render())
        assert e.value.fix and ("duration" in e.value.fix or "parameter" in e.value.fix)


def test_every_shipped_suite_declares_an_estimate_for_every_matrix_point(tb_home: Path) -> None:
    from testbed.run.forecast import Estimator
    from testbed.state import Store
    from testbed.suite import expand_matrix, list_suites, load_suite, resolve_params

    st = Store.open_default()
    for name in ("datastall-emulator", "tesla", "isca-resnet18", "jitc", "neuronabox", "fault-drill",
                 "matmul-baseline", "mpi-hello"):
        assert name in list_suites()
        s = load_suite(name)
        points = expand_matrix(s, {}) if s.matrix else [resolve_params(s, {})]
        for p in points:
            secs, source = Estimator(s, "x", st)(p)
            assert secs is not None and 0 < secs < 24 * 3600, (name, p, source)
            assert source.startswith("the suite's estimate") and re.search(r"\.yml:\d+\)$", source), source


# --- budgets and prices ------------------------------------------------------------------------------------------
def test_budgets_are_parsed_strictly() -> None:
    assert est.parse_budget("40h") == est.Budget(40.0, "hours", "40h")
    assert est.parse_budget("90m").amount == 1.5 and est.parse_budget("2d").amount == 48
    assert est.parse_budget("500 SU") == est.Budget(500.0, "SU", "500 SU")
    assert est.parse_budget("12.5su").unit == "SU"
    assert est.parse_budget("$120") == est.Budget(120.0, "USD", "$120")
    assert est.parse_budget("120 USD").unit == "USD"
    for bad in ("40", "", "h", "0h", "-3h", "40 hours", "SU 5", "$", "1e3h", "nanh"):
        with pytest.raises(ValueError, match="is not a budget"):
            est.parse_budget(bad)


def test_prices_per_provider_and_budgets_in_the_testbeds_unit(tb_home: Path) -> None:
    from testbed.run.forecast import testbed_rate
    from testbed.state import Store

    st = Store.open_default()
    kind, cham = testbed_rate("chameleon", 2, st)  # the shipped spec: 1 node, but the suite asks for 2
    assert (kind, cham.per_hour, cham.unit) == ("chameleon", 2.0, "SU") and cham.cost(1800) == 1.0
    kind, tpu = testbed_rate("tpu", 1, st)
    assert (kind, tpu.per_hour, tpu.unit) == ("gcp-tpu", 4.5, "USD") and "4 chips x $1.125" in tpu.basis
    kind, free = testbed_rate("local", 4, st)
    assert free.per_hour is None and free.cost(3600) is None and "free" in free.basis
    prices = tb_home / ".testbed" / "prices.json"
    prices.write_text(json.dumps({"local": {"per_node_hour": 2.5, "unit": "SU"}}))  # the state home's table
    _, priced = testbed_rate("local", 4, st)
    assert (priced.per_hour, priced.unit) == (10.0, "SU") and "4 hosts x 2.5 SU/host-hour" in priced.basis
    prices.write_text(json.dumps({"local": {"per_node_hour": 1, "unit": "credits"}}))
    with pytest.raises(UsageError, match="unit 'credits'") as e:
        testbed_rate("local", 4, st)
    assert e.value.where == str(prices)
    assert est.budget_hours(est.parse_budget("5 SU"), cham) == 2.5
    assert est.budget_hours(est.parse_budget("3h"), free) == 3
    with pytest.raises(UsageError) as e:
        est.budget_hours(est.parse_budget("$10"), cham)
    assert "is in USD, but this testbed is priced in SU" in e.value.what and e.value.where == "--budget"
    with pytest.raises(UsageError, match="has no price"):
        est.budget_hours(est.parse_budget("10 SU"), free)


def test_wall_time_follows_the_campaigns_dispatch_and_spending_counts_overlaps_once() -> None:
    assert est.makespan([10, 10, 10], [4, 4, 4], 4) == (30, [0, 10, 20])  # each takes every host: one at a time
    assert est.makespan([10, 10, 10], [2, 2, 2], 4) == (20, [0, 0, 10])
    assert est.makespan([5, 10], [2, 4], 4) == (15, [0, 5])  # matrix order: the second waits for all hosts
    assert est.makespan([10], [2], 4, busy=[(30, 4)]) == (40, [30])  # a run still going holds the hosts
    assert est.union_seconds([(0, 5), (3, 8), (10, 12), (11, 11)]) == 10


# --- the stage ---------------------------------------------------------------------------------------------------
def _runs(st, suite: str, testbed: str, params: dict, durations: list[float], campaign: str | None = None,
          status: str = "succeeded") -> list[str]:  # type: ignore[no-untyped-def]
    from testbed.records import RunInfo, RunRecord

    ids = []
    for i, d in enumerate(durations):
        rid = f"{suite}-{len(ids)}-{time.monotonic_ns()}"
        created = 1_796_000_000.0 + 1000 * i
        st.add_run(RunRecord(id=rid, suite=suite, testbed=testbed, params=params, status="pending",
                             campaign=campaign, created=created, info=RunInfo()), [])
        st.update_run(rid, status=status, started=created + 1, ended=created + d)
        ids.append(rid)
    return ids


def test_forecast_uses_earlier_runs_then_the_estimate_and_skips_finished_points(tb_home: Path) -> None:
    from testbed.run import campaign, forecast
    from testbed.state import Store
    from testbed.suite import expand_matrix, load_suite

    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "paced.yml").write_text(PACED)
    st = Store.open_default()
    s = load_suite("paced")
    points = expand_matrix(s, {})
    _runs(st, "paced", "local", points[2], [30, 50, 40])  # n=3: three earlier runs here: their median
    _runs(st, "paced", "elsewhere", points[1], [99])  # n=2: one on another testbed
    _runs(st, "paced", "local", points[1], [500], status="failed")  # never an estimate
    fc = forecast.forecast("paced", "local", {}, matrix=True, store=st)
    by_n = {p.params["n"]: p for p in fc.points}
    assert by_n[1].seconds == 10
    assert by_n[1].source == "the suite's estimate '10s' (experiments/paced.yml:10)"
    assert by_n[2].seconds == 99 and by_n[2].source.startswith("the earlier run on elsewhere")
    assert by_n[3].seconds == 40 and by_n[3].source.startswith("median of the 3 earlier runs on local")
    assert fc.total_seconds == 149 and fc.hosts == 4 and fc.provider == "local"
    assert fc.rate.per_hour is None and fc.cost is None  # local: free
    assert fc.fit["fits"] is None and fc.campaign is None

    # a campaign of these points with n=1 finished: spent, not counted again; its price from the state home's table
    (tb_home / ".testbed" / "prices.json").write_text(json.dumps({"local": {"per_node_hour": 9, "unit": "SU"}}))
    cid = campaign.create_or_resume("paced", "local", points, None, store=st)
    row = st.campaign(cid)
    assert row is not None
    [done] = _runs(st, "paced", "local", points[0], [20], campaign=cid)
    row.points[0].run_id, row.points[0].status = done, "succeeded"
    st.save_campaign(cid, row.points)
    fc = forecast.forecast("paced", "local", {}, matrix=True, store=st)
    assert fc.campaign == cid and fc.points[0].status == "succeeded" and fc.points[0].spent == 20
    assert fc.total_seconds == 99 + 40 and fc.spent_seconds == 20
    assert (fc.rate.per_hour, fc.rate.unit) == (36, "SU") and fc.cost == round(36 * 139 / 3600, 4)

    # an expiry 60 s away: the 139 s left do not fit, short by 79 s
    st.upsert_testbed("local", "local", None, "up", {"expiry": {"expire_at": time.time() + 60}})
    fc = forecast.forecast("paced", "local", {}, matrix=True, store=st, now=time.time())
    assert fc.fit["fits"] is False and 78 <= fc.fit["short_by_seconds"] <= 80 and "its expiry" in fc.fit["basis"]
    st.upsert_testbed("local", "local", None, "up", {"expiry": {"expire_at": time.time() + 3600}})
    fc = forecast.forecast("paced", "local", {}, matrix=True, store=st)
    assert fc.fit["fits"] is True and fc.fit["short_by_seconds"] == 0


def test_plan_cli_json_and_text_and_bad_budgets_refused_before_anything(tb_home: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(tb_home / ".testbed"), "COLUMNS": "200"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "testbed", *args], cwd=tb_home, capture_output=True, text=True,
                              env=env, timeout=120, check=False)

    # jitc trains on GPUs (its faults need one): a two-node GPU lease, as the user's own spec would say
    (tb_home / "inventories").mkdir(exist_ok=True)
    (tb_home / "inventories" / "chameleon-gpu.yml").write_text(
        "provider: {kind: chameleon, site: CHI@UC, node_type: gpu_rtx_6000, count: 2, image: CC-Ubuntu20.04,"
        " hours: 6}\nuser: cc\nhardware: {gpu: {model: Quadro RTX 6000, count: 1}}\n")
    r = cli("plan", "jitc", "--matrix", "--on", "chameleon", "--json")
    assert r.returncode == 2 and "need gpu, cuda (steps.launch.needs), which testbed 'chameleon' (chameleon) " \
        "lacks" in " ".join(r.stderr.split()), r.stderr
    r = cli("plan", "jitc", "--matrix", "--on", "chameleon-gpu", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["unit"] == "SU" and len(out["points"]) == 5 and out["fit"]["fits"] is True
    assert out["total_seconds"] == 3 * 60 + 3 * 5 * 60 + 4 * 60 + 200 and out["cost"] == round(2 * 1520 / 3600, 4)
    r = cli("plan", "datastall-emulator", "--matrix")
    assert r.returncode == 0, r.stderr
    assert re.search(r"total: 14h 42m of wall time left, cost 14\.7 SU", r.stdout), r.stdout
    assert "fits: yes, 20h 00m left (its spec's lease of 20 h (not provisioned yet))" in r.stdout
    for budget, what in (("40", "'40' is not a budget"), ("5 hours", "is not a budget")):
        r = cli("run", "matmul-baseline", "--matrix", "--on", "local", "--budget", budget)
        assert r.returncode == 2 and what in r.stderr and "where: --budget" in r.stderr, r.stderr
        assert "fix:" in r.stderr and "Traceback" not in r.stderr
    r = cli("run", "matmul-baseline", "--on", "local", "--budget", "3h")
    assert r.returncode == 2 and "needs --matrix" in r.stderr
    assert not (tb_home / ".testbed" / "state.db").exists()  # refused before any state, let alone a host


# --- on the local testbed ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bed(shared_local_testbed):  # type: ignore[no-untyped-def]
    b = shared_local_testbed
    (b.cwd / "experiments").mkdir(exist_ok=True)
    (b.cwd / "experiments" / "paced.yml").write_text(PACED)
    # the test's own price table: the local hosts at 9 SU per host-hour (4 hosts: 36 SU/h, 0.01 SU a second)
    (b.home / "prices.json").write_text(json.dumps({"local": {"per_node_hour": 9, "unit": "SU"}}))
    os.chdir(b.cwd)
    os.environ["TESTBED_HOME"] = str(b.home)
    return b


def test_a_budget_stops_a_campaign_after_the_point_that_fits_and_a_rerun_resumes_it(bed) -> None:  # type: ignore[no-untyped-def]
    from testbed.state import Store

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "testbed", *args], cwd=bed.cwd, capture_output=True, text=True,
                              timeout=240, check=False, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                             "TESTBED_HOME": str(bed.home), "COLUMNS": "200"})

    plan = json.loads(cli("plan", "paced", "--matrix", "--on", bed.name, "--json").stdout)
    assert [p["seconds"] for p in plan["points"]] == [10, 60, 10] and plan["total_seconds"] == 80
    assert plan["unit"] == "SU" and plan["cost"] == 0.8  # 80 s x 36 SU/h

    # 0.3 SU = 30 s of this testbed: n=1 (10 s) fits; n=2 (60 s more) does not
    r = cli("run", "paced", "--on", bed.name, "--matrix", "--budget", "0.3 SU")
    print(r.stderr)  # shown with -s: what a user sees
    err = " ".join(r.stderr.split())
    assert r.returncode == 3, r.stderr
    cid = re.search(r"campaign (paced-[0-9a-f]{8}): 3 runs of paced", err)[1]  # type: ignore[index]
    assert "budget 0.3 SU (30s of this testbed)" in err
    assert f"campaign {cid}: budget 0.3 SU reached; no new point is started (the next, n=2, host_count=4, is " \
           "estimated at 60 s)" in err, err
    m = re.search(rf"campaign {cid} paused by its budget \(0\.3 SU\): spent ([\d.]+) SU \((\d+) s of runs\), "
                  r"([\d.]+) SU left; 2 points not started", err)
    assert m, err
    st = Store.open_default()
    row = st.campaign(cid)
    assert row is not None and row.status == "paused"
    assert [p.status for p in row.points] == ["succeeded", "todo", "todo"]
    [first] = [r for r in st.query("SELECT created, ended FROM runs WHERE campaign=?", (cid,))]
    actual = first["ended"] - first["created"]  # spending is the run's actual time, not its estimate
    print(f"point n=1 took {actual:.1f} s on {bed.name} (estimated 10 s)")
    assert row.info.stopped is not None and abs(row.info.stopped["spent_seconds"] - actual) < 0.2
    assert abs(float(m[1]) - actual * 0.01) < 0.005 and abs(float(m[3]) - (0.3 - actual * 0.01)) < 0.005

    # the plan of the paused campaign counts only what is left, and names the time spent
    print(cli("plan", "paced", "--matrix", "--on", bed.name).stdout)
    plan = json.loads(cli("plan", "paced", "--matrix", "--on", bed.name, "--json").stdout)
    assert plan["campaign"] == cid and plan["total_seconds"] == 70 and plan["cost"] == 0.7
    assert plan["points"][0]["status"] == "succeeded" and abs(plan["spent_seconds"] - actual) < 0.2

    # run again with room for the rest: resumed, nothing repeated
    r = cli("run", "paced", "--on", bed.name, "--matrix", "--budget", "2 SU")
    assert r.returncode == 0, r.stderr
    assert "resuming; 1/3 runs already finished" in r.stderr and f"campaign {cid} succeeded: 3/3 runs" in \
        " ".join(r.stderr.split())
    row = st.campaign(cid)
    assert row is not None and row.status == "succeeded" and row.info.stopped is None
    assert len(st.query("SELECT id FROM runs WHERE campaign=?", (cid,))) == 3

    # estimates now come from those runs
    plan = json.loads(cli("plan", "paced", "--on", bed.name, "-p", "n=2", "--json").stdout)
    assert plan["points"][0]["source"].startswith(f"the earlier run on {bed.name}")
    assert plan["points"][0]["seconds"] < 60


def test_a_dry_run_with_no_testbed_shows_a_placeholder_never_a_testbed_named_dry_run(tb_home: Path) -> None:
    """No --on and no testbed in the suite: the commands a dry run shows name a placeholder to replace (TESTBED),
    not a testbed called 'dry-run' that a user would copy into 'testbed setup dry-run'."""
    from testbed import services
    from testbed.run.plan import dry_run_lines

    (tb_home / "experiments").mkdir(exist_ok=True)
    (tb_home / "experiments" / "bare.yml").write_text(
        "name: bare\nprofile: local-suites\nsteps:\n  launch:\n    on: master\n    command: echo hi\n")
    p = services.plan("bare", None, dry_run=True)
    setup = [ln["command"] for ln in dry_run_lines(p) if ln["phase"] == "setup"]
    assert setup and all(c == "testbed setup TESTBED --profile local-suites" for c in setup), setup
    assert "dry-run" not in " ".join(str(ln) for ln in dry_run_lines(p))


def test_the_python_api_runs_a_matrix_with_a_budget_and_resumes_it(bed) -> None:  # type: ignore[no-untyped-def]
    """tb.run_matrix is the CLI's `run --matrix --budget` through the same services: paused by its budget after
    the point that fits, then resumed by the same call with room for the rest, nothing repeated."""
    import testbed
    from testbed.errors import UsageError

    tb = testbed.open(bed.name)
    with pytest.raises(UsageError, match="'40' is not a budget"):
        tb.run_matrix("paced", {"host_count": 2}, budget="40")
    row = tb.run_matrix("paced", {"host_count": 2}, budget="0.3 SU")
    assert row.status == "paused" and [p.status for p in row.points] == ["succeeded", "todo", "todo"], row
    assert [p.params["host_count"] for p in row.points] == [2, 2, 2]
    again = tb.run_matrix("paced", {"host_count": 2}, budget="2 SU")
    assert again.id == row.id and again.status == "succeeded"
    assert [p.status for p in again.points] == ["succeeded"] * 3 and again.points[0].run_id == row.points[0].run_id


LONG = """\
name: long
parameters: {n: {type: int, default: 1}}
matrix: {n: [1, 2, 3]}
estimate: 2h
steps: {launch: {command: "echo {{ n }}"}}
"""


def test_a_campaign_that_would_outlive_its_testbed_is_refused_before_anything(tb_home: Path) -> None:
    """Three 2-hour points on a lab testbed whose spec gives it 4 hours: refused before set-up, a host or a
    campaign record, with the way out; a budget within what is left is allowed past this check."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(tb_home / ".testbed"), "COLUMNS": "200"}
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "long.yml").write_text(LONG)
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab4h.yml").write_text(
        "provider: {kind: lab, hosts: [{name: a, address: 192.0.2.10}]}\nuser: alice\nexpire: 4h\n")
    r = subprocess.run([PY, "-m", "testbed", "run", "long", "--matrix", "--on", "lab4h"], cwd=tb_home, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr
    assert "the campaign of long would outlive testbed 'lab4h': its points are estimated at 6h 00m" in err, err
    assert "4h 00m left (its spec's expire: 4h (not provisioned yet))" in err and "--budget 240m" in err, err
    from testbed.state import Store

    st = Store(tb_home / ".testbed" / "state.db")
    assert not st.exists or not st.query("SELECT id FROM campaigns")  # nothing recorded, nothing touched
