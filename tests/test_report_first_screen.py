"""A report's first screen, measured in headless Chromium at 1280x800: the status, the verdicts, the checks and the
key figure sit within the first 800 pixels of a fault-drill run's HTML report (a 72-row training log, a fault,
a recovery); parameters, hosts and the per-step tables come after, folded."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

from test_report_browser import _browser

from testbed.report.build import build_report

HARNESS = """<!doctype html><html><head><meta charset="utf-8"><style>body{margin:0}</style></head><body>
<iframe id="f" src="%s" style="width:1280px;height:800px;border:0"></iframe><pre id="result">pending</pre>
<script>
const f = document.getElementById("f");
f.onload = () => {
  const d = f.contentDocument;
  const box = (el) => el ? (r => ({top: r.top, bottom: r.bottom}))(el.getBoundingClientRect()) : null;
  const img = d.querySelector("#lead img");
  document.getElementById("result").textContent = JSON.stringify({
    height: d.documentElement.scrollHeight,
    status: box(d.getElementById("status")), verdicts: box(d.getElementById("verdicts")),
    checks: box(d.getElementById("checks")), figure: box(img), figure_loaded: !!img && img.naturalWidth > 0,
    timeline: box(d.querySelector("#lead table")), details: box(d.getElementById("details")),
    folded: [...d.querySelectorAll("details")].filter(x => !x.open).length,
  });
};
</script></body></html>
"""


def measure(report: Path) -> dict:
    harness = report.parent / ".measure.html"
    harness.write_text(HARNESS % report.name)
    r = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                        "--window-size=1280,800", "--virtual-time-budget=20000", "--dump-dom", harness.as_uri()],
                       capture_output=True, text=True, timeout=120, check=False)
    harness.unlink()
    m = re.search(r'<pre id="result">(.*?)</pre>', r.stdout, re.S)
    assert m and m[1] != "pending", r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(html.unescape(m[1]))


def fault_drill_run(root: Path) -> Path:
    """A fault-drill run as collect writes it: 3 ranks, 24 steps, rank 2 killed at step 10, resumed from step 8."""
    run = root / "results" / "fault-drill" / "run-1"
    t0 = 1_700_000_000.0
    for rank in range(3):
        lines = ["time,attempt,epoch,step,loss"]
        for step in range(1, 11):
            lines.append(f"{t0 + step:.2f},0,{(step - 1) // 8},{step},{2.0 - step * 0.05:.4f}")
        for step in range(9, 25):
            lines.append(f"{t0 + 20 + step:.2f},1,{(step - 1) // 8},{step},{2.0 - step * 0.05:.4f}")
        host = run / f"node{rank}"
        host.mkdir(parents=True)
        (host / "train_log.csv").write_text("\n".join(lines) + "\n")

    def ev(dt: float, kind: str, host: str | None, **detail: object) -> dict:
        from testbed.collect.manifest import iso

        return {"ts": iso(t0 + dt), "kind": kind, "host": host, "detail": detail}

    manifest = {
        "schema": 1, "run_id": "run-1", "suite": "fault-drill", "status": "succeeded", "reason": None,
        "params": {"ranks": 3, "epochs": 3, "steps_per_epoch": 8, "step_seconds": 0.1, "ckpt_every": 4,
                   "kill_step": 10, "timeout": 8, "port": 29511, "python": "/usr/bin/python3", "seed": 0},
        "testbed": {"name": "local", "provider": "local"},
        "hosts": [{"name": f"node{i}", "address": f"10.213.0.{i + 2}",
                   "facts": {"cpus": 2, "memory_mb": 7900, "gpus": []}, "exit_code": 0, "status": "succeeded",
                   "ranks": [{"rank": i, "status": "succeeded", "exit_code": 0, "reason": None}]} for i in range(3)],
        "started": "2023-11-14T22:13:20+00:00", "ended": "2023-11-14T22:14:10+00:00",
        "events": [ev(0, "started", None), ev(10.2, "fault", "node2", fault="kill-rank", signal="SIGKILL", rank=2),
                   ev(18.5, "failed", "node2", reason="node2 rank 2: signal 9 (SIGKILL)"),
                   ev(19.0, "recovery", None, fault="kill-rank"),
                   ev(21.0, "relaunched", None, attempt=1),
                   ev(21.5, "resumed", None, attempt=1, fault="kill-rank", hosts_repaired=[], detect_seconds=8.3,
                      drain_seconds=0.5, repair_seconds=0.0, setup_seconds=0.0, relaunch_seconds=2.0,
                      downtime_seconds=11.3, checkpoint={"host": "node0", "file": "ckpt.pt"}, resumed_step=8,
                      last_step=10, steps_lost=2),
                   ev(45.0, "goodput", None, steps=24, seconds=45.0, steps_per_second=0.53, fault_free_seconds=30.0,
                      fault_free_steps_per_second=0.8, ratio=0.67),
                   ev(50.0, "ended", None, status="succeeded")],
        "files": [{"host": f"node{i}", "path": "train_log.csv", "size": 900, "sha256": "ab" * 32} for i in range(3)],
    }
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_fault_drill_first_screen_holds_status_verdicts_checks_and_figure(tmp_path: Path) -> None:
    res = build_report(fault_drill_run(tmp_path), "html")
    assert [v.status for v in res.verdicts] == ["within tolerance"] * 4, [(v.metric, v.note) for v in res.verdicts]
    m = measure(res.path)
    for part in ("status", "verdicts", "checks", "figure", "timeline"):
        assert m[part] is not None, (part, m)
        assert m[part]["bottom"] <= 800, (part, m)
    assert m["figure_loaded"]
    assert m["status"]["top"] < m["verdicts"]["top"] < m["checks"]["top"] < m["figure"]["top"]
    assert m["details"]["top"] >= m["figure"]["bottom"]  # parameters, hosts, per-step tables: after, folded
    assert m["folded"] >= 5 and m["height"] < 2000, m
    text = res.path.read_text()
    assert text.index("Training log, all ranks") > text.index('id="details"')


def test_markdown_opens_with_status_verdicts_and_checks(tmp_path: Path) -> None:
    res = build_report(fault_drill_run(tmp_path))
    md = res.path.read_text()
    assert md.index("**Status:** succeeded") < md.index("## Verdicts") < md.index("## Checks") < md.index("(loss.png)")
    assert md.index("(loss.png)") < md.index("## Run")
    assert "| last step trained | 24 | 24 | +0 (+0.0%) | within tolerance | exact |" in md
