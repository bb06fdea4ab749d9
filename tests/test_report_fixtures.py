"""Report parsers and formulas against the real artifact outputs in ../shared/fixtures (skipped when absent)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testbed.report.build import build_report

FIX = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
if not FIX.is_dir():
    FIX = Path("/work/shared/fixtures")
DS = FIX / "datastall"


def _own(suite: str):  # type: ignore[no-untyped-def]
    """The module of the suite folder's report.py, loaded as testbed loads it."""
    import sys

    from testbed import results

    own = results.load(Path(__file__).resolve().parents[1] / "experiments" / suite / "report.py")
    assert own.reporter is not None
    return sys.modules[own.reporter.fn.__module__]


# datastall-emulator's parsers and arithmetic, read from its suite folder's report.py as testbed loads it
_DS = _own("datastall-emulator")
fetch_stall_fraction, fig4a, images_per_second = _DS.fetch_stall_fraction, _DS.fig4a, _DS.images_per_second
parse_emulator_output, parse_totals_lines = _DS.parse_emulator_output, _DS.parse_totals_lines
lookup, parse_profile = _DS.lookup, _DS.parse_profile


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"fixture {path} not present")
    return path


def test_fig3_resnet18_from_raw_outputs():
    at35 = parse_emulator_output(need(DS / "outputsfig3/outputresnet18.txt"))
    at100 = parse_emulator_output(need(DS / "outputsfig3/output_100resnet18.txt"))
    assert [e.batches for e in at35.epochs] == [342, 342] and [e.batches for e in at100.epochs] == [342]
    assert round(fetch_stall_fraction(at35.final, at100.final), 4) == 0.0078


def test_fig3_shufflenet_from_parsed_totals():
    # parsed_output*.txt hold the final-totals line of each model's output; shufflenet is the first row
    at35, _ = parse_totals_lines(need(DS / "outputsfig3/parsed_output.txt"))
    at100, _ = parse_totals_lines(need(DS / "outputsfig3/parsed_output_100.txt"))
    assert round(fetch_stall_fraction(at35[0], at100[0]), 4) == 0.1540


def test_epoch_boundary_found_without_line_numbers():
    path = need(DS / "outputsfig3/outputresnet18.txt")
    out = parse_emulator_output(path)
    line690 = path.read_text().splitlines()[689].split()
    e1 = out.epoch_totals(1)
    assert [e1.data, e1.cpu2gpu, e1.gpu] == [float(x) for x in line690]
    assert out.final == out.epoch_totals(2)


def test_fig4a_fetch_from_epoch2_totals():
    totals, _ = parse_totals_lines(need(DS / "outputsfig4/parsed_output.txt"))
    # pairs of (epoch 1, epoch 2) totals per limit, smallest limit first, largest last
    rows = fig4a({6.0: totals[1], 16.0: totals[-1]})
    assert round(rows[0].fetch, 3) == 9.060
    assert round(totals[1].data, 3) == 28.697 and round(totals[-1].data, 3) == 19.637


def test_truncated_output22g_is_reported():
    out = parse_emulator_output(need(DS / "outputsfig4/output22g.txt"))
    assert out.interrupted == "KeyboardInterrupt"
    assert out.final is None and out.epochs[-1].last_batch == 73
    assert any("KeyboardInterrupt" in s and "batch 73" in s for s in out.skipped)


def test_fig5_sheet_is_images_over_total_time():
    totals, _ = parse_totals_lines(need(DS / "outputsfig5/parsed_output.txt"))
    sheet = [[float(x) for x in line.split()] for line in need(DS / "make_figures/make_graph_fig5/time5.dat")
             .read_text().splitlines() if line.strip()]
    for m in range(4):  # columns: alexnet, resnet18, mobilenet_v2, resnet50; rows: workers 1 2 3 6 12 24
        for w in range(6):
            assert images_per_second(totals[m * 6 + w], 13395) == pytest.approx(sheet[w][m], abs=2e-3)


def test_profile_scales_missing_batch_size():
    prof = parse_profile(need(DS / "profile.csv"))
    assert len(prof.rows) == 72
    c2g, comp = lookup(prof.rows, "p100", "resnet18", 256)
    assert c2g == pytest.approx(0.0128) and comp == pytest.approx(1.504)


def test_tesla_metrics_header():
    parse_metrics = _own("tesla").parse_metrics
    parsed = parse_metrics(need(FIX / "tesla/log/2_GPUs/p1_b16_e10/metrics.csv"))
    assert len(parsed.rows) == 20 and not parsed.skipped
    assert parsed.rows[0].gpu_load_pct == 80.0 and parsed.rows[0].computation_time == pytest.approx(912.3388719558716)


def _run_from(tmp_path: Path, src: Path, suite: str) -> Path:
    run = tmp_path / suite / "r1"
    shutil.copytree(need(src), run / "node0")
    (run / "manifest.json").write_text(json.dumps({"suite": suite, "run_id": "r1", "hosts": [{"name": "node0"}]}))
    return run


def test_isca_report_checks_match_paper(tmp_path):
    res = build_report(_run_from(tmp_path, FIX / "isca", "isca-resnet18"))
    checks = {name: (ok, detail) for name, ok, detail in res.checks}
    assert len(checks) == 5 and all(ok for ok, _ in checks.values()), checks
    assert "0.8884 vs 0.8936" in checks["inj_masked: final train accuracy within 2% of fault-free"][1]
    assert "0.4394" in checks["inj_slow_degrade: final train accuracy near 0.44 (much lower)"][1]
    assert "0.0157%" in checks["detection overhead below 0.025%"][1]
    assert "0.1200%" in checks["replay overhead below 0.15%"][1]
    assert len(res.figures) == 6


def test_datastall_report_on_fixtures(tmp_path):
    res = build_report(_run_from(tmp_path, DS, "datastall-emulator"))
    fig3 = (res.path.parent / "fig3_fetch_stall.csv").read_text().splitlines()
    assert fig3[1].startswith("resnet18,") and ",37.8" in fig3[1]
    assert any("output22g.txt" in s and "KeyboardInterrupt" in s for s in res.skipped)


def test_tesla_report_on_fixtures(tmp_path):
    res = build_report(_run_from(tmp_path, FIX / "tesla", "tesla"))
    names = {p.name for p in res.figures}
    assert {"strong_scaling.png", "epochs_2gpu_p1_b16_e10.png"} <= names
