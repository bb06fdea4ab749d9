"""References and verdicts: the suites' ``references:`` schema (file:line errors), verdicts as data, and the
artifacts' own committed outputs (../shared/artifacts, skipped when absent) reported as if they were ours:
every reference comes out within tolerance against them."""

from __future__ import annotations

import csv
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from testbed.errors import UsageError
from testbed.references import References
from testbed.report.build import build_report
from testbed.report.model import Table
from testbed.report.verdicts import NOT_MEASURED, OUTSIDE, WITHIN, evaluate, hardware_difference
from testbed.suite import list_suites, load_suite

ART = Path(__file__).resolve().parents[2] / "shared" / "artifacts"
if not ART.is_dir():
    ART = Path("/work/shared/artifacts")
SEEDS = ("datastall-emulator", "tesla", "isca-resnet18", "jitc", "neuronabox")


def refs(*metrics: dict, hardware: dict | None = None) -> References:
    return References.model_validate({"hardware": hardware or {}, "metrics": list(metrics)})


def ref(**kw: object) -> dict:
    base = {"metric": "m", "table": "t", "column": "y", "value": 1.0, "source": "paper, table 1",
            "tolerance": {"rel": 10, "why": "other hardware"}}
    return {**base, **kw}


TABLE = Table("t", ["x", "kind", "y"], [[1, "a", 1.05], [2, "a", 2.0], [3, "b", None], [4, "b", "n/a"]])


# --- schema ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("suite", [*SEEDS, "fault-drill", "matmul-baseline", "mpi-hello"])
def test_every_suite_declares_sourced_references(suite: str) -> None:
    s = load_suite(suite)
    assert s.references is not None and s.references.metrics
    for r in s.references.metrics:
        assert r.source.strip() and r.tolerance.why.strip()


def write_suite(tmp_path: Path, refs_yaml: str) -> Path:
    p = tmp_path / "s.yml"
    p.write_text("name: s\nsteps:\n  launch: {command: 'true'}\nreferences:\n  metrics:\n" + refs_yaml)
    return p


@pytest.mark.parametrize(("body", "line", "words"), [
    ("    - {metric: a, table: t, column: c, value: 1, source: s, tolerance: {rel: 5}}\n", 6, "why"),
    ("    - metric: a\n      table: t\n      column: c\n      value: 1\n      source: s\n"
     "      tolerance: {rel: 5, abs: 1, why: w}\n", 11, "exactly one of"),
    ("    - {metric: a, table: t, column: c, value: 1, source: s, tolerance: {exact: true, why: w}}\n"
     "    - metric: b\n      table: t\n      column: c\n      value: Masked\n      source: s\n"
     "      tolerance: {rel: 5, why: w}\n", 12, "only 'exact: true'"),
    ("    - {metric: a, table: t, column: c, value: 1, source: s, tolerance: {exact: true, why: w}}\n"
     "    - {metric: a, table: t, column: d, value: 1, source: s, tolerance: {exact: true, why: w}}\n", 7,
     "two references are named 'a'"),
    ("    - {metric: a, table: t, column: c, value: 1, source: '', tolerance: {exact: true, why: w}}\n", 6, "source"),
])
def test_bad_references_are_refused_at_their_line(tmp_path: Path, body: str, line: int, words: str) -> None:
    path = write_suite(tmp_path, body)
    with pytest.raises(UsageError) as e:
        load_suite(str(path))
    assert e.value.where == f"{path}:{line}", (e.value.where, e.value.what)
    assert words in e.value.what + (e.value.fix or "")


def test_unknown_hardware_key_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "s.yml"
    p.write_text("name: s\nsteps:\n  launch: {command: 'true'}\nreferences:\n  hardware: {gpus: 8}\n  metrics:\n"
                 "    - {metric: a, table: t, column: c, value: 1, source: s, tolerance: {exact: true, why: w}}\n")
    with pytest.raises(UsageError) as e:
        load_suite(str(p))
    assert e.value.where == f"{p}:5" and "gpus" in e.value.what


# --- verdicts ----------------------------------------------------------------------------------------------------
def test_within_outside_and_not_measured() -> None:
    v = evaluate(refs(ref(metric="a", where={"x": 1}), ref(metric="b", where={"x": 2}),
                      ref(metric="c", where={"x": 3}), ref(metric="d", table="nope"),
                      ref(metric="e", where={"kind": "a"}, value=1.5, tolerance={"abs": 0.1, "why": "w"}),
                      ref(metric="f", where={"kind": "a"}, reduce="count", value=2,
                          tolerance={"exact": True, "why": "a count"}),
                      ref(metric="g", value=2.5, compare="at-most", tolerance={"abs": 0, "why": "bound"},
                          where={"kind": "a"})),
                 [TABLE], [])
    by = {x.metric: x for x in v}
    assert by["a"].status == WITHIN and by["a"].ours == 1.05 and by["a"].relative_pct == pytest.approx(5.0)
    assert by["b"].status == OUTSIDE and by["b"].difference == pytest.approx(1.0)
    assert by["c"].status == NOT_MEASURED and "no y where x=3" in by["c"].note
    assert by["d"].status == NOT_MEASURED and "no table nope" in by["d"].note
    assert by["e"].ours == pytest.approx(1.525) and by["e"].status == WITHIN and by["e"].note == "mean of 2 rows"
    assert by["f"].ours == 2 and by["f"].status == WITHIN
    assert by["g"].ours == 2.0 and by["g"].status == WITHIN  # the largest of the rows, against the bound


def test_text_references_compare_exactly() -> None:
    t = Table("o", ["run", "outcome"], [["inj_masked", "Masked"], ["inj_slow", "Masked"]])
    v = evaluate(refs(ref(metric="m", table="o", where={"run": "inj_masked"}, column="outcome", value="Masked",
                          tolerance={"exact": True, "why": "a class"}),
                      ref(metric="s", table="o", where={"run": "inj_slow"}, column="outcome", value="Degraded",
                          tolerance={"exact": True, "why": "a class"})), [t], [])
    assert [x.status for x in v] == [WITHIN, OUTSIDE] and v[1].ours == "Masked"


def test_hardware_difference_is_named() -> None:
    hosts = [{"name": "n0", "facts": {"cpus": 2, "gpus": []}}, {"name": "n1", "facts": {"cpus": 2, "gpus": []}}]
    assert hardware_difference({"gpu": "RTX 3070", "cpus": 8}, hosts) == "GPU RTX 3070 vs ours none; 8 cores vs ours 2"
    gpu_hosts = [{"name": "n0", "facts": {"cpus": 8, "gpus": [{"name": "NVIDIA GeForce RTX 3070"}]}}]
    assert hardware_difference({"gpu": "RTX 3070", "cpus": 8}, gpu_hosts) == ""
    assert "not recorded" in hardware_difference({"tpu": "v2-8"}, [{"name": "n0"}])
    assert hardware_difference({}, hosts) == ""


# --- the artifacts' own outputs, through the report, against themselves -------------------------------------------
def extract(name: str, tmp: Path) -> Path:
    tar = ART / f"{name}.tar.gz"
    if not tar.is_file():
        pytest.skip(f"{tar} not present")
    out = tmp / name
    with tarfile.open(tar) as tf:
        tf.extractall(out, filter="data")
    return next(p for p in out.iterdir() if p.is_dir())


def as_run(tmp: Path, suite: str, src: Path, drop: tuple[str, ...] = ()) -> Path:
    run = tmp / "results" / suite / "r1"
    shutil.copytree(src, run / "node0", ignore=shutil.ignore_patterns(*drop) if drop else None)
    (run / "manifest.json").write_text(json.dumps({"suite": suite, "run_id": "r1", "status": "succeeded",
                                                   "hosts": [{"name": "node0"}]}))
    return run


def self_check(run: Path, suite: str) -> Path:
    """The run's report folder, once every reference is within tolerance."""
    res = build_report(run, "html")
    assert len(res.verdicts) == len(load_suite(suite).references.metrics)  # type: ignore[union-attr]
    off = [(v.metric, v.reference, v.ours, v.note) for v in res.verdicts if v.status != WITHIN]
    assert not off, off
    html = res.path.read_text()
    assert html.index('id="verdicts"') < html.index('id="checks"') if res.checks else 'id="verdicts"' in html
    rows = (res.path.parent / "verdicts.csv").read_text().splitlines()
    assert len(rows) == len(res.verdicts) + 1 and all(",within tolerance," in r for r in rows[1:])
    return res.path.parent


def test_datastall_published_outputs_are_within_their_references(tmp_path: Path) -> None:
    repo = extract("OSRE_DELIVERABLE", tmp_path)
    # the whole committed folder: outputsfig4 holds the SSD run (6g..16g, figure 4(a)) and the HDD run (4g, 18g..24g)
    run = as_run(tmp_path, "datastall-emulator", repo / "datastall")
    report = self_check(run, "datastall-emulator")
    fig4a = {float(r["limit_gb"]): float(r["fetch_s"]) for r in csv.DictReader((report / "fig4a_breakdown.csv").open())}
    fig4b = {float(r["limit_gb"]): float(r["fetch_s"]) for r in csv.DictReader((report / "fig4b_breakdown.csv").open())}
    # as time4(a).dat: fetch relative to the SSD run's own 16g, never to the HDD run's 24g
    assert list(fig4a) == [6, 8, 10, 12, 14, 16] and fig4a[6] == pytest.approx(9.060285568) and fig4a[16] == 0
    assert list(fig4b) == [4, 18, 20, 24] and fig4b[24] == 0  # 22g was interrupted in epoch 1
    assert fig4b[18] == pytest.approx(18.833545923233032 - 5.62968897819519)


@pytest.mark.slow
def test_tesla_published_outputs_are_within_their_references(tmp_path: Path) -> None:
    repo = extract("Scalable_ViT_DT", tmp_path)
    report = self_check(as_run(tmp_path, "tesla", repo / "tesla" / "log"), "tesla")
    # log/ holds micro-batches 1, 16 and 32 at the same GPU counts: one series each, as result/'s plots
    rows = list(csv.DictReader((report / "scaling.csv").open()))
    keys = [(r["kind"], int(r["micro_batch"]), int(r["gpus"])) for r in rows]
    assert len(keys) == len(set(keys)) and {k[1] for k in keys} == {1, 16, 32}
    b16 = {int(r["gpus"]): r for r in rows if r["kind"] == "strong" and r["micro_batch"] == "16"}
    assert float(b16[2]["speedup_vs_1"]) == pytest.approx(float(b16[1]["mean_epoch_s"]) / float(b16[2]["mean_epoch_s"]))


def test_isca_published_outputs_are_within_their_references(tmp_path: Path) -> None:
    repo = extract("ISCA_AE", tmp_path)
    self_check(as_run(tmp_path, "isca-resnet18", repo), "isca-resnet18")


def test_a_missing_point_is_not_measured_and_json_carries_verdicts(tmp_path: Path) -> None:
    repo = extract("ISCA_AE", tmp_path)
    run = as_run(tmp_path, "isca-resnet18", repo, drop=("replay_inj_masked.txt",))
    from typer.testing import CliRunner

    from testbed.cli.typer_app import app

    r = CliRunner().invoke(app, ["report", str(run), "--json"])
    assert r.exit_code == 0, r.output
    verdicts = {v["metric"]: v for v in json.loads(r.output)["verdicts"]}
    assert verdicts["masked outcome"]["status"] == NOT_MEASURED
    assert verdicts["masked outcome"]["ours"] is None and "no outcome where run=inj_masked" in \
        verdicts["masked outcome"]["note"]
    assert verdicts["immediate NaN step"]["status"] == WITHIN
    assert verdicts["immediate NaN step"]["hardware"] == "reference: TPU v2-8; ours: not recorded in the manifest"


def test_every_shipped_suite_loads() -> None:
    for name in list_suites():
        load_suite(name)


def test_isca_campaign_report_opens_with_its_verdicts(tmp_path: Path) -> None:
    from testbed.report.folders import report_suite_folder

    repo = extract("ISCA_AE", tmp_path)
    fi, tech = repo / "fault_injection", repo / "technique"
    files = {"inj_immediate_infs_nans": [fi / "expected_results/replay_inj_immediate_infs_nans.txt",
                                         fi / "expected_results/fault_free.txt",
                                         fi / "injections/inj_immediate_infs_nans.csv"],
             "inj_masked": [fi / "expected_results/replay_inj_masked.txt", fi / "injections/inj_masked.csv"],
             "inj_slow_degrade": [fi / "expected_results/replay_inj_slow_degrade.txt",
                                  fi / "injections/inj_slow_degrade.csv"],
             "detection": list((tech / "detection/expected_results").glob("*.txt")),
             "replay": list((tech / "replay/expected_result").glob("*.txt"))}
    suite_dir = tmp_path / "results" / "isca-resnet18"
    for i, (exp, paths) in enumerate(files.items()):
        run = suite_dir / f"isca-{i}"
        (run / "node0").mkdir(parents=True)
        for p in paths:
            shutil.copy(p, run / "node0" / p.name)
        (run / "manifest.json").write_text(json.dumps({
            "suite": "isca-resnet18", "run_id": f"isca-{i}", "status": "succeeded", "params": {"experiment": exp},
            "started": f"2025-01-01T00:0{i}:00+00:00", "hosts": [{"name": "node0", "facts": {"cpus": 96, "gpus": [],
                                                                                             "tpu": "v2-8"}}]}))
    res = report_suite_folder(suite_dir, "html")
    assert len(res.verdicts) == 12 and all(v.status == WITHIN for v in res.verdicts), \
        [(v.metric, v.ours, v.note) for v in res.verdicts if v.status != WITHIN]
    assert all(v.hardware == "" for v in res.verdicts)  # the same TPU type: no difference to name
    text = res.path.read_text()
    assert text.index('id="verdicts"') < text.index('id="checks"') < text.index('id="details"')


def test_an_outcome_that_needs_a_fault_free_run_is_not_measured_without_one(tmp_path: Path) -> None:
    """One point's run folder (inj_slow_degrade's, as a point run alone made it before each point made its own
    fault-free run): Degraded means "significantly lower than the error-free run's", so with no fault-free run the
    outcome is unclassified and its verdict not measured, never "outside tolerance" on a class never compared."""
    repo = extract("ISCA_AE", tmp_path)
    fi = repo / "fault_injection"
    point = tmp_path / "point"
    point.mkdir()
    shutil.copy(fi / "expected_results" / "replay_inj_slow_degrade.txt", point)
    shutil.copy(fi / "injections" / "inj_slow_degrade.csv", point)
    res = build_report(as_run(tmp_path, "isca-resnet18", point), "html")
    v = {x.metric: x for x in res.verdicts}["slow-degrade outcome"]
    assert v.status == NOT_MEASURED and v.ours is None, (v.ours, v.note)
    assert any("inj_slow_degrade: outcome not classified: it needs a fault-free run" in s for s in res.skipped), \
        res.skipped
    shutil.copy(fi / "expected_results" / "fault_free.txt", point / "replay_fault_free.txt")  # its own, as now
    rerun = build_report(as_run(tmp_path / "again", "isca-resnet18", point), "html")
    assert {x.metric: x for x in rerun.verdicts}["slow-degrade outcome"].status == WITHIN
