"""The ``collect`` and ``report`` CLI verbs on a real local run (matmul-baseline outputs on two hosts)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from test_collect import make_run
from typer.testing import CliRunner

from testbed.cli import collect as cli_collect
from testbed.errors import TestbedError, UsageError


def _app() -> typer.Typer:
    app = typer.Typer()
    cli_collect.register(app)
    return app


def _matmul(rank: int, host: str) -> bytes:
    rows = ["rank,host,iteration,size,seconds,gflops"]
    rows += [f"{rank},{host},{i},512,{0.01 + 0.001 * i + rank * 0.002:.4f},{20 - i * 0.1:.2f}" for i in range(5)]
    return ("\n".join(rows) + "\n").encode()


def test_collect_then_report_from_the_cli(local_testbed):
    bed = local_testbed(hosts=2)
    run_id, _ = make_run(bed, suite="matmul-baseline", outputs={"*": ["matmul_rank*.csv"]}, params={"ranks": 2},
                         files={h.name: {f"matmul_rank{k}.csv": _matmul(k, h.name)} for k, h in enumerate(bed.hosts)})
    runner = CliRunner()
    r = runner.invoke(_app(), ["collect", run_id, "--to", "res", "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    out = json.loads(r.stdout)
    assert out[0]["ok"] and out[0]["run_id"] == run_id and out[0]["files_sent"] == 2 * 6
    folder = Path("res/matmul-baseline") / run_id
    assert Path(out[0]["manifest"]) == folder / "manifest.json"
    # tables without --json; an incremental collect sends nothing
    r = runner.invoke(_app(), ["collect", run_id, "--to", "res"])
    assert r.exit_code == 0, r.output
    assert "node0" in r.stdout and "manifest:" in r.stdout
    r = runner.invoke(_app(), ["collect", "--all", "--to", "res", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)[0]["files_sent"] == 0
    # report: path, figure and checks printed; files exist
    r = runner.invoke(_app(), ["report", str(folder)])
    assert r.exit_code == 0, (r.output, r.exception)
    assert f"report: {folder}/report/report.md" in r.stdout
    assert "figure: " in r.stdout and "check pass every rank reported" in r.stdout
    assert (folder / "report/report.md").is_file()
    r = runner.invoke(_app(), ["report", str(folder), "--format", "html", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["suite"] == "matmul-baseline" and rep["passed"] and rep["path"].endswith("report.html")
    assert rep["figures"] and all(Path(f).stat().st_size > 1000 for f in rep["figures"])
    # a host that cannot be reached: non-zero, one message naming it
    bed.provider.kill_host("node1")
    r = runner.invoke(_app(), ["collect", run_id, "--to", "res"])
    assert r.exit_code != 0 and isinstance(r.exception, TestbedError)
    assert "node1" in r.exception.what and r.exception.where == "node1"


def test_cli_refuses_bad_input_before_touching_hosts(tb_home):
    runner = CliRunner()
    r = runner.invoke(_app(), ["collect", "nope-20240101-000000-abcd"])
    assert isinstance(r.exception, UsageError) and "no run with id" in r.exception.what
    r = runner.invoke(_app(), ["collect"])
    assert isinstance(r.exception, UsageError) and "--all" in (r.exception.fix or "")
    r = runner.invoke(_app(), ["report", str(tb_home / "missing")])
    assert isinstance(r.exception, UsageError)
    r = runner.invoke(_app(), ["report", str(tb_home), "--format", "pdf"])
    assert isinstance(r.exception, UsageError) and "format" in r.exception.what


def test_cli_module_imports_only_typer():
    import subprocess
    import sys

    code = ("import sys; import testbed.cli.collect; "
            "heavy = [m for m in ('rich.progress', 'testbed.collect', 'testbed.report', 'matplotlib') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert all((f.__doc__ or "").strip().splitlines()[-1].strip().startswith("Example:")
               for f in (cli_collect.collect_cmd, cli_collect.report_cmd, cli_collect.register))
