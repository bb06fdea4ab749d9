"""build_report end to end: synthetic run folders, Markdown/HTML/CSV/PNG output, dispatch and errors."""

from __future__ import annotations

import csv
import json
import shutil
import struct
from pathlib import Path

import pytest

from testbed.errors import UsageError
from testbed.report.build import build_report
from testbed.report.suites import known_suites

S = Path(__file__).parent / "samples"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def make_run(tmp_path: Path, suite: str, manifest: dict | None = None, sample: str | None = None,
             per_host: bool = False) -> Path:
    """A results/<suite>/<run-id>/ folder; samples either hold host folders (per_host) or go to node0/."""
    run = tmp_path / "results" / suite / "run-1"
    src = S / (sample or suite)
    if per_host:
        shutil.copytree(src, run)
    else:
        run.mkdir(parents=True)
        if src.is_dir():
            shutil.copytree(src, run / "node0")
    if manifest is not None:
        (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def fault_drill_manifest() -> dict:
    return {
        "schema": 1, "run_id": "run-1", "suite": "fault-drill", "params": {"steps": 10, "fault": "kill"},
        "testbed": {"name": "local", "provider": "local"},
        "hosts": [{"name": "node0", "address": "10.0.0.1", "facts": {}, "exit_code": 0, "status": "succeeded"},
                  {"name": "node1", "address": "10.0.0.2", "facts": {}, "exit_code": 0, "status": "succeeded"}],
        "started": "2025-01-01T00:00:00+00:00", "ended": "2025-01-01T00:00:40+00:00",
        "events": [{"ts": 1005.6, "kind": "fault", "host": "node1", "detail": {"type": "kill"}},
                   {"ts": 1024.9, "kind": "recovery", "host": "node1", "detail": {}}],
        "files": [{"host": "node0", "path": "train_log.csv", "sha256": "ab" * 32, "size": 300}],
    }


def test_fault_drill_report(tmp_path):
    run = make_run(tmp_path, "fault-drill", fault_drill_manifest(), per_host=True)
    res = build_report(run)
    assert res.path == run / "report" / "report.md" and res.suite == "fault-drill"
    checks = {n: (ok, d) for n, ok, d in res.checks}
    assert checks["training resumed from checkpoint"] == (True, "first step after restart is 5")
    assert checks["final loss below first loss"][0] is True
    assert [p.name for p in res.figures] == ["loss.png"]
    png = res.figures[0]
    assert png.stat().st_size > 1024
    w, h = png_size(png)
    assert (w, h) == (700, 400)
    import matplotlib.image as mpimg

    assert mpimg.imread(png).shape[:2] == (400, 700)
    assert any("node1" in s and "short row" in s for s in res.skipped)
    steps = list(csv.DictReader((run / "report/event_steps.csv").open()))
    assert [(r["kind"], r["nearest_global_step"]) for r in steps] == [("fault", "5"), ("recovery", "5")]
    md = res.path.read_text()
    assert "![" in md and "(loss.png)" in md and "| fault |" in md


def test_fault_drill_without_restart_fails_check(tmp_path):
    run = make_run(tmp_path, "fault-drill", {"suite": "fault-drill"}, sample="none")
    (run / "node0").mkdir()
    (run / "node0/train_log.csv").write_text("time,attempt,epoch,step,loss\n1,0,0,0,2.0\n2,0,0,1,1.0\n")
    res = build_report(run)
    assert ("training resumed from checkpoint", False, "no rows with attempt >= 1 (no restart logged)") in res.checks


def test_tidy_csv_per_table(tmp_path):
    run = make_run(tmp_path, "fault-drill", fault_drill_manifest(), per_host=True)
    res = build_report(run)
    names = {p.name for p in res.csvs}
    assert {"train_log.csv", "event_steps.csv", "hosts.csv", "run.csv", "checks.csv"} <= names
    rows = list(csv.reader((run / "report/train_log.csv").open()))
    assert rows[0] == ["host", "rank", "attempt", "epoch", "step", "global_step", "time", "loss"]
    assert len(rows) == 1 + 11 + 11 and all(len(r) == 8 for r in rows)
    assert {r[0] for r in rows[1:]} == {"node0", "node1"}


def test_html_is_escaped_and_self_contained(tmp_path):
    m = fault_drill_manifest()
    m["params"] = {"note": "<script>alert('x')</script> & co"}
    m["hosts"][0]["name"] = "node0"
    m["events"].append({"ts": 1.0, "kind": "<b>odd</b>", "host": "n&1", "detail": {}})
    run = make_run(tmp_path, "fault-drill", m, per_host=True)
    res = build_report(run, fmt="html")
    assert res.path.name == "report.html"
    page = res.path.read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in page
    assert "&lt;b&gt;odd&lt;/b&gt;" in page and "n&amp;1" in page
    assert '<img src="loss.png"' in page and (res.path.parent / "loss.png").is_file()
    assert "http://" not in page and "https://" not in page


def test_markdown_neutralises_html_and_pipes(tmp_path):
    m = {"suite": "mystery", "params": {"a|b": "<img src=x onerror=alert(1)>"}}
    run = make_run(tmp_path, "mystery", m, sample="none")
    (run / "node0").mkdir()
    (run / "node0/rank0.out").write_text("hi\n")  # a folder without files is not a run
    res = build_report(run)
    md = res.path.read_text()
    assert "<img" not in md and "a\\|b" in md


def test_unknown_suite_gets_generic_report(tmp_path):
    m = {"suite": "mystery", "run_id": "run-1", "hosts": [{"name": "h0", "exit_code": 3, "status": "failed"}],
         "files": [{"host": "h0", "path": "out/a.txt", "sha256": "cd" * 32, "size": 5}]}
    run = make_run(tmp_path, "mystery", m, sample="none")
    (run / "h0/out").mkdir(parents=True)
    (run / "h0/out/a.txt").write_text("hello")
    res = build_report(run)
    md = res.path.read_text()
    assert "No reporter is registered for suite 'mystery'" in md and "out/a.txt" in md
    assert ("hosts succeeded", False, "failed: h0") in res.checks
    assert "mystery" not in known_suites()


def test_generic_report_without_manifest_lists_disk(tmp_path):
    run = tmp_path / "results" / "other-suite" / "r9"
    (run / "h1" / "logs").mkdir(parents=True)
    (run / "h1" / "logs" / "rank0.out").write_text("hi\n")
    res = build_report(run)
    assert res.suite == "other-suite"
    rows = list(csv.reader((run / "report/files.csv").open()))
    assert rows[1][:3] == ["h1", "logs/rank0.out", "3"]
    assert any("manifest.json: missing" in s for s in res.skipped)
    res2 = build_report(run)  # the report folder itself is never listed as a host
    assert "report" not in {r[0] for r in csv.reader((run / "report/files.csv").open())}
    assert res2.path.exists()


def test_bad_manifest_is_noted_not_fatal(tmp_path):
    run = make_run(tmp_path, "fault-drill", None, per_host=True)
    (run / "manifest.json").write_text("{not json")
    res = build_report(run)
    assert any("manifest.json: unreadable" in s for s in res.skipped) and res.figures


def test_missing_run_dir_is_usage_error(tmp_path):
    with pytest.raises(UsageError) as exc:
        build_report(tmp_path / "results" / "nope" / "r0")
    assert exc.value.code == 2 and exc.value.where and exc.value.fix


def test_bad_format_is_usage_error(tmp_path):
    run = make_run(tmp_path, "mystery", {"suite": "mystery"}, sample="none")
    with pytest.raises(UsageError):
        build_report(run, fmt="pdf")


def test_matmul_and_mpi_hello_reports(tmp_path):
    hosts = [{"name": "node0"}, {"name": "node1"}]
    res = build_report(make_run(tmp_path / "a", "matmul-baseline", {"suite": "matmul-baseline", "hosts": hosts},
                                per_host=True))
    assert ("every rank reported", True, "2 of 2 ranks") in res.checks
    med = list(csv.DictReader((res.path.parent / "matmul_median.csv").open()))
    assert [(r["rank"], float(r["median_seconds"])) for r in med] == [("0", 0.12), ("1", 0.22)]
    assert res.figures[0].stat().st_size > 1024
    res = build_report(make_run(tmp_path / "b", "mpi-hello", {"suite": "mpi-hello"}))
    assert ("all ranks answered", True, "3 of 3 ranks") in res.checks


@pytest.mark.slow
def test_artifact_suites_on_samples(tmp_path):
    res = build_report(make_run(tmp_path / "i", "isca-resnet18", {"suite": "isca-resnet18"}, sample="isca"))
    ok = {n: p for n, p, _ in res.checks}
    assert ok == {"inj_tiny_infs_nans: NaN at epoch 2 step 1": True,
                  "inj_tiny_masked: final train accuracy within 2% of fault-free": True,
                  "inj_tiny_slow_degrade: final train accuracy near 0.44 (much lower)": True,
                  "detection overhead below 0.025%": True, "replay overhead below 0.15%": True}
    res = build_report(make_run(tmp_path / "d", "datastall-emulator", {"suite": "datastall-emulator"},
                                sample="datastall"))
    assert {p.name for p in res.figures} == {"fig3_fetch_stall.png", "fig4a_breakdown.png", "fig5_throughput.png",
                                             "fig6_prep_stall.png"}
    fig4 = list(csv.DictReader((res.path.parent / "fig4a_breakdown.csv").open()))
    assert [(r["limit_gb"], float(r["fetch_s"])) for r in fig4] == [("6.0", 4.0), ("16.0", 0.0)]
    assert any("output22g.txt" in s for s in res.skipped)
    res = build_report(make_run(tmp_path / "t", "tesla", {"suite": "tesla"}))
    scaling = list(csv.DictReader((res.path.parent / "scaling.csv").open()))
    assert [(r["kind"], r["gpus"]) for r in scaling] == [("strong", "1"), ("strong", "2"), ("weak", "1"), ("weak", "2")]
    res = build_report(make_run(tmp_path / "j", "jitc", {"suite": "jitc", "params": {"fault": "error_before_opt"}}))
    summ = list(csv.DictReader((res.path.parent / "jitc_summary.csv").open()))
    assert (summ[0]["fault"], summ[0]["phase"], summ[0]["count"]) == ("error_before_opt", "checkpointing", "1")
    assert ("checkpoint and recovery timed", True, "3 timing lines") in res.checks
    res = build_report(make_run(tmp_path / "n", "neuronabox", {"suite": "neuronabox"}))
    piv = list(csv.DictReader((res.path.parent / "collectives_emu_vs_ori.csv").open()))
    assert [(r["collective"], r["size"], float(r["emu_over_ori"])) for r in piv] == [("allreduce", "1024", 0.8),
                                                                                      ("allreduce", "1048576", 0.8)]


def test_fault_drill_event_times_from_manifest_iso_or_state_floats() -> None:
    from testbed.report.rundir import event_time

    assert event_time("2026-11-22T02:47:56.933Z") == pytest.approx(1795315676.933)
    assert event_time(1795315676.5) == 1795315676.5
    assert event_time("not a time") is None and event_time(None) is None


def test_recovery_times_and_goodput_are_reported(tmp_path):
    m = fault_drill_manifest()
    m["events"] += [
        {"ts": 1025.0, "kind": "repaired", "host": "node1", "detail": {"hosts": ["node1"], "replaced": ["node1"],
                                                                     "repair_seconds": 1.2, "setup_seconds": 8.5}},
        {"ts": 1026.0, "kind": "resumed", "host": None, "detail": {
            "attempt": 1, "fault": "kill-host", "hosts_repaired": ["node1"], "detect_seconds": 0.9,
            "drain_seconds": 3.1, "repair_seconds": 1.2, "setup_seconds": 8.5, "relaunch_seconds": 0.5,
            "downtime_seconds": 14.2, "checkpoint": {"host": "node0", "file": "ckpt.pt", "bytes": 10, "mtime": 1},
            "resumed_step": 4, "last_step": 7, "steps_lost": 3}},
        {"ts": 1040.0, "kind": "goodput", "host": None, "detail": {
            "steps": 24, "seconds": 40.0, "steps_per_second": 0.6, "fault_free_seconds": 25.0,
            "fault_free_steps_per_second": 0.96, "ratio": 0.625}}]
    run = make_run(tmp_path, "fault-drill", m, per_host=True)
    res = build_report(run)
    rows = list(csv.DictReader((run / "report/recovery.csv").open()))
    assert len(rows) == 1 and rows[0]["resumed_from"] == "node0:ckpt.pt" and rows[0]["steps_lost"] == "3"
    assert rows[0]["detect_seconds"] == "0.9" and rows[0]["hosts_repaired"] == "node1"
    good = list(csv.DictReader((run / "report/goodput.csv").open()))
    assert good[0]["ratio"] == "0.625"
    md = res.path.read_text()
    assert "## Recovery" in md and "Goodput" in md


def test_why_a_host_was_judged_lost_and_a_slow_spell_are_reported(tmp_path):
    """The report shows each host judged lost with the probes that found it so (their results, how many, the span
    and the bound) and each spell a host gave no answer without being judged lost."""
    m = fault_drill_manifest()
    refused = [{"at": 1010.0 + 1.5 * i, "seconds": 0.01, "ssh": "refused", "lost": True, "provider": "down"}
               for i in range(3)]
    slow = [{"at": 1001.0 + 5 * i, "seconds": 5.0, "ssh": "slow", "lost": False, "provider": "up"} for i in range(4)]
    m["events"] += [
        {"ts": 1021.0, "kind": "host-back", "host": "node0", "detail": {
            "seconds": 20.0, "probes": slow, "summary": "4 probes over 15.0 s: slow x4; none lost"}},
        {"ts": 1013.1, "kind": "host-lost", "host": "node1", "detail": {
            "bound": 3, "count": 3, "probes": refused,
            "summary": "3 probes over 3.0 s (bound 3 s): refused x3; the provider: down x3; every one lost"}}]
    run = make_run(tmp_path, "fault-drill", m, per_host=True)
    res = build_report(run)
    lost = list(csv.DictReader((run / "report/lost.csv").open()))
    assert len(lost) == 1 and lost[0]["host"] == "node1" and lost[0]["probes"] == "3"
    assert lost[0]["span_seconds"] == "3.0" and lost[0]["bound_seconds"] == "3"
    assert lost[0]["results"] == "refused/down, refused/down, refused/down" and "every one lost" in lost[0]["why"]
    spells = list(csv.DictReader((run / "report/unanswered.csv").open()))
    assert spells[0]["host"] == "node0" and spells[0]["probes"] == "4" and spells[0]["results"].count("slow/up") == 4
    md = res.path.read_text()
    assert "## Hosts without an answer" in md and "judged lost" in md
