"""Point-dependent suites (issue 38, item 4): what ranks and steps need, the programs a rehearsal probes and the
checks can depend on the parameter point (a template over its parameters, or ``{when: ...}`` entries), and a
matrix point can read another point's output (``after:``): the campaign orders the points, ``plan`` and ``run
--dry-run`` show the order, and a cycle or a point that is not in the matrix is refused at file:line. Through the
real command line on spec-only testbeds (no host is made), and the campaign's driver with a stand-in store."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import line_of

from testbed import points
from testbed.run import plan as plan_mod
from testbed.suite import load_suite

LAB2 = """\
provider:
  kind: lab
  hosts:
    - {name: a, address: 10.243.0.10, user: root, key: ~/.ssh/id_ed25519}
    - {name: b, address: 10.243.0.11, user: root, key: ~/.ssh/id_ed25519}
"""
GPUBOX = LAB2 + "hardware: {gpu: {model: NVIDIA A100, count: 1}}\n"

PIPE = """\
name: pipe
parameters:
  phase: {type: str, default: train, choices: [train, eval]}
  gpus: {type: int, default: 0}
matrix:
  phase: [eval, train]
  gpus: [0, 1]
after:
  - {name: trained, point: {phase: eval}, reads: {phase: train}}
steps:
  prepare:
    - {name: fetch, run: "echo fetch", needs: [network, {when: "gpus > 0", needs: [cuda]}]}
  launch:
    command: "python3 {{ phase }}.py {% if reads.trained is defined %}--model {{ reads.trained }}/model.pt{% endif %}"
    needs: "{{ 'gpu' if gpus > 0 else '' }}"
    probe: ["{{ phase }}.py", {when: "gpus > 0", probe: [kernel]}]
checks:
  - {name: model, file: model.pt, when: "phase == 'train'"}
  - {name: log, file: "{{ phase }}.log", contains: "{{ phase }} done"}
"""


@pytest.fixture
def cli(user_cli):  # type: ignore[no-untyped-def]
    """``testbed ARGS`` in a working folder holding the specs and suite of this file."""
    return user_cli({"inventories/lab2.yml": LAB2, "inventories/gpubox.yml": GPUBOX, "experiments/pipe.yml": PIPE})


def _suite(tb_home: Path, name: str, text: str) -> Path:
    path = tb_home / "experiments" / f"{name}.yml"
    path.write_text(text.replace("name: pipe", f"name: {name}"))
    return path


def _plan(params: dict[str, Any]) -> Any:
    s = load_suite("pipe")
    tb = plan_mod.testbed_info(None, dry_run=True, min_hosts=1)
    from testbed.suite import resolve_params

    return s, plan_mod.build_plan(s, tb, resolve_params(s, params))


def test_needs_probes_and_checks_are_rendered_per_point(cli) -> None:  # type: ignore[no-untyped-def]
    s, cpu = _plan({"phase": "train", "gpus": 0})
    _, gpu = _plan({"phase": "eval", "gpus": 1})
    assert all(r.needs == [] for r in cpu.ranks) and all(r.needs == ["gpu"] for r in gpu.ranks)
    assert cpu.prepare[0].needs == ["network"] and gpu.prepare[0].needs == ["network", "cuda"]
    assert [c.name for c in cpu.checks] == ["model", "log"] and [c.name for c in gpu.checks] == ["log"]
    assert (gpu.checks[0].file, gpu.checks[0].contains) == ("eval.log", "eval done")
    assert points.probes(s, cpu.params) == ["train.py"] and points.probes(s, gpu.params) == ["eval.py", "kernel"]
    from testbed import lint

    assert lint.needs_hardware(s) == ["gpu"]  # the gpus=1 points
    assert lint.needs_hardware(s, [cpu.params]) == []


def test_a_point_needing_a_gpu_is_refused_on_a_cpu_spec_and_only_that_point(cli) -> None:  # type: ignore[no-untyped-def]
    where = "pipe.yml:" + str(line_of(PIPE, 'needs: "{{'))
    assert cli("run", "pipe", "--on", "lab2", "-p", "gpus=0", "-p", "phase=train", "--dry-run").returncode == 0
    assert cli("plan", "pipe", "--on", "lab2", "-p", "gpus=0", "--matrix").returncode == 0
    for args in (("run", "pipe", "--on", "lab2", "-p", "gpus=1", "-p", "phase=train", "--dry-run"),
                 ("run", "pipe", "--on", "lab2", "--matrix", "--dry-run"), ("plan", "pipe", "--on", "lab2", "--matrix"),
                 ("run", "pipe", "--on", "lab2", "-p", "gpus=1", "-p", "phase=train")):
        r = cli(*args)
        flat = " ".join(r.stderr.split())
        assert r.returncode == 2, (args, r.stderr)
        assert "the ranks of suite 'pipe' need gpu (steps.launch.needs) at point phase=train, gpus=1, which testbed " \
               "'lab2' (lab) lacks" in flat and where in flat, (args, flat)
    assert cli("run", "pipe", "--on", "gpubox", "--matrix", "--dry-run").returncode == 0


@pytest.mark.parametrize("old,new,culprit,what", [
    ("needs: [network,", "needs: [netwrk,", "needs: [netwrk", "steps.prepare.0.needs.0: 'netwrk' is not a need"),
    ("needs: [cuda]}", "needs: [cudda]}", "cudda", "'cudda' is not a need"),
    ('when: "gpus > 0", needs', 'when: "gpus >", needs', "gpus >", "'when: gpus >' is not a condition"),
    ("{when: \"gpus > 0\", needs: [cuda]}", "{when: \"gpus > 0\", need: [cuda]}", "need: [cuda]",
     "has the keys when and needs, not when, need"),
    ("\"{{ 'gpu' if gpus > 0 else '' }}\"", "\"{{ 'gpu' if gpus > 0 else '' }\"", "needs: \"{{",
     "template error in"),
    ('when: "phase == \'train\'"', 'when: "phase = \'train\'"', "phase = ", "is not a condition"),
    ("reads: {phase: train}", "reads: {phase: test}", "reads: {phase: test}", "after.0.reads.phase: 'test' is not"),
    ("reads: {phase: train}", "reads: {model: x}", "reads: {model", "'model' is not a parameter"),
])
def test_a_bad_per_point_key_is_one_message_at_its_line(cli, tb_home: Path, old: str, new: str, culprit: str,
                                                        what: str) -> None:  # type: ignore[no-untyped-def]
    text = PIPE.replace(old, new)
    assert text != PIPE
    _suite(tb_home, "bad", text)
    for args in (("show", "bad"), ("run", "bad", "--matrix", "--dry-run")):
        r = cli(*args)
        flat = " ".join(r.stderr.split())
        assert r.returncode == 2 and what in flat and f"bad.yml:{line_of(text, culprit)}" in flat, (args, flat)
        assert "Traceback" not in r.stderr and "fix:" in r.stderr


def test_show_says_what_reads_what_and_a_table_check_applies_where_its_when_holds(cli, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("show", "pipe")
    assert r.returncode == 0 and "matrix: 4 points (testbed run pipe --matrix); phase=eval reads phase=train " \
        "({{ reads.trained }})" in " ".join(r.stdout.split()), r.stdout
    from testbed.report.declared import add_table_checks
    from testbed.report.model import Report, Table

    text = PIPE + "  - {name: loss, table: steps, column: loss, max: 1, when: \"phase == 'train'\"}\n"
    s = load_suite(str(_suite(tb_home, "tabled", text)))
    judged = {}
    for phase in ("train", "eval"):
        rep = Report(tb_home, "r")
        rep.tables.append(Table("steps", ["loss"], [[0.5]]))
        add_table_checks(rep, s, {"phase": phase, "gpus": 0})
        judged[phase] = [name for name, _, _ in rep.checks]
    assert judged == {"train": ["loss"], "eval": []}


def test_a_need_rendered_per_point_that_is_no_need_is_refused_at_its_line(cli, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    text = PIPE.replace("'gpu' if gpus", "'gpux' if gpus")
    _suite(tb_home, "bad", text)
    assert cli("run", "bad", "-p", "gpus=0", "--dry-run").returncode == 0  # renders to nothing there
    r = cli("run", "bad", "-p", "gpus=1", "--dry-run")
    flat = " ".join(r.stderr.split())
    assert r.returncode == 2 and "steps.launch.needs: 'gpux' is not a need (rendered from" in flat, flat
    assert f"bad.yml:{line_of(text, 'gpux')}" in flat and "a need is one of gpu, tpu" in flat


def test_dry_run_and_plan_show_the_order_and_the_reader_finds_the_earlier_run(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("run", "pipe", "--on", "gpubox", "--matrix", "--dry-run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "order (a point runs after the points it reads):" in out
    assert "1. phase=train, gpus=0\n" in out and "2. phase=eval, gpus=0 <- reads trained: point 1 (phase=train, " \
        "gpus=0)" in " ".join(out.split(" ")).replace("  ", " ")
    js = json.loads(cli("run", "pipe", "--on", "gpubox", "--matrix", "--dry-run", "--json").stdout)
    assert [(p["params"]["phase"], p["params"]["gpus"]) for p in js] == [("train", 0), ("eval", 0), ("train", 1),
                                                                         ("eval", 1)]
    assert js[1]["reads"]["trained"]["point"] == 1 and not js[0]["reads"]
    first_dir = js[0]["commands"][0]["command"].split()[2]  # mkdir -p <run dir> && ...
    launch = [c["command"] for c in js[1]["commands"] if c["phase"] == "launch"]
    assert launch and all(f"--model {first_dir}/model.pt" in c for c in launch), (first_dir, launch)
    r = cli("plan", "pipe", "--on", "gpubox", "--matrix")
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if "phase=" in ln]
    assert "trained: 1 (phase=train, gpus=0)" in rows[1] and "trained: 3 (phase=train, gpus=1)" in rows[3], rows
    fc = json.loads(cli("plan", "pipe", "--on", "gpubox", "--matrix", "--json").stdout)
    assert [p["reads"] for p in fc["points"]][:2] == [[], ["trained: 1 (phase=train, gpus=0)"]]


def test_a_cycle_or_a_point_not_in_the_matrix_is_refused_at_its_line(cli, tb_home: Path) -> None:  # type: ignore[no-untyped-def]
    cyc = PIPE.replace("reads: {phase: train}}", "reads: {phase: train}}\n  - {name: back, point: {phase: train}, "
                       "reads: {phase: eval}}")
    _suite(tb_home, "cyc", cyc)
    for args in (("show", "cyc"), ("run", "cyc", "--matrix", "--dry-run"), ("plan", "cyc", "--matrix"),
                 ("rehearse", "cyc", "--matrix")):
        r = cli(*args)
        flat = " ".join(r.stderr.split())
        assert r.returncode == 2 and "after: the points read each other in a cycle: phase=eval, gpus=0 -> " \
            "phase=train, gpus=0 -> phase=eval, gpus=0" in flat and f"cyc.yml:{line_of(cyc, 'after:')}" in flat, \
            (args, flat)
    missing = PIPE.replace("gpus: [0, 1]", "gpus: [0, 1]\n  - {phase: eval, gpus: 2}").replace(
        "matrix:\n  phase: [eval, train]\n  gpus: [0, 1]\n  - ", "matrix:\n  - {phase: train, gpus: 0}\n  - "
        "{phase: eval, gpus: 0}\n  - ")
    _suite(tb_home, "gap", missing)
    r = cli("show", "gap")
    flat = " ".join(r.stderr.split())
    assert r.returncode == 2 and "point phase=eval, gpus=2 reads point phase=train, gpus=2, which is no point of " \
        "the matrix" in flat and f"gap.yml:{line_of(missing, 'reads:')}" in flat, flat


def test_a_reading_point_alone_or_without_the_point_it_reads_is_refused(cli) -> None:  # type: ignore[no-untyped-def]
    where = f"pipe.yml:{line_of(PIPE, 'reads:')}"
    r = cli("run", "pipe", "--on", "gpubox", "-p", "phase=eval")
    flat = " ".join(r.stderr.split())
    assert r.returncode == 2 and "reads the output of point phase=train, gpus=0 (after: trained)" in flat \
        and where in flat and "testbed run pipe --matrix" in flat, flat
    r = cli("run", "pipe", "--on", "gpubox", "--matrix", "-p", "phase=eval", "--dry-run")
    flat = " ".join(r.stderr.split())
    assert r.returncode == 2 and "which is not among the points to run" in flat and where in flat, flat
    assert cli("run", "pipe", "--on", "gpubox", "-p", "phase=eval", "--dry-run").returncode == 0  # placeholders


class _Store:
    """What the campaign's driver asks of the state: a campaign row, the hosts and the runs (each run ends as
    soon as it starts, succeeded unless its point is in ``fail``)."""

    def __init__(self, row: Any) -> None:
        self.row, self.runs, self.started = row, {}, []

    def campaign(self, cid: str) -> Any:
        return self.row

    def hosts(self, testbed: str) -> list[Any]:
        return [SimpleNamespace(name=n) for n in ("a", "b", "c", "d")]

    def run(self, rid: str) -> Any:
        return self.runs.get(rid)

    def save_campaign(self, cid: str, pts: list[Any], status: str | None = None) -> None:
        if status:
            self.row.status = status

    def set_campaign_info(self, cid: str, info: Any) -> None:
        pass


def test_the_campaign_starts_a_reader_after_the_point_it_reads_on_its_hosts(cli, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from testbed import sources
    from testbed.records import CampaignInfo, CampaignPoint, CampaignRecord
    from testbed.run import campaign, runner
    from testbed.suite import expand_matrix

    s = load_suite("pipe")
    pts = expand_matrix(s, {})
    row = CampaignRecord(id="c1", suite="pipe", testbed="gpubox", points=[CampaignPoint(params=p) for p in pts],
                         status="running", created=0.0, info=CampaignInfo())
    st = _Store(row)
    fail = {("train", 1)}
    real = runner.plan_run
    seen: list[tuple[str, list[str] | None, dict[str, str] | None]] = []

    def plan_run(suite: Any, testbed: Any, params: dict[str, Any], **kw: Any) -> Any:
        kw.pop("store", None)
        seen.append((params["phase"], kw.get("only_hosts"), kw.get("reads")))
        hosts = kw.pop("only_hosts", None)
        p = real(suite, testbed, params, dry_run=True, **kw)
        if hosts is not None:
            p.hosts = [h for h in p.hosts if h.name in hosts][:2] or p.hosts
        return p

    def start_run(plan: Any, campaign: str, store: Any) -> None:
        bad = (plan.params["phase"], plan.params["gpus"]) in fail
        st.runs[plan.run_id] = SimpleNamespace(status="failed" if bad else "succeeded", reason=None,
                                               info=SimpleNamespace(hosts=plan.host_names))
        st.started.append(plan)

    monkeypatch.setattr(runner, "plan_run", plan_run)
    monkeypatch.setattr(runner, "start_run", start_run)
    monkeypatch.setattr(runner, "ensure_supervisor", lambda *a: None)
    monkeypatch.setattr(sources, "for_suite", lambda *a, **k: {})
    lines: list[str] = []
    out = campaign.drive("c1", progress=lines.append, poll=0.01, timeout=30, store=st)  # type: ignore[arg-type]
    started = [(p.params["phase"], p.params["gpus"]) for p in st.started]
    assert started == [("train", 0), ("eval", 0), ("train", 1)], started  # eval at gpus=1 never starts
    reader = st.started[1]
    assert reader.host_names == st.started[0].host_names  # on the hosts of the point it reads
    assert any(f"--model {st.started[0].run_dir}/model.pt" in r.command for r in reader.ranks)
    assert [p.status for p in out.points] == ["succeeded", "succeeded", "failed", "failed"] and out.status == "failed"
    assert any("not run: the point it reads (phase=train, gpus=1) did not succeed" in ln for ln in lines), lines
