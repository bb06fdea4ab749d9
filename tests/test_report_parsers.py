"""Report parsers against the hand-made samples in tests/samples/ (each includes a cut-off file)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

S = Path(__file__).parent / "samples"
ROOT = Path(__file__).resolve().parents[1]
DS = S / "datastall"


def _report_py(suite: str):
    """The suite folder's report.py, loaded as testbed loads it (by path, through testbed.results)."""
    from testbed import results

    return results.load(ROOT / "experiments" / suite / "report.py")


def _own(suite: str):
    """The module of the suite folder's report.py as testbed loaded it (its parsers and helpers)."""
    import sys

    own = _report_py(suite)
    assert own.reporter is not None
    return sys.modules[own.reporter.fn.__module__]


# datastall-emulator's parsers and arithmetic, read from its suite folder's report.py as testbed loads it
_DS = _own("datastall-emulator")
classify, fetch_stall_fraction, fig4a = _DS.classify, _DS.fetch_stall_fraction, _DS.fig4a
images_per_second, prep_stall_pct, parse_batch_csv = _DS.images_per_second, _DS.prep_stall_pct, _DS.parse_batch_csv
parse_emulator_output, lookup, parse_profile = _DS.parse_emulator_output, _DS.lookup, _DS.parse_profile
parse_vmtouch = _DS.parse_vmtouch


# --- local suites -------------------------------------------------------------------------------------------

def test_train_log_truncated_last_line_is_skipped():
    parse_train_log = _own("fault-drill").parse_train_log
    full = parse_train_log(S / "fault-drill/node0/train_log.csv")
    cut = parse_train_log(S / "fault-drill/node1/train_log.csv")
    assert len(full.rows) == 11 and not full.skipped
    assert len(cut.rows) == 11
    assert len(cut.skipped) == 1 and "train_log.csv:13" in cut.skipped[0] and "short row" in cut.skipped[0]
    assert {r.attempt for r in full.rows} == {0, 1}


def test_train_log_from_text_and_header_in_any_order():
    parse_train_log, TrainRow = _own("fault-drill").parse_train_log, _own("fault-drill").TrainRow
    parsed = parse_train_log("loss,step,epoch,attempt,time\n1.5,3,0,0,10.0\n")
    assert parsed.rows == [TrainRow(10.0, 0, 0, 3, 1.5)]
    assert "header lacks" in parse_train_log("a,b\n1,2\n").skipped[0]


def test_global_steps_per_epoch_and_global():
    TrainRow, global_steps = _own("fault-drill").TrainRow, _own("fault-drill").global_steps
    per_epoch = [TrainRow(i, 0, i // 3, i % 3, 1.0) for i in range(6)]
    assert global_steps(per_epoch) == [0, 1, 2, 3, 4, 5]
    glob = [TrainRow(i, 0, i // 3, i, 1.0) for i in range(6)]
    assert global_steps(glob) == list(range(6))




def test_matmul_report_py_reads_each_ranks_csv_and_notes_bad_rows(tmp_path):
    """matmul-baseline's reporter lives in its suite folder: per-rank rows, medians, a figure, and a row with a
    bad value skipped with a note (testbed.results API 2: csv_rows, boxes)."""
    from testbed.report.model import Report
    from testbed.report.rundir import RunDir

    own = _report_py("matmul-baseline")
    assert own.reporter is not None and own.reporter.tables == ("matmul", "matmul_median")
    run = tmp_path / "run"
    (run / "node1").mkdir(parents=True)
    (run / "manifest.json").write_text('{"suite": "matmul-baseline", "run_id": "r1", "status": "succeeded", '
                                       '"params": {"ranks": 2}}')
    text = (S / "matmul-baseline/node1/matmul_rank1.csv").read_text()
    (run / "node1" / "matmul_rank1.csv").write_text(text + "1,node1,9,256,oops,1.0\n")
    rep = Report(tmp_path / "out", "t")
    own.reporter.fn(RunDir.open(run), rep)
    rows = next(t for t in rep.tables if t.name == "matmul").rows
    assert len(rows) == 5 and rows[0][:2] == [1, "node1"] and rows[0][4] == pytest.approx(0.2)
    assert any("bad value" in s and "oops" in s for s in rep.skipped), rep.skipped
    assert ("every rank reported", False, "1 of 2 ranks; missing [0]") in rep.checks
    assert [f.name for f in rep.figures] == ["matmul_seconds"]


def test_mpi_hello_report_py_loaded_as_testbed_loads_it(tmp_path):
    """mpi-hello's reporter lives in its suite folder (experiments/mpi-hello/report.py), loaded by path through
    the public API (testbed.results), as testbed loads it for a report."""
    from testbed.report.model import Report
    from testbed.report.rundir import RunDir

    own = _report_py("mpi-hello")
    assert own.reporter is not None and own.reporter.tables == ("hello",) and not own.parsers
    run = tmp_path / "run"
    (run / "node0").mkdir(parents=True)
    (run / "manifest.json").write_text('{"suite": "mpi-hello", "run_id": "r1", "status": "succeeded"}')
    (run / "node0" / "stdout.log").write_text((S / "mpi-hello/stdout.log").read_text())
    rep = Report(tmp_path / "out", "t")
    own.reporter.fn(RunDir.open(run), rep)
    hello = next(t for t in rep.tables if t.name == "hello")
    assert sorted(r[3] for r in hello.rows) == [0, 1, 2] and {r[4] for r in hello.rows} == {3}
    assert ("all ranks answered", True, "3 of 3 ranks") in rep.checks


# --- isca ---------------------------------------------------------------------------------------------------

def test_isca_replay_nan_and_injection_facts():
    parse_replay = _own("isca-resnet18").parse_replay
    log = parse_replay(S / "isca/replay_inj_tiny_infs_nans.txt")
    assert log.nan_terminated
    bad = log.first_nonfinite
    assert bad is not None and (bad.epoch, bad.step) == (2, 1) and math.isnan(bad.loss)
    assert log.info["Inject layer"] == "conv1" and log.info["Load weights from"] == "CKPT/epoch_1"
    assert not log.skipped


def test_isca_replay_cut_off_line_is_skipped():
    parse_replay = _own("isca-resnet18").parse_replay
    log = parse_replay(S / "isca/replay_inj_tiny_masked.txt")
    assert log.final is not None and log.final.train_accuracy == pytest.approx(0.79)
    assert len(log.skipped) == 1 and "loss: 0.5" in log.skipped[0]


def test_isca_injection_and_elapsed():
    loaded = _report_py("isca-resnet18")  # a run reporter and a campaign reporter (API 3), one file
    assert loaded.campaign is not None and {"outcomes", "outcome_counts"} <= set(loaded.campaign.tables)
    assert loaded.reporter is not None and "replay_outcomes" in loaded.reporter.tables
    own = _own("isca-resnet18")
    parse_injection, parse_elapsed, overhead_pct = own.parse_injection, own.parse_elapsed, own.overhead_pct
    spec = parse_injection(S / "isca/inj_tiny_infs_nans.csv")
    assert spec.meta["target_epoch"] == 2 and spec.meta["target_step"] == 1 and spec.meta["fmodel"] == "RD"
    assert len(spec.rows) == 11
    assert parse_elapsed(S / "isca/train_recorder_check.txt").rows == [11.0]
    assert parse_elapsed("nothing here").skipped
    assert overhead_pct(10.0, 11.0, 10000) == pytest.approx(0.001)


# --- datastall ----------------------------------------------------------------------------------------------

def test_emulator_output_epochs_and_totals():
    out = parse_emulator_output(DS / "outputsfig3/outputtinynet.txt")
    assert out.batch_size == 128 and out.batch_gpu_compute_time == 0.5
    assert [e.batches for e in out.epochs] == [3, 3] and all(e.complete for e in out.epochs)
    e1 = out.epoch_totals(1)
    assert e1 is not None and e1.data == pytest.approx(3.0)
    assert out.final is not None and out.final.total == pytest.approx(10.0)
    assert len(out.rows) == 6 and out.rows[3].epoch == 2 and out.rows[3].batch == 0
    assert not out.skipped


def test_emulator_output_interrupted_file():
    out = parse_emulator_output(DS / "outputsfig4/output22g.txt")
    assert out.interrupted == "KeyboardInterrupt"
    assert len(out.epochs) == 2 and out.epochs[0].complete and not out.epochs[1].complete
    assert out.epoch_totals(2) is None and out.final == out.epoch_totals(1)
    assert any("epoch 2 incomplete" in s and "KeyboardInterrupt" in s for s in out.skipped)


def test_fig3_fig4_fig5_fig6_math_on_samples():
    at35 = parse_emulator_output(DS / "outputsfig3/outputtinynet.txt").final
    at100 = parse_emulator_output(DS / "outputsfig3/output_100tinynet.txt").final
    assert fetch_stall_fraction(at35, at100) == pytest.approx(0.2)
    e2 = {lim: parse_emulator_output(DS / f"outputsfig4/output{lim:g}g.txt").epoch_totals(2) for lim in (6.0, 16.0)}
    rows = fig4a(e2)
    assert [r.limit_gb for r in rows] == [6.0, 16.0]
    assert rows[0].fetch == pytest.approx(4.0) and rows[1].fetch == 0
    assert rows[0].transfer == pytest.approx(0.5) and rows[0].compute == pytest.approx(4.0)
    out = parse_emulator_output(DS / "outputsfig5/output_resnet181.txt")
    assert images_per_second(out.final, 3 * 128) == pytest.approx(384 / 12.0)
    assert prep_stall_pct(parse_emulator_output(DS / "outputsfig6/output_resnet18.txt").final) == pytest.approx(25.0)


@pytest.mark.parametrize(("name", "folder", "want"), [
    ("outputresnet18.txt", "outputsfig3", ("3", "resnet18", None, None)),
    ("output_100shufflenet_v2_x0_5.txt", "", ("3-100", "shufflenet_v2_x0_5", None, None)),
    ("output6g.txt", "", ("4", None, 6.0, None)),
    ("output_resnet1812.txt", "", ("5", "resnet18", None, 12)),
    ("output_mobilenet_v224.txt", "outputsfig5", ("5", "mobilenet_v2", None, 24)),
    ("output_resnet18.txt", "", ("6", "resnet18", None, None)),
    ("output_mynet3.txt", "outputsfig5", ("5", "mynet", None, 3)),
])
def test_classify_output_names(name, folder, want):
    k = classify(name, folder)
    assert (k.figure, k.model, k.limit_gb, k.workers) == want


def test_vmtouch_profile_batches():
    cache = parse_vmtouch(DS / "outputsfig3/cache_resulttinynet.txt")
    assert cache is not None and cache.percent == 35.0 and cache.files == 1000
    assert parse_vmtouch("no pages") is None
    prof = parse_profile(DS / "profile.csv")
    assert len(prof.rows) == 3 and prof.rows[1].cpu2gpu_time is None
    assert any("N/A or #VALUE!" in s for s in prof.skipped) and any("fewer than 8" in s for s in prof.skipped)
    c2g, comp = lookup(prof.rows, "p100", "tinynet", 256)
    assert c2g == pytest.approx(0.008) and comp == pytest.approx(1.0)
    batches = parse_batch_csv(DS / "p100/tinynet-batch128.csv")
    assert len(batches.rows) == 2 and len(batches.skipped) == 1


# --- tesla, jitc, neuronabox ----------------------------------------------------------------------------------

def test_tesla_metrics_header_and_truncation():
    loaded = _report_py("tesla")  # a run reporter and a campaign reporter (API 3), one file
    assert loaded.campaign is not None and "missing_points" in loaded.campaign.tables
    parse_metrics, config_from_path = _own("tesla").parse_metrics, _own("tesla").config_from_path
    path = S / "tesla/log/2_GPUs/p1_b4_e2/metrics.csv"
    parsed = parse_metrics(path)
    assert len(parsed.rows) == 4 and parsed.rows[0].gpu_load_pct == 90.0 and parsed.rows[1].rank == 1
    assert len(parsed.skipped) == 1
    cfg = config_from_path(path)
    assert (cfg.gpus, cfg.fraction, cfg.micro_batch, cfg.epochs) == (2, 1.0, 4, 2)
    assert config_from_path(S / "tesla/log/1_GPU/p0.1_b4_e2/metrics.csv").gpus == 1


def test_tesla_logs():
    parse_vit_log, parse_baseline = _own("tesla").parse_vit_log, _own("tesla").parse_baseline
    vit = parse_vit_log(S / "tesla/log/2_GPUs/p1_b4_e2/vit_training_rank_0.log")
    assert [(e.epoch, e.loss, e.accuracy, e.seconds) for e in vit.rows] == [(1, 2.0, 0.2, 61.0), (2, 1.5, 0.35, 62.0)]
    base = parse_baseline(S / "tesla/metrics.txt")
    assert len(base.samples) == 1 and base.samples[0].gpu_mem_mb == 600
    assert [(e.epoch, e.seconds) for e in base.epochs] == [(1, 0.02), (2, 0.015)]
    assert len(base.skipped) == 1


def test_jitc_stdout(tmp_path):
    """jitc's reporter lives in its suite folder (experiments/jitc/report.py), loaded as testbed loads it; its
    parser is read from the loaded reporter's module."""
    import sys

    own = _report_py("jitc")
    assert own.reporter is not None and "jitc_summary" in own.reporter.tables
    parse_jitc = sys.modules[own.reporter.fn.__module__].parse_jitc
    log = parse_jitc((S / "jitc/rank0.out").read_text(), "rank0.out")
    assert log.timings == [("checkpointing", 1.5), ("consolidation", 0.75), ("recovering", 2.25)]
    assert len(log.iterations) == 3 and log.iterations[1][3] == 2.2
    assert log.test == (2.0, 1500, 10000) and log.model_size_gb == 0.5
    assert len(log.skipped) == 1 and "Checkpointing took 1." in log.skipped[0]


def test_neuronabox_collective_and_steps():
    parse_collective, parse_step_times = _own("neuronabox").parse_collective, _own("neuronabox").parse_step_times
    emu = parse_collective(S / "neuronabox/all_reduce_emu.out").rows
    assert [(r.size, r.loop, r.bypass, r.ns_per_op) for r in emu] == [(1024, 100, True, 1000.0),
                                                                       (1048576, 100, True, 1024000.0)]
    # one mpirun output holds both ranks, interleaved: the peer's rank is ori whatever line came before it
    both = ("size = 1024, loop = 100\nsize = 1024, loop = 100\nMOD_KERNEL_BYPASS = 0\nMOD_KERNEL_BYPASS = 1\n"
            "[rk0] average time for sum_e2e: 900.0\n[rk1] average time for sum_e2e: 1000.0\n")
    assert [(r.rank, r.bypass) for r in parse_collective(both).rows] == [(0, True), (1, False)]
    steps = parse_step_times(S / "neuronabox/results0.txt")
    assert [s.ns for s in steps.rows] == [2000000, 1500000] and len(steps.skipped) == 1
