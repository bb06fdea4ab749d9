"""Reports that tell the truth about failed runs: a failed run's report shows why (the failing rank's stderr tail,
secrets masked) in Markdown, HTML and the command's text; a campaign with a failed, timed-out or missing run
fails in its report, its checks and the exit code of `testbed report`.

The run folders are laid out as collect writes them (manifest with hosts, ranks and events; ``<host>/rankK.err``);
tests/test_run_local.py builds them by running a real campaign on local hosts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from testbed.report.build import build_report
from testbed.report.folders import build_index, report_path

SECRET = "s3cr3t-Value-8842"
STDERR = ("Traceback (most recent call last):\n"
          '  File "train.py", line 12, in <module>\n'
          f"connecting to https://bob:hunter2hunter2@data.example.org with api_key={SECRET} and password=pw-in-log\n"
          "\x1b[31mRuntimeError: boom at step 7\x1b[0m\n")


def collected_run(root: Path, run_id: str, *, status: str = "succeeded", reason: str | None = None,
                  params: dict[str, Any] | None = None, campaign: str | None = None,
                  failed: tuple[str, int, int] | None = None, stderr: str = STDERR, suite: str = "flaky") -> Path:
    """``root/<suite>/<run_id>/`` as collect writes it: two hosts of one rank each, logs per rank."""
    run = root / suite / run_id
    ranks = {"node0": 0, "node1": 1}
    hosts, events, files = [], [], []
    for host, rank in ranks.items():
        bad = failed is not None and failed[:2] == (host, rank)
        code = failed[2] if bad and failed else (0 if status == "succeeded" else None)
        rstatus = ("failed" if bad else "stopped") if status == "failed" else status
        hosts.append({"name": host, "address": f"10.0.0.{rank + 2}", "facts": {}, "exit_code": code,
                      "status": rstatus, "ranks": [{"rank": rank, "status": rstatus, "exit_code": code,
                                                    "reason": f"exit {code}" if bad else None}]})
        out = run / host
        out.mkdir(parents=True)
        (out / f"rank{rank}.out").write_text(f"hello from rank {rank}\n")
        (out / f"rank{rank}.err").write_text(stderr if bad else "")
        files += [{"host": host, "path": f"rank{rank}.{s}", "sha256": "0" * 64, "size": 1} for s in ("out", "err")]
        if bad:
            events.append({"ts": "2025-01-01T00:00:05.000Z", "kind": "failed", "host": host,
                           "detail": {"rank": rank, "reason": f"{host} rank {rank}: exit {code}", "attempt": 0}})
    man = {"schema": 1, "run_id": run_id, "suite": suite, "params": params or {"n": 1}, "status": status,
           "reason": reason, "campaign": campaign, "testbed": {"name": "local", "provider": "local"},
           "hosts": hosts, "started": "2025-01-01T00:00:00.000Z", "ended": "2025-01-01T00:00:09.000Z",
           "events": events, "files": files}
    (run / "manifest.json").write_text(json.dumps(man))
    return run


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TB_TEST_API_KEY", SECRET)  # a secret of the controller: never shown in a report


def _app():  # type: ignore[no-untyped-def]
    import typer

    from testbed.cli import collect as cli_collect

    app = typer.Typer()
    cli_collect.register(app)
    return app


def test_a_failed_runs_report_shows_the_failing_ranks_stderr(tmp_path: Path, tb_home: Path, secret_env: None
                                                               ) -> None:
    run = collected_run(tmp_path / "results", "flaky-1", status="failed", reason="node1 rank 1: exit 3",
                        failed=("node1", 1, 3))
    res = build_report(run)
    assert res.cause is not None and res.cause["host"] == "node1" and res.cause["rank"] == 1
    assert res.cause["tail"][-1] == "RuntimeError: boom at step 7" and res.cause["file"] == "node1/rank1.err"
    assert res.failed_runs == [{"run_id": "flaky-1", "status": "failed",
                                "cause": "node1 rank 1 failed (exit 3): RuntimeError: boom at step 7"}]
    checks = {n: (p, d) for n, p, d in res.checks}
    assert checks["run succeeded"][0] is False and "RuntimeError: boom at step 7" in checks["run succeeded"][1]
    md = res.path.read_text()
    assert "## Why it failed" in md and "node1 rank 1 failed with exit 3." in md
    assert "```text\n" in md and "RuntimeError: boom at step 7\n```" in md
    html = build_report(run, "html").path.read_text()
    assert "<pre>" in html and "RuntimeError: boom at step 7</pre>" in html
    for text in (md, html):  # secrets never shown: the controller's, URL credentials, secret-looking assignments
        assert SECRET not in text and "hunter2hunter2" not in text and "pw-in-log" not in text
        assert "api_key=***" in text and "password=***" in text and "\x1b[" not in text
    # the command's text, its JSON, and its exit code (1: the run failed; the report is written all the same)
    r = CliRunner().invoke(_app(), ["report", str(run)])
    assert r.exit_code == 1, (r.output, r.exception)
    assert "why it failed: node1 rank 1" in r.stdout and "| RuntimeError: boom at step 7" in r.stdout
    assert "last lines of node1/rank1.err (stderr)" in r.stdout and SECRET not in r.stdout
    r = CliRunner().invoke(_app(), ["report", str(run), "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["cause"]["summary"].endswith("boom at step 7")


def test_a_failed_run_with_an_empty_stderr_shows_its_stdout_and_says_so(tmp_path: Path, tb_home: Path) -> None:
    run = collected_run(tmp_path / "results", "flaky-2", status="failed", failed=("node0", 0, 1), stderr="")
    (run / "node0" / "rank0.out").write_text("step 1\nstep 2\nCUDA out of memory\n")
    res = build_report(run)
    assert res.cause is not None and res.cause["stream"] == "stdout" and res.cause["tail"][-1] == "CUDA out of memory"
    assert "node0/rank0.err is empty" in res.path.read_text()
    (run / "node0" / "rank0.out").unlink()
    (run / "node0" / "rank0.err").unlink()
    res = build_report(run)
    assert res.cause is not None and res.cause["tail"] == [] and "was not collected" in res.cause["note"]
    ok = collected_run(tmp_path / "results", "flaky-3")
    res = build_report(ok)
    assert res.cause is None and res.failed_runs == [] and "Why it failed" not in res.path.read_text()
    assert CliRunner().invoke(_app(), ["report", str(ok)]).exit_code == 0


def _campaign_in_state(cid: str, points: list[tuple[dict[str, Any], str | None, str]]) -> None:
    from testbed.records import CampaignPoint, CampaignRecord
    from testbed.state import Store

    st = Store.open_default()
    st.add_campaign(CampaignRecord(id=cid, suite="flaky", testbed="local", status="failed", created=0.0,
                                   points=[CampaignPoint(params=p, run_id=r, status=s) for p, r, s in points]))
    st.close()


def test_a_campaign_with_a_failed_timed_out_or_missing_run_fails(tmp_path: Path, tb_home: Path,
                                                                  secret_env: None) -> None:
    root, cid = tmp_path / "results", "flaky-0a0b0c0d"
    collected_run(root, "flaky-n1", params={"n": 1}, campaign=cid)
    collected_run(root, "flaky-n2", params={"n": 2}, campaign=cid, status="failed", reason="node0 rank 0: exit 3",
                  failed=("node0", 0, 3))
    # one failed run: the campaign's report fails, and its row says why
    res = report_path(root / "flaky")
    checks = {n: (p, d) for n, p, d in res.checks}
    assert checks["every run succeeded"][0] is False
    assert "flaky-n2 failed (node0 rank 0 failed (exit 3): RuntimeError: boom at step 7)" in \
        checks["every run succeeded"][1]
    rows = (res.path.parent / "runs.csv").read_text()
    assert "node0 rank 0 failed (exit 3): RuntimeError: boom at step 7" in rows and SECRET not in rows
    md = res.path.read_text()
    assert "| every run succeeded | FAIL |" in md
    r = CliRunner().invoke(_app(), ["report", str(root / "flaky")])
    assert r.exit_code == 1 and "check FAIL every run succeeded" in r.stdout, r.output
    # timed out: fails too
    collected_run(root, "flaky-n3", params={"n": 3}, campaign=cid, status="timed-out",
                  reason="the run passed its 2 s limit (timeouts.run)")
    res = report_path(root, campaign=cid)
    assert {b["run_id"]: b["status"] for b in res.failed_runs} == {"flaky-n2": "failed", "flaky-n3": "timed-out"}
    # missing: state knows a fourth point whose run was never collected and a fifth never started
    _campaign_in_state(cid, [({"n": 1}, "flaky-n1", "succeeded"), ({"n": 2}, "flaky-n2", "failed"),
                             ({"n": 3}, "flaky-n3", "timed-out"), ({"n": 4}, "flaky-n4", "succeeded"),
                             ({"n": 5}, None, "todo")])
    res = report_path(root, campaign=cid)
    missing = [b for b in res.failed_runs if b["status"] == "missing"]
    assert [b["run_id"] for b in missing] == ["flaky-n4", None]
    assert "not collected" in missing[0]["cause"] and "never started" in missing[1]["cause"]
    assert "4 of 5 runs did not succeed" in next(d for n, _, d in res.checks if n == "every run succeeded")
    r = CliRunner().invoke(_app(), ["report", str(root), "--campaign", cid, "--json"])
    assert r.exit_code == 1 and len(json.loads(r.stdout)["failed_runs"]) == 4
    # the index: every failed run with its cause, the campaigns' missing runs, exit 1
    idx = build_index(root)
    assert {b["run_id"] for b in idx.failed_runs} == {"flaky-n2", "flaky-n3", "flaky-n4", None}
    assert "RuntimeError: boom at step 7" in (root / "index.md").read_text()
    r = CliRunner().invoke(_app(), ["report", str(root)])
    assert r.exit_code == 1 and "why: node0 rank 0 failed (exit 3)" in r.stdout and "missing flaky-n4" in r.stdout


def test_a_campaign_whose_runs_all_succeeded_passes(tmp_path: Path, tb_home: Path) -> None:
    root, cid = tmp_path / "results", "flaky-0a0b0c0e"
    for n in (1, 2):
        collected_run(root, f"flaky-n{n}", params={"n": n}, campaign=cid)
    _campaign_in_state(cid, [({"n": 1}, "flaky-n1", "succeeded"), ({"n": 2}, "flaky-n2", "succeeded")])
    res = report_path(root, campaign=cid)
    assert res.failed_runs == [] and res.passed
    assert ("every run succeeded", True, "all 2 runs succeeded") in res.checks
    r = CliRunner().invoke(_app(), ["report", str(root), "--campaign", cid])
    assert r.exit_code == 0, r.output
