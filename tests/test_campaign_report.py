"""Campaign reports and the results index, on multi-run results folders laid out as collect writes them from the
real artifact outputs in ../shared/fixtures (skipped when absent), checked against the artifacts' own scripts:
the OSRE graphers (run with a sitecustomize that dumps what they plot) and the ISCA calc_overhead.py."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from testbed.errors import UsageError
from testbed.report.folders import build_index, report_path

FIX = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
if not FIX.is_dir():
    FIX = Path("/work/shared/fixtures")
DS, TESLA, ISCA = FIX / "datastall", FIX / "tesla", FIX / "isca"
DS_HOME = "@home/gpufs/emulator/datastall"
FIG3 = ["shufflenet_v2_x0_5", "alexnet", "resnet18", "squeezenet1_0", "squeezenet1_1", "mobilenet_v2", "resnet50",
        "vgg11"]  # the order of outputsfig3/parser.py, parsed_output.txt and time3.dat
FIG5 = ["alexnet", "resnet18", "mobilenet_v2", "resnet50"]
WORKERS = [1, 2, 3, 6, 12, 24]


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"fixture {path} not present")
    return path


def write_run(root: Path, suite: str, run_id: str, params: dict, files: dict[str, bytes | str | Path],
              campaign: str | None = None, status: str = "succeeded") -> Path:
    """``root/<suite>/<run_id>/`` with a manifest and node0's files (paths relative to the host folder)."""
    run = root / suite / run_id
    listed = []
    for rel, content in files.items():
        dest = run / "node0" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, dest)
        else:
            dest.write_bytes(content.encode() if isinstance(content, str) else content)
        listed.append({"host": "node0", "path": rel, "sha256": "0" * 64, "size": dest.stat().st_size})
    man = {"schema": 1, "run_id": run_id, "suite": suite, "params": params, "status": status,
           "testbed": {"name": "lab1", "provider": "lab"},
           "hosts": [{"name": "node0", "address": "10.0.0.1", "exit_code": 0, "status": status}],
           "started": f"2025-01-01T00:{len(list(root.rglob('manifest.json'))) % 60:02d}:00+00:00",
           "ended": "2025-01-01T01:00:00+00:00", "events": [], "files": listed}
    if campaign:
        man["campaign"] = campaign
    (run / "manifest.json").write_text(json.dumps(man))
    return run


def emulator_output(epochs: list[str], batches: int = 3) -> str:
    """An emulator stdout whose epochs end on the given cumulative-totals lines (as the real one prints them)."""
    lines = ["We don't find the matching batch size 256. Using other batch size to estimate...",
             "batch_size: 256\t batch_cpu2gpu_time: 0.0128\t batch_gpu_compute_time: 1.504"]
    for totals in epochs:
        final = [float(x) for x in totals.split()]
        for b in range(batches):
            lines.append(f"batch {b} \t data_time: 0.1 \t cpu2gpu_time: 0.01 \t gpu_time: 0.2")
            lines.append(totals.strip() if b == batches - 1 else " ".join(str(v * (b + 1) / batches) for v in final))
    return "\n".join(lines) + "\n"


def _lines(path: Path) -> list[str]:
    return [ln for ln in need(path).read_text().splitlines() if ln.strip()]


def datastall_campaign(root: Path, cid: str = "datastall-emulator-0f0f0f0f") -> Path:
    """Every point of figures 3, 3-100, 4(a), 5 and 6 as separate runs, from the artifact's real outputs: the raw
    resnet18 figure-3 outputs and output22g.txt as they are, the other points as emulator outputs ending on the
    lines the artifact's parser.py took from the real ones (parsed_output*.txt)."""
    p3, p100 = _lines(DS / "outputsfig3/parsed_output.txt"), _lines(DS / "outputsfig3/parsed_output_100.txt")
    p4, p5, p6 = (_lines(DS / f"outputsfig{n}/parsed_output.txt") for n in (4, 5, 6))
    base = {"gpu_type": "p100", "gpu_count": 8, "batch": 256}
    for i, model in enumerate(FIG3):
        raw = model == "resnet18"
        write_run(root, "datastall-emulator", f"ds-3-{model}", {**base, "figure": "3", "model": model, "epochs": 2}, {
            f"{DS_HOME}/outputsfig3/output{model}.txt": DS / "outputsfig3/outputresnet18.txt" if raw
            else emulator_output([p3[i], p3[i]]),
            **({f"{DS_HOME}/outputsfig3/cache_resultresnet18.txt": DS / "outputsfig3/cache_resultresnet18.txt"}
               if raw else {})}, cid)
        write_run(root, "datastall-emulator", f"ds-3-100-{model}",
                  {**base, "figure": "3-100", "model": model, "mem_limit": "30g", "epochs": 1}, {
                      f"{DS_HOME}/outputsfig3/output_100{model}.txt": DS / "outputsfig3/output_100resnet18.txt"
                      if raw else emulator_output([p100[i]]),
                      f"{DS_HOME}/outputsfig3/output_fill_cache.txt": emulator_output([p100[i]])}, cid)
    for i, limit in enumerate(range(6, 17, 2)):
        write_run(root, "datastall-emulator", f"ds-4-{limit}g",
                  {**base, "figure": "4", "model": "resnet18", "gpu_type": "v100", "mem_limit": f"{limit}g"},
                  {f"{DS_HOME}/outputsfig4/output{limit}g.txt": emulator_output([p4[2 * i], p4[2 * i + 1]])}, cid)
    write_run(root, "datastall-emulator", "ds-4-22g", {**base, "figure": "4", "model": "resnet18", "mem_limit": "22g"},
              {f"{DS_HOME}/outputsfig4/output22g.txt": DS / "outputsfig4/output22g.txt"}, cid)
    for m, model in enumerate(FIG5):
        for w, workers in enumerate(WORKERS):
            write_run(root, "datastall-emulator", f"ds-5-{model}-{workers}",
                      {**base, "figure": "5", "model": model, "workers": workers, "gpu_count": 1, "epochs": 1},
                      {f"{DS_HOME}/outputsfig5/output_{model}{workers}.txt":
                       emulator_output([p5[m * 6 + w]], batches=342)}, cid)
    for m, model in enumerate(FIG5):
        write_run(root, "datastall-emulator", f"ds-6-{model}", {**base, "figure": "6", "model": model, "workers": 24},
                  {f"{DS_HOME}/outputsfig6/output_{model}.txt": emulator_output([p6[m]])}, cid)
    return root / "datastall-emulator"


def read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))


# --- the artifacts' own scripts, run for real --------------------------------------------------------------------
DUMPER = r'''
import json, os
import matplotlib
matplotlib.use("Agg")
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

CALLS = []
_bar, _plot, _save = Axes.bar, Axes.plot, Figure.savefig


def _seq(values, n=None):
    arr = np.asarray(values, dtype=object).ravel()
    if n is not None and arr.size == 1:
        arr = np.repeat(arr, n)
    return [str(v) if isinstance(v, str) else float(v) for v in arr]


def bar(self, x, height, *args, **kw):
    xs = _seq(x)
    CALLS.append({"kind": "bar", "x": xs, "height": _seq(height, len(xs)), "label": kw.get("label")})
    return _bar(self, x, height, *args, **kw)


def plot(self, *args, **kw):
    if len(args) >= 2 and not isinstance(args[1], str):
        CALLS.append({"kind": "line", "x": _seq(args[0]), "y": _seq(args[1]), "label": kw.get("label")})
    return _plot(self, *args, **kw)


def savefig(self, *args, **kw):
    ticks = [[t.get_text() for t in ax.get_xticklabels()] for ax in self.axes]
    with open(os.environ["PLOT_DUMP"], "w") as fh:
        json.dump({"calls": CALLS, "xticklabels": ticks}, fh)
    return _save(self, *args, **kw)


Axes.bar, Axes.plot, Figure.savefig = bar, plot, savefig
'''


def run_grapher(tmp_path: Path, figure_dir: str, script: str) -> dict:
    """Run the artifact's grapher in a copy of its folder holding the committed .dat inputs (the real ones from
    ../shared/fixtures); return what it plotted."""
    from artifacts import artifact

    src = artifact("OSRE_DELIVERABLE") / "make_figures" / figure_dir
    work = tmp_path / "grapher" / figure_dir
    shutil.copytree(src, work)
    for dat in need(DS / "make_figures" / figure_dir).glob("*.dat"):
        shutil.copyfile(dat, work / dat.name)
    (tmp_path / "grapher" / "sitecustomize.py").write_text(DUMPER)
    dump = work / "plotted.json"
    env = {**os.environ, "MPLBACKEND": "Agg", "PLOT_DUMP": str(dump), "PYTHONPATH": str(tmp_path / "grapher")}
    proc = subprocess.run([sys.executable, script], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(dump.read_text())


@pytest.fixture(scope="module")
def ds_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The datastall campaign report of every figure point (built once for the module)."""
    root = tmp_path_factory.mktemp("results")
    folder = datastall_campaign(root)
    res = report_path(folder)
    assert res.path == folder / "report" / "report.md"
    return res.path.parent


def test_fig3_grapher_agrees_with_campaign(tmp_path, ds_report):
    plotted = run_grapher(tmp_path, "make_graph_fig3", "grapher.py")
    bars = [c for c in plotted["calls"] if c["kind"] == "bar"]
    assert len(bars) == 1
    by_model = {x.split("\n")[0]: (x.split("\n")[1], h) for x, h in zip(bars[0]["x"], bars[0]["height"], strict=True)}
    assert list(by_model) == FIG3
    ours = {r["model"]: r for r in read_csv(ds_report / "fig3_fetch_stall.csv")}
    assert set(ours) == set(FIG3)
    for model, (cache, pct) in by_model.items():  # time3.dat holds 4 decimals of the fraction
        assert float(ours[model]["fetch_stall_fraction"]) * 100 == pytest.approx(pct, abs=0.006), model
    assert ours["resnet18"]["cached_pct"] == by_model["resnet18"][0] == "37.8"  # vmtouch vs cache.dat


def test_fig4a_grapher_agrees_with_campaign(tmp_path, ds_report):
    plotted = run_grapher(tmp_path, "make_graph_fig4", "grapher_a.py")
    bars = {c["label"]: c["height"] for c in plotted["calls"] if c["kind"] == "bar"}
    labels = [t.replace("\n", " ") for t in plotted["xticklabels"][0]]
    assert labels == ["22% 6g", "40% 8g", "59% 10g", "77% 12g", "96% 14g", "100% 16g"]
    ours = read_csv(ds_report / "fig4a_breakdown.csv")
    assert [float(r["limit_gb"]) for r in ours] == [6, 8, 10, 12, 14, 16]  # 22g has no epoch 2: left out
    for key, col in (("fetch stall time", "fetch_s"), ("CPU to GPU transfer time", "transfer_s"),
                     ("GPU compute time", "compute_s")):
        assert [float(r[col]) for r in ours] == pytest.approx(bars[key], abs=1e-6), key


def test_fig5_grapher_agrees_with_campaign_up_to_the_sheets_image_count(tmp_path, ds_report):
    plotted = run_grapher(tmp_path, "make_graph_fig5", "grapher.py")
    lines = {c["label"]: c for c in plotted["calls"] if c["kind"] == "line"}
    assert list(lines) == ["alexnet", "renet18", "mobilenet_v2", "resnet50"]  # sic: the grapher's label
    ours = read_csv(ds_report / "fig5_throughput.csv")
    for model, label in zip(FIG5, lines, strict=True):
        rows = sorted((r for r in ours if r["model"] == model), key=lambda r: int(r["workers"]))
        assert [int(r["workers"]) for r in rows] == lines[label]["x"] == WORKERS
        assert [float(r["artifact_images_per_s"]) for r in rows] == pytest.approx(lines[label]["y"], abs=2e-3)
        # the true rate: every epoch reads 342 batches of 256, not the sheet's 13,395 images
        for r in rows:
            assert int(r["images"]) == 342 * 256
            assert float(r["images_per_s"]) == pytest.approx(float(r["artifact_images_per_s"]) * 342 * 256 / 13395)


def test_fig6_grapher_plots_a_sheet_the_outputs_do_not_give(tmp_path, ds_report):
    plotted = run_grapher(tmp_path, "make_graph_fig6", "grapher.py")
    bars = next(c for c in plotted["calls"] if c["kind"] == "bar")
    assert bars["x"] == FIG5 and bars["height"] == pytest.approx([76.60, 33.69, 46.59, 2.01])
    ours = {r["model"]: float(r["prep_stall_pct"]) for r in read_csv(ds_report / "fig6_prep_stall.csv")}
    for model, line in zip(FIG5, _lines(DS / "outputsfig6/parsed_output.txt"), strict=True):
        d, c, g = (float(x) for x in line.split())
        assert ours[model] == pytest.approx(100 * d / (d + c + g))
    assert all(abs(ours[m] - h) > 0.5 for m, h in zip(FIG5, bars["height"], strict=True))
    assert "time6.dat" in (ds_report / "report.md").read_text()  # the report says why they differ


def test_datastall_campaign_names_missing_points(ds_report):
    missing = read_csv(ds_report / "missing_points.csv")
    assert [(r["series"], r["point"]) for r in missing] == [("4", "22g")]
    assert "KeyboardInterrupt" in missing[0]["problem"]
    md = (ds_report / "report.md").read_text()
    assert "| every point of the figures run is present | FAIL |" in md
    assert md.count("[ds-") == 0 and "ds-5-resnet50-24" in md  # runs listed (no per-run reports built yet)


def test_datastall_partial_campaign(tmp_path):
    root = tmp_path / "results"
    write_run(root, "datastall-emulator", "r1", {"figure": "3", "model": "resnet18"},
              {f"{DS_HOME}/outputsfig3/outputresnet18.txt": need(DS / "outputsfig3/outputresnet18.txt")})
    p4 = _lines(DS / "outputsfig4/parsed_output.txt")
    write_run(root, "datastall-emulator", "r2", {"figure": "4", "model": "resnet18", "mem_limit": "6g"},
              {f"{DS_HOME}/outputsfig4/output6g.txt": emulator_output(p4[0:2]),
               # a later run's output collected with this one (outputs are globbed by time): not r2's point
               f"{DS_HOME}/outputsfig4/output16g.txt": emulator_output([p4[0], p4[0]])})
    write_run(root, "datastall-emulator", "r3", {"figure": "4", "model": "resnet18", "mem_limit": "16g"},
              {f"{DS_HOME}/outputsfig4/output16g.txt": emulator_output(p4[10:12])})
    res = report_path(root / "datastall-emulator")
    out = res.path.parent
    missing = {(r["series"], r["point"]): r["problem"] for r in read_csv(out / "missing_points.csv")}
    assert missing[("3-100", "resnet18")] == "no run"
    assert {k[1] for k in missing if k[0] == "4"} == {"8g", "10g", "12g", "14g"}
    assert not any(k[0] in ("5", "6") for k in missing)
    assert "No run of figure(s) 5, 6" in res.path.read_text()
    fig4 = read_csv(out / "fig4a_breakdown.csv")  # 16g from r3 (its own point), not r2's copy
    assert float(fig4[0]["fetch_s"]) == pytest.approx(28.697439432144165 - 19.63715386390686)


# --- tesla --------------------------------------------------------------------------------------------------------
TESLA_POINTS = {"1_GPU/p1_b16_e10": (1, 1.0), "2_GPUs/p1_b16_e10": (2, 1.0), "5_GPUs/p1_b16_e10": (5, 1.0),
                "3_GPUs/p0.3_b16_e10": (3, 0.3)}


def tesla_campaign(root: Path, cid: str | None = "tesla-12345678") -> Path:
    for folder, (gpus, frac) in TESLA_POINTS.items():
        src = need(TESLA / "log" / folder)
        files: dict[str, bytes | str | Path] = {
            f"@home/Scalable_ViT_DT/tesla/log/{folder}/{p.name}": p for p in sorted(src.iterdir())}
        write_run(root, "tesla", f"tesla-{gpus}-{frac:g}", {"task": "train", "gpus": gpus, "dataset_percentage": frac,
                                                           "epochs": 10, "micro_batch": 16}, files, cid)
    return root / "tesla"


def test_tesla_campaign_scaling(tmp_path):
    folder = tesla_campaign(tmp_path / "results")
    res = report_path(folder)
    out = res.path.parent
    from statistics import fmean

    def mean_epoch(folder: str) -> float:
        return fmean(float(r["Computation_Time"]) for r in read_csv(TESLA / "log" / folder / "metrics.csv"))

    rows = {(r["kind"], int(r["gpus"])): r for r in read_csv(out / "scaling.csv")}
    t1 = mean_epoch("1_GPU/p1_b16_e10")
    for n, folder in ((1, "1_GPU/p1_b16_e10"), (2, "2_GPUs/p1_b16_e10"), (5, "5_GPUs/p1_b16_e10")):
        tn = mean_epoch(folder)
        assert float(rows[("strong", n)]["mean_epoch_s"]) == pytest.approx(tn)
        assert float(rows[("strong", n)]["speedup_vs_1"]) == pytest.approx(t1 / tn)
        assert float(rows[("strong", n)]["efficiency"]) == pytest.approx(t1 / n / tn)
    assert float(rows[("weak", 3)]["mean_epoch_s"]) == pytest.approx(mean_epoch("3_GPUs/p0.3_b16_e10"))
    assert rows[("weak", 3)]["speedup_vs_1"] == ""  # no 1-GPU p0.1 run: no base
    missing = {(r["kind"], int(r["gpus"])) for r in read_csv(out / "missing_points.csv")}
    assert missing == {("strong", 3), ("strong", 4), ("weak", 1), ("weak", 2), ("weak", 4), ("weak", 5)}
    assert {"strong_scaling.png", "weak_scaling.png"} <= {p.name for p in res.figures}
    assert ("every scaling point is present", False) == res.checks[-1][:2]


# --- isca ---------------------------------------------------------------------------------------------------------
def isca_campaign(root: Path, cid: str | None = "isca-resnet18-abcdef01") -> Path:
    exp = need(ISCA / "fault_injection/expected_results")
    for name in ("inj_immediate_infs_nans", "inj_masked", "inj_slow_degrade"):
        write_run(root, "isca-resnet18", f"isca-{name}", {"experiment": name}, {
            f"@home/ISCA_AE/runs/replay_{name}.txt": exp / f"replay_{name}.txt",
            f"replay_{name}.txt": exp / f"replay_{name}.txt", "fault_free.txt": exp / "fault_free.txt",
            f"{name}.csv": ISCA / f"fault_injection/injections/{name}.csv"}, cid)
    tech = {"detection": ISCA / "technique/detection/expected_results",
            "replay": ISCA / "technique/replay/expected_result"}
    for name, src in tech.items():
        write_run(root, "isca-resnet18", f"isca-{name}", {"experiment": name},
                  {p.name: p for p in sorted(need(src).glob("train_recorder_*.txt"))}, cid)
    return root / "isca-resnet18"


def calc_overhead(tmp_path: Path, technique: str, expected: str) -> str:
    """Run the artifact's calc_overhead.py on the expected train_recorder files; its printed percentage."""
    from artifacts import artifact

    work = tmp_path / technique
    work.mkdir()
    shutil.copyfile(artifact("ISCA_AE") / "technique" / technique / "calc_overhead.py", work / "calc_overhead.py")
    for p in need(ISCA / "technique" / technique / expected).glob("train_recorder_*.txt"):
        shutil.copyfile(p, work / p.name)
    out = subprocess.run([sys.executable, "calc_overhead.py"], cwd=work, capture_output=True, text=True, check=True)
    m = re.fullmatch(r"Overhead: ([0-9.]+)%\s*", out.stdout)
    assert m, out.stdout
    return m[1]


def test_isca_campaign_outcomes_and_calc_overhead(tmp_path):
    folder = isca_campaign(tmp_path / "results")
    res = report_path(folder)
    out = res.path.parent
    outcomes = {r["injection"]: r for r in read_csv(out / "outcomes.csv")}
    assert {k: (v["outcome"], v["matches"]) for k, v in outcomes.items()} == {
        "inj_immediate_infs_nans": ("Immediate INFs/NaNs", "True"), "inj_masked": ("Masked", "True"),
        "inj_slow_degrade": ("Degraded", "True")}
    assert outcomes["inj_immediate_infs_nans"]["first_nonfinite_at"] == "19/38"
    counts = {r["outcome"]: (int(r["count"]), int(r["expected_count"])) for r in read_csv(out / "outcome_counts.csv")}
    assert counts == {"Immediate INFs/NaNs": (1, 1), "Masked": (1, 1), "Degraded": (1, 1)}
    over = {r["technique"]: float(r["overhead_pct"]) for r in read_csv(out / "overheads.csv")}
    assert f"{over['detection']:.4f}" == calc_overhead(tmp_path, "detection", "expected_results") == "0.0157"
    assert f"{over['replay']:.2f}" == calc_overhead(tmp_path, "replay", "expected_result") == "0.12"
    assert res.passed and read_csv(out / "missing_points.csv") == []
    assert any(p.name == "train_accuracy.png" for p in res.figures)
    # the per-run report of the detection run prints the same number
    from testbed.report.build import build_report

    one = build_report(folder / "isca-detection")
    assert any("0.0157%" in d for n, _, d in one.checks if n.startswith("detection"))


# --- index, folders that are not runs, errors, the CLI ------------------------------------------------------------
def results_tree(root: Path) -> Path:
    tesla_campaign(root)
    isca_campaign(root, cid=None)
    shutil.copytree(need(TESLA / "log"), root / "tesla" / "log")  # an artifact's committed log/ beside the runs
    (root / "stray").mkdir()
    (root / "stray" / "notes.txt").write_text("not a run")
    return root


@pytest.mark.slow
def test_index_of_everything_skips_what_is_not_a_run(tmp_path):
    root = results_tree(tmp_path / "results")
    bad = root / "isca-resnet18" / "isca-broken"
    bad.mkdir()
    (bad / "manifest.json").write_text("{ cut off")
    res = build_index(root)
    assert [p.name for p in res.paths] == ["index.md", "index.html"]
    assert len(res.runs) == 9 and all(r["report"] for r in res.runs)
    skipped = dict(res.skipped)
    assert skipped["tesla/log/"].startswith("no manifest.json") and "stray/" in skipped
    assert "not JSON" in skipped["isca-resnet18/isca-broken/"]
    md = (root / "index.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", md)
    assert links and all((root / link).is_file() for link in links)
    assert "tesla/tesla-1-1/report/report.md" in links and "tesla/campaign-tesla-12345678/report.md" in links
    assert "isca-resnet18/report/report.md" in links and "tesla/report/report.md" in links
    html = (root / "index.html").read_text()
    assert '<a href="tesla/tesla-2-1/report/report.md">tesla-2-1</a>' in html
    # built twice: the report/ and campaign-*/ folders it wrote are never taken for runs
    again = build_index(root)
    assert len(again.runs) == 9
    why = dict(again.skipped)
    assert why["tesla/report/"] == why["tesla/campaign-tesla-12345678/"] == "a report folder written by testbed"
    # a suite folder holding an unreadable manifest: one clear error
    with pytest.raises(UsageError, match="unreadable run manifest") as exc:
        report_path(root / "isca-resnet18")
    assert exc.value.where == str(bad / "manifest.json")


def test_campaign_from_state(tmp_path, tb_home):
    root = isca_campaign(tmp_path / "results", cid=None).parent
    from testbed.state import Store

    st = Store.open_default()
    with st.tx() as db:
        db.execute("INSERT INTO campaigns(id, suite, testbed, points, status, created, info) VALUES (?,?,?,?,?,?,?)",
                   ("isca-resnet18-00000001", "isca-resnet18", "tpu", json.dumps(
                       [{"params": {"experiment": e}, "run_id": f"isca-{e}", "status": "succeeded"}
                        for e in ("inj_masked", "detection")]), "done", 0.0, "{}"))
    st.close()
    res = report_path(root, campaign="isca-resnet18-00000001")
    assert res.path == root / "isca-resnet18" / "campaign-isca-resnet18-00000001" / "report.md"
    assert sorted(res.runs) == ["isca-detection", "isca-inj_masked"]
    missing = {r["experiment"] for r in read_csv(res.path.parent / "missing_points.csv")}
    assert missing == {"inj_immediate_infs_nans", "inj_slow_degrade", "replay"}


def _app():
    import typer

    from testbed.cli import collect as cli_collect

    app = typer.Typer()
    cli_collect.register(app)
    return app


@pytest.mark.slow
def test_cli_campaign_index_and_errors(tmp_path, tb_home):
    root = results_tree(tmp_path / "results")
    runner = CliRunner()
    r = runner.invoke(_app(), ["report", str(root / "tesla"), "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    out = json.loads(r.stdout)
    assert out["path"] == str(root / "tesla/report/report.md") and len(out["runs"]) == 4
    assert any("log/" in s and "no manifest.json" in s for s in out["skipped"])
    r = runner.invoke(_app(), ["report", str(root), "--campaign", "tesla-12345678", "--format", "html"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert f"report: {root}/tesla/campaign-tesla-12345678/report.html (4 runs)" in r.stdout
    r = runner.invoke(_app(), ["report", str(root)])
    assert r.exit_code == 0, (r.output, r.exception)
    assert f"index: {root}/index.md" in r.stdout and "skipped: stray/" in r.stdout
    r = runner.invoke(_app(), ["report", str(root), "--campaign", "nope-1"])
    assert isinstance(r.exception, UsageError) and "tesla-12345678" in (r.exception.fix or "")
    (tmp_path / "empty" / "log").mkdir(parents=True)
    r = runner.invoke(_app(), ["report", str(tmp_path / "empty")])
    assert isinstance(r.exception, UsageError) and "no collected runs" in r.exception.what
    assert "log/" in r.exception.what
    # the real command line: one message, exit code 2, no traceback
    exe = Path(sys.executable).parent / "testbed"
    if exe.is_file():
        proc = subprocess.run([str(exe), "report", str(tmp_path / "empty")], capture_output=True, text=True,
                              env={**os.environ, "TESTBED_HOME": str(tb_home / ".testbed")})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout
        assert "no collected runs" in proc.stderr + proc.stdout
