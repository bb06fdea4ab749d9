"""datastall-emulator against what the real artifact does when its steps run in order on a real node.

Each test reads its facts from the real repositories at their pinned commits (../shared/artifacts; skipped when
absent): the files gpufs commits, main-measure-time-emulator.py's parser and the paths it opens, and the settings
of figure3.sh ... figure6.sh. Plans are built statically (no host).
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from artifacts import ARTIFACTS, artifact, plan_for, points, python_calls, read_parser

from testbed.records import RunPlan
from testbed.spec import inventory_path, load_testbed
from testbed.suite import load_suite

SUITE = "datastall-emulator"
SCRIPT = "main-measure-time-emulator.py"
CHECKOUT = "~/gpufs"  # the suite's source (and the profile's gpufs build): the artifact gpufs
APP = "emulator/datastall"
FIGURES = {"3": "figure3.sh", "3-100": "figure3_100.sh", "4": "figure4.sh", "5": "figure5.sh", "6": "figure6.sh"}


def _app() -> Path:
    return artifact("gpufs") / APP


def _in_checkout(path: str) -> Path | None:
    """The artifact file a host path under the checkout stands for (None: outside the checkout)."""
    if path == CHECKOUT or path.startswith(CHECKOUT + "/"):
        return artifact("gpufs") / path[len(CHECKOUT):].lstrip("/")
    return None


@cache
def _parser() -> Any:
    return read_parser(_app() / SCRIPT)


def _emulator_calls(plan: RunPlan) -> list[Any]:
    """(argv namespace) of every emulator run of the point, in order, parsed by the script's own parser."""
    r = plan.ranks[0]
    parser = _parser()
    return [parser.parse(c.argv) for c in python_calls(r.command, r.cwd) if c.script.endswith(SCRIPT)]


def _written(plan: RunPlan) -> list[str]:
    """Host paths the launch writes: its redirections, and the per-batch CSV the emulator writes in its folder."""
    r = plan.ranks[0]
    here = r.cwd or plan.run_dir
    out = []
    for target in re.findall(r"(?<![0-9&>])>\s*([^\s&;|]+)", r.command):
        if not target.startswith("/"):  # /dev/null, /proc, /sys
            out.append(target if target.startswith("~") else f"{here}/{target}")
    for a in _emulator_calls(plan):
        out.append(f"{here}/{a.gpu_type}/{a.arch}-batch{a.batch_size}.csv")
    return out


_PLANS: dict[str, RunPlan] = {}


def _plan(given: dict[str, Any]) -> RunPlan:
    key = repr(sorted(given.items()))
    if key not in _PLANS:
        _PLANS[key] = plan_for(SUITE, given)
    return _PLANS[key]


def _all_points() -> list[dict[str, Any]]:
    return points(SUITE) + [{"figure": f, "model": "alexnet"} for f in FIGURES]


# --- class 1 and 4: the run's outputs over the authors' committed ones, in the source checkout ------------------
@pytest.mark.slow
def test_a_run_writes_no_file_the_checkout_commits_and_collects_none() -> None:
    """The emulator writes <gpu-type>/<arch>-batch<b>.csv in its folder (main-measure-time-emulator.py:317, 484) and
    the suite redirects its output and vmtouch's into outputsfigN/: in the checkout, these are the authors' own
    committed files (outputsfig3/outputresnet18.txt, p100/resnet18-batch256.csv, ...). Overwritten in place, a run's
    results are tracked files modified: the next run's source checkout (git checkout --force) puts the authors'
    copies back before a campaign is collected, and collect leaves out tracked files that are unchanged, so every run
    but the last loses its outputs (and a glob over the checkout matches the authors' rows)."""
    src = (_app() / SCRIPT).read_text()
    assert '"{}/{}-batch{}.csv".format(args.gpu_type, args.arch, args.batch_size)' in src  # the fact used above
    assert (_app() / "outputsfig3" / "outputresnet18.txt").is_file()  # the authors' outputs are committed
    problems = []
    for given in _all_points():
        plan = _plan(given)
        for path in _written(plan):
            local = _in_checkout(path)
            if local is not None and local.exists():
                problems.append(f"{given}: writes {path}, a file the checkout commits")
    for pattern in load_suite(SUITE).outputs if isinstance(load_suite(SUITE).outputs, list) else []:
        local = _in_checkout(pattern)
        if local is not None:
            rel = str(local.relative_to(artifact("gpufs")))
            hits = sorted(artifact("gpufs").glob(rel))
            if hits:
                problems.append(f"output {pattern} matches {len(hits)} committed files, e.g. {hits[0].name}")
    assert not problems, "\n".join(problems[:20])


@pytest.mark.slow
def test_the_emulator_finds_its_profile_in_the_folder_it_runs_in() -> None:
    """profile.csv is opened by relative path (main-measure-time-emulator.py:361): wherever the rank runs, the
    real profile.csv must be there (the checkout's folder, or a copy of the checkout's file)."""
    assert "pd.read_csv('profile.csv'" in (_app() / SCRIPT).read_text()
    for given in _all_points():
        plan = _plan(given)
        r = plan.ranks[0]
        here = r.cwd or plan.run_dir
        local = _in_checkout(here)
        if local is not None:
            assert (local / "profile.csv").is_file(), given
            continue
        m = re.search(r"(?:^|\n)\s*(?:cp|ln -sfn?|ln -s)\s+(\S+)\s+(?:\./)?profile\.csv\b", r.command)
        assert m, f"{given}: the rank runs in {here} and nothing puts profile.csv there"
        origin = _in_checkout(m[1])
        assert origin is not None and origin.is_file(), f"{given}: {m[1]} is not the checkout's profile.csv"


# --- class 6: a point run alone takes its own figure's settings -------------------------------------------------
def _script(name: str) -> tuple[dict[str, str], dict[str, list[str]], list[str]]:
    """(scalars, arrays, emulator command lines) of a figure script."""
    text = (_app() / name).read_text()
    scalars = dict(re.findall(r'^(\w+)="([^"]*)"', text, re.M))
    arrays = {k: re.findall(r'"([^"]*)"', v) for k, v in re.findall(r"^(\w+)=\(([^)]*)\)", text, re.M)}
    runs = [ln.strip() for ln in text.splitlines() if SCRIPT in ln and not ln.lstrip().startswith("#")]
    return scalars, arrays, runs


def _value(token: str, scalars: dict[str, str], arrays: dict[str, list[str]]) -> str:
    if token.startswith("$"):
        name = token[1:]
        return scalars[name] if name in scalars else arrays[name][0]
    return token


def _flag(line: str, flag: str) -> str:
    m = re.search(rf"{flag}[= ](\S+)", line)
    assert m, f"{flag} not in {line}"
    return m[1]


def _cases() -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """(figure, the -p values of a point run alone, what figureN.sh runs for it) for every point of every script."""
    out = []
    for fig, name in FIGURES.items():
        scalars, arrays, runs = _script(name)
        main, fill = runs[-1], (runs[0] if len(runs) > 1 else None)
        models = arrays.get("models") or [scalars["model"]]
        limited = main.startswith("cgexec")
        if "cache_sizes" in arrays:  # figure3.sh: a limit per model
            limits = [[x] for x in arrays["cache_sizes"]]
        elif "limits" in arrays:  # figure4.sh: the limits are the sweep
            limits = [arrays["limits"]] * len(models)
        else:
            limits = [[scalars["limit"]] if "limit" in scalars else [None]] * len(models)
        wtok = _flag(main, "--workers")
        workers = arrays["n_workers"] if wtok == "$worker" else [_value(wtok, scalars, arrays)]
        for model, lims in zip(models, limits, strict=True):
            for lim in lims:
                for w in workers:
                    given = {"figure": fig}
                    if len(models) > 1:
                        given["model"] = model
                    if len(lims) > 1:
                        given["mem_limit"] = lim
                    if len(workers) > 1:
                        given["workers"] = w
                    want = {"arch": model, "workers": int(w), "epochs": int(_flag(main, "--epoch")),
                            "gpu_type": _value(_flag(main, "--gpu-type"), scalars, arrays),
                            "gpu_count": int(_value(_flag(main, "--gpu-count"), scalars, arrays)),
                            "limit": lim if limited else None, "fill": None}
                    if fill is not None:
                        want["fill"] = {"arch": _flag(fill, "--arch"), "epochs": int(_flag(fill, "--epoch")),
                                        "workers": int(_value(_flag(fill, "--workers"), scalars, arrays))}
                    out.append((fig, given, want))
    return out


@pytest.mark.slow
def test_a_point_run_alone_takes_its_own_figures_settings() -> None:
    """-p figure=4 -p mem_limit=10g (no --matrix) must emulate figure4.sh's v100, -p figure=5 -p workers=6 its one
    GPU and one epoch, -p figure=3-100 its 30g limit, -p figure=3 -p model=vgg11 its 9g: each from the script."""
    problems = []
    for fig, given, want in _cases():
        plan = _plan(given)
        calls = _emulator_calls(plan)
        cmd = plan.ranks[0].command
        main = calls[-1]
        got = {"arch": main.arch, "workers": main.workers, "epochs": main.epochs, "gpu_type": main.gpu_type,
               "gpu_count": main.gpu_count}
        for k, v in got.items():
            if v != want[k]:
                problems.append(f"figure {fig} {given}: {k} {v!r}, {FIGURES[fig]} runs {want[k]!r}")
        m = re.search(r"echo (\S+) \| sudo tee \S*memory\.limit_in_bytes", cmd)
        if (m[1] if m else None) != want["limit"] or ("cgexec" in cmd) != (want["limit"] is not None):
            problems.append(f"figure {fig} {given}: memory limit {m[1] if m else None}, "
                            f"{FIGURES[fig]} uses {want['limit']}")
        if want["fill"] is not None:
            fill = calls[0] if len(calls) == 2 else None
            if fill is None or {"arch": fill.arch, "epochs": fill.epochs, "workers": fill.workers} != want["fill"]:
                problems.append(f"figure {fig} {given}: fill epoch {fill}, {FIGURES[fig]} runs {want['fill']}")
    assert not problems, "\n".join(problems)


# --- class 8: a parameter that does nothing -------------------------------------------------------------------
@pytest.mark.parametrize("fig", ["5", "6"])
def test_a_memory_limit_where_the_figure_sets_none_is_refused(fig: str) -> None:
    """figure5.sh and figure6.sh run the emulator with no cgexec: -p mem_limit there was silently ignored (the run
    looked limited in its parameters and was not). The prepare step refuses it; with none given it passes."""
    _, _, runs = _script(FIGURES[fig])
    assert not any(r.startswith("cgexec") for r in runs)  # the fact: no memory cgroup in this figure
    for mem, ok in (("4g", False), (None, True)):
        given = {"figure": fig, "model": "alexnet", **({"mem_limit": mem} if mem else {})}
        plan = _plan(given)
        assert "cgexec" not in plan.ranks[0].command
        (step,) = plan.prepare
        cmd = next(iter(step.commands.values()))
        assert "sudo" not in cmd and "cgcreate" not in cmd  # safe to run here: it only reports
        rc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30, check=False)
        assert (rc.returncode == 0) == ok, (given, cmd, rc.stderr)


# --- class 1: the profile's build and the suite's source in one folder ------------------------------------------
def test_profile_and_suite_check_out_the_audited_commit_in_the_shared_folder() -> None:
    """The profile builds gpufs into ~/gpufs and the suite checks it out there again each run. With the branch name
    the profile checks out the branch's newest commit (ls-remote, detached) and the suite a local branch created once
    and never moved on: set-up and runs disagree once the branch moves. Both pin the commit the artifact was
    checked at (gpufs.SOURCE)."""
    src = (ARTIFACTS / "gpufs.SOURCE")
    if not src.is_file():
        pytest.skip(f"{src} is absent")
    commit = re.search(r"^commit: ([0-9a-f]{40})$", src.read_text(), re.M)
    assert commit
    (source,) = [s for s in load_suite(SUITE).sources if s.name == "gpufs"]
    assert (source.ref, source.path) == (commit[1], CHECKOUT)
    profile = yaml.safe_load((Path(__file__).resolve().parents[1] / "experiments" / SUITE / "profile.yml").read_text())
    builds = [r["vars"] for r in profile["roles"] if r["role"] == "source_build" and
              r["vars"]["source_build_name"] == "gpufs"]
    assert [b["source_build_version"] for b in builds] == [commit[1]]
    assert builds[0]["source_build_dest"].endswith("/gpufs")  # the same folder as the suite's source


# --- class 3 and 7: the testbed as it really is -----------------------------------------------------------------
def test_the_chameleon_testbed_declares_the_node_it_reserves() -> None:
    """The OSRE README's tested node ("TACC zen3", CC-Ubuntu20.04) is a CPU-only bare-metal node with its own home:
    the spec says so (hardware:) instead of leaving it to defaults nobody checked."""
    readme = (artifact("OSRE_DELIVERABLE") / "README.md").read_text()
    assert re.search(r'TACC "zen3" node, image "CC-Ubuntu20.04"', readme)
    raw = yaml.safe_load(inventory_path("chameleon").read_text())
    assert "hardware" in raw
    spec = load_testbed("chameleon")
    assert spec.provider.node_type == "compute_zen3" and spec.provider.image == "CC-Ubuntu20.04"  # type: ignore[union-attr]
    assert spec.hardware.gpu is None and load_suite(SUITE).requires.accelerator in (None, "cpu")
    assert spec.hardware.shared_home is False
    assert spec.hardware.interface is None  # not guessed: the suite needs none
