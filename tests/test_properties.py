"""The one-message contract, kept found: Hypothesis generates specs, suites, parameters and command lines.

Every generated input goes through the real CLI entry point (``cli.main()``) in this process, except local-kind
specs, which are loaded by the spec layer (provisioning them would build hosts). Whatever the input, the outcome
is a success, or exit 1 or 2 with ONE ``error:`` message that has ``where:`` and ``fix:`` lines: never a
traceback, never an "internal error", never a refusal that recorded anything in state, never a network
namespace. Generated lab hosts are on loopback with a closed port, cloud specs run without credentials, and
every ``run`` is a ``--dry-run``: nothing here reaches past 127.0.0.1.

Examples are derandomized (the same on every run, so CI is reproducible) and bounded in number;
``TB_PROPERTY_EXAMPLES=2000 TB_PROPERTY_RANDOM=1`` explores further.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from leftovers import remove_control_dirs_under  # noqa: E402
from test_bad_inputs import _kernel_objects, _recorded, run_main  # noqa: E402

SETTINGS = settings(max_examples=int(os.environ.get("TB_PROPERTY_EXAMPLES", "120")), deadline=None,
                    derandomize=not os.environ.get("TB_PROPERTY_RANDOM"), database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# values users get wrong: shell and YAML metacharacters, templates, paths, addresses, numbers at the edges
ODD = ["", " ", "-", "--", "a\nb", "x;reboot", "$(id)", "`id`", "'", '"', "{{ 1/0 }}", "{{ nope }}", "{% if %}",
       "${HOME}", "${NOPE_UNSET_VAR}", "~", "~/.ssh/id_rsa", "../../etc/passwd", "/etc/passwd", "*", "[", "nan",
       "inf", "-1", "0", "1e309", "0x10", "127.0.0.1", "::1", "1.2.3.0/28", "10.9.0.0/29", "999.1.1.1",
       "-oProxyCommand=touch /tmp/tb-pwned", "root", "CHI@UC", "v4-8", "ümlaut", "a" * 300, "\x00", "\t", "null",
       "true", "yes", "local", "SIGKILL", "SIGNOPE", "step 1"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(allow_nan=True),
                    st.sampled_from(ODD), st.text(max_size=12))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(
    st.sampled_from(["name", "hosts", "address", "port", "user", "type", "default", "x", "min", "max", "run"]) |
    st.text(max_size=8), c, max_size=3), max_leaves=8)


def near(v: Any) -> st.SearchStrategy[Any]:
    """A value of the same type as ``v``, often at an edge: how a user's honest edit goes wrong."""
    if isinstance(v, bool):
        return st.booleans()
    if isinstance(v, int):
        return st.integers(-3, 70000) | st.sampled_from([0, -1, 2**31, 2**63])
    if isinstance(v, float):
        return st.floats(allow_nan=True, allow_infinity=True)
    if isinstance(v, str):
        return st.sampled_from(ODD) | st.text(max_size=6).map(lambda t: v + t)
    return values


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a node of ``obj`` (the root included)."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], keep_local: bool = False) -> dict[str, Any]:
    """``base`` with 1-3 random edits: a node replaced by a generated value, removed, or given an extra key."""
    import copy

    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 2))):
        if len(_paths(doc)) < 2:
            break
        path = draw(st.sampled_from(_paths(doc)[1:]))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        op = draw(st.sampled_from(["near", "near", "near", "set", "drop", "extra"]))
        if op == "drop":
            del parent[path[-1]]
        elif op == "extra" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["nme", "hots", "extra", "port ", "Provider"]))] = draw(values)
        elif op == "near":
            parent[path[-1]] = draw(near(parent[path[-1]]))
        else:
            parent[path[-1]] = draw(values)
        if keep_local and path[:2] == ("provider", "kind"):
            doc.setdefault("provider", {})
    return doc


def _dump(doc: Any, draw: st.DrawFn) -> str:
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    if draw(st.integers(0, 9)) == 0:  # now and then, break the YAML itself
        i = draw(st.integers(0, len(text)))
        junk = draw(st.sampled_from(["\t", ": :", "- [", "&a [*a]", "{", "'", "\x07", "!!python/name:os.system"]))
        text = text[:i] + junk + text[i:]
    return text


@contextlib.contextmanager
def _isolated(monkeypatch: pytest.MonkeyPatch, factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh working folder (inventories/, experiments/) and state home for one example, under the session's
    temporary folder; removed after the example with the SSH control folders of its testbeds."""
    tmp = Path(tempfile.mkdtemp(prefix="tb-prop-", dir=factory.getbasetemp()))
    for d in ("inventories", "experiments"):
        (tmp / d).mkdir()
    monkeypatch.chdir(tmp)
    monkeypatch.setenv("TESTBED_HOME", str(tmp / ".testbed"))
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("TERM", "dumb")
    for k in [k for k in os.environ if k.startswith(("OS_", "GOOGLE_", "CLOUDSDK_", "TESTBED_DEBUG"))]:
        monkeypatch.delenv(k)
    try:
        yield tmp
    finally:
        monkeypatch.chdir(factory.getbasetemp())
        remove_control_dirs_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def one_message(code: int, out: str, where: str) -> None:
    """The contract: success, or exit 1/2 with exactly one error that says where and what to do."""
    assert "Traceback" not in out and "internal error" not in out, f"{where}\n{out}"
    if code == 0:
        assert not re.search(r"(?m)^error:", out), f"{where}\n{out}"
        return
    assert code in (1, 2), f"{where}: exit {code}\n{out}"
    assert len(re.findall(r"(?m)^error: \S", out)) == 1, f"{where}\n{out}"
    assert re.search(r"(?m)^\s+where: \S", out) and re.search(r"(?m)^\s+fix: +\S", out), f"{where}\n{out}"


def nothing_made(tmp: Path, code: int, testbed: str) -> None:
    if code == 2:  # refused input: nothing recorded
        assert _recorded(tmp / ".testbed") == []
    assert _kernel_objects(tmp / ".testbed", testbed) == []
    assert not Path("/tmp/tb-pwned").exists()


# --- testbed specs -----------------------------------------------------------------------------------------------
SPECS = {
    "lab": {"provider": {"kind": "lab", "connect_timeout": 1,
                         "hosts": [{"name": "h1", "address": "127.0.0.1", "port": 9},
                                   {"name": "h2", "address": "127.0.0.2", "port": 9}]},
            "user": "root", "groups": {"master": ["h1"]}, "vars": {}},
    "chameleon": {"provider": {"kind": "chameleon", "site": "CHI@UC", "count": 2, "node_type": "compute_skylake",
                               "image": "CC-Ubuntu22.04", "hours": 4}, "user": "cc"},
    "gcp-tpu": {"provider": {"kind": "gcp-tpu", "project": "p", "zone": "us-central2-b", "accelerator_type": "v4-8",
                             "runtime_version": "tpu-ubuntu2204-base"}, "user": "tpu"},
    "local": {"provider": {"kind": "local", "hosts": 2, "subnet": "10.77.0.0/28"}, "user": "root",
              "groups": {"master": ["node0"]}},
}


@pytest.mark.slow
@pytest.mark.timeout(600)
@SETTINGS
@given(data=st.data())
def test_any_spec_gets_one_message(data: st.DataObject, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str],
                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    kind = data.draw(st.sampled_from(sorted(SPECS)))
    doc = data.draw(mutated(SPECS[kind]))
    kind_now = doc.get("provider", {}).get("kind") if isinstance(doc.get("provider"), dict) else None
    text = _dump(doc, data.draw)
    with monkeypatch.context() as mp, _isolated(mp, tmp_path_factory) as tmp:
        (tmp / "inventories" / "gen.yml").write_text(text)
        if kind_now == "local":  # provisioning would build hosts: the spec layer answers instead
            from testbed import spec
            from testbed.errors import TestbedError
            from testbed.setup.profiles import check_vars

            try:
                check_vars(spec.load_testbed("gen"))
            except TestbedError as e:
                assert e.code in (1, 2) and e.where and e.fix, e.render()
            return
        code, out = run_main(["provision", "gen"], mp, capsys)
        one_message(code, out, text)
        nothing_made(tmp, code, "gen")
        if code == 0:
            run_main(["destroy", "gen", "--yes"], mp, capsys)


# --- suites and parameters -----------------------------------------------------------------------------------
SUITE = {
    "name": "gen",
    "files": [],
    "parameters": {"n": {"type": "int", "default": 2, "min": 1, "max": 4},
                   "lr": {"type": "float", "default": 0.1, "min": 0},
                   "mode": {"type": "str", "default": "a", "choices": ["a", "b"]}},
    "matrix": {"n": [1, 2], "mode": ["a", "b"]},
    "vars": {"tag": "{{ mode }}-{{ n }}"},
    "placement": {"hosts": "{{ n }}"},
    "env": {"TAG": "{{ tag }}"},
    "steps": {"prepare": [{"name": "p", "run": "echo {{ lr }}"}],
              "launch": {"command": "echo {{ rank }} {{ tag }} > out.txt"},
              "recovery": [{"name": "again", "relaunch": True}],
              "post": [{"name": "q", "run": "true"}]},
    "faults": {"k": {"action": "signal", "signal": "SIGKILL", "rank": "{{ world_size - 1 }}", "when": "step 1"},
               "t": {"action": "signal", "rank": 0, "at": 5}},
    "default_faults": ["k"],
    "timeouts": {"run": 30, "poll": 0.5},
    "outputs": ["out.txt"],
    "checks": [{"name": "c", "file": "out.txt", "contains": "tag"}],
}
PARAM_VALUES = st.one_of(st.sampled_from(ODD), st.integers(-10, 10).map(str), st.floats().map(str), st.text(max_size=8))


@pytest.mark.slow
@pytest.mark.timeout(600)
@SETTINGS
@given(data=st.data())
def test_any_suite_and_parameters_get_one_message(data: st.DataObject, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str],
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    doc = data.draw(st.one_of(st.just(SUITE), mutated(SUITE)))
    text = _dump(doc, data.draw)
    params = data.draw(st.lists(st.tuples(st.sampled_from(["n", "lr", "mode", "nope", "", "n=1"]), PARAM_VALUES),
                                max_size=3))
    argv = ["run", "gen", "--on", "local", "--dry-run"]
    for k, v in params:
        argv += ["-p", f"{k}={v}"]
    argv += data.draw(st.sampled_from([[], ["--matrix"], ["--fault", "t"], ["--fault", "nope"], ["--no-faults"],
                                       ["--source", "x=/nonexistent"], ["--json"]]))
    with monkeypatch.context() as mp, _isolated(mp, tmp_path_factory) as tmp:
        (tmp / "experiments" / "gen.yml").write_text(text)
        code, out = run_main(argv, mp, capsys)
        one_message(code, out, f"{argv}\n{text}")
        assert _recorded(tmp / ".testbed") == []  # a dry run records nothing, valid or not
        nothing_made(tmp, code, "local")


# --- command lines -----------------------------------------------------------------------------------------------
WORDS = st.one_of(st.sampled_from([*ODD, "local", "gen", "results", "--json", "--all", "--to", "--yes", "-p", "--on",
                                    "--", "--timeout", "--probe", "--role", "--profile", "--check", "-f"]),
                  st.text(max_size=10))
COMMANDS = [["status"], ["status", "gen"], ["destroy"], ["exec", "gen", "--"], ["ssh"], ["extend"], ["forget-host"],
            ["run"], ["logs"], ["stop"], ["show"], ["collect"], ["report"], ["list"], ["list", "runs"], ["setup"],
            ["doctor"], ["show", "gen"]]


@pytest.mark.slow
@pytest.mark.timeout(600)
@SETTINGS
@given(data=st.data())
def test_any_command_line_gets_one_message(data: st.DataObject, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str],
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    argv = [*data.draw(st.sampled_from(COMMANDS)), *data.draw(st.lists(WORDS, max_size=5))]
    if argv[0] == "run":
        argv.append("--dry-run")  # never a real run
    with monkeypatch.context() as mp, _isolated(mp, tmp_path_factory) as tmp:
        (tmp / "experiments" / "gen.yml").write_text(yaml.safe_dump(SUITE))
        (tmp / "inventories" / "gen.yml").write_text(yaml.safe_dump(SPECS["lab"]))
        code, out = run_main(argv, mp, capsys)
        one_message(code, out, str(argv))
        nothing_made(tmp, code, "gen")


# --- the classes of bad input, generated -------------------------------------------------------------------------
# Each class below is refused, whatever its spelling or place: exit 2, one message, before anything is built or any
# host touched (the runs are dry runs, the specs lab hosts on a closed loopback port).
BAD = settings(SETTINGS, max_examples=max(15, int(os.environ.get("TB_PROPERTY_EXAMPLES", "120")) // 4))
NAME = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
Refuse = Callable[..., str]  # the 'refused' fixture: run a command line on generated files, assert it was refused


def _suite(**extra: Any) -> dict[str, Any]:
    return {"name": "gen", "steps": {"launch": {"command": "true"}}, **extra}


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """``refused(argv, suite=..., spec=..., raw=..., frags=..., line=..., env=...)``: run ``argv`` on a fresh folder
    holding the generated suite (experiments/gen.yml) or spec (inventories/gen.yml), with ``env`` set; assert it
    was refused as bad input (exit 2, one message, the fragments, ``line``: a file:line in ``where``) with nothing
    made. Returns the output."""
    def run(argv: list[str], suite: dict[str, Any] | None = None, spec: dict[str, Any] | None = None,
            raw: str | None = None, frags: tuple[str, ...] = (), line: bool = False,
            env: dict[str, str] | None = None) -> str:
        with monkeypatch.context() as mp, _isolated(mp, tmp_path_factory) as tmp:
            for k, v in (env or {}).items():
                mp.setenv(k, v)
            text = raw if raw is not None else yaml.safe_dump(suite if suite is not None else spec, sort_keys=False)
            folder = "experiments" if suite is not None or raw is not None else "inventories"
            (tmp / folder / "gen.yml").write_text(text)
            code, out = run_main(argv, mp, capsys)
            one_message(code, out, f"{argv}\n{text}")
            assert code == 2, f"{argv}: exit {code}\n{out}\n{text}"
            flat = " ".join(out.split()).lower()
            for f in frags:
                assert f.lower() in flat, f"missing {f!r}:\n{out}\n{text}"
            if line:
                assert re.search(r"(?m)^\s+where: \S*gen\.yml:\d+", out), f"no file:line:\n{out}\n{text}"
            nothing_made(tmp, code, "gen")
            return out
    return run


@st.composite
def huge_matrices(draw: st.DrawFn) -> dict[str, list[int]]:
    """Axes whose product is over the bound (up to 60**8 points), or with an empty axis."""
    from testbed.suite import MAX_MATRIX_POINTS

    names = draw(st.lists(NAME, min_size=1, max_size=8, unique=True))
    sizes = [draw(st.integers(1, 60)) for _ in names]
    if draw(st.integers(0, 4)) == 0:
        sizes[draw(st.integers(0, len(sizes) - 1))] = 0
    elif math.prod(sizes) <= MAX_MATRIX_POINTS:
        sizes[0] = MAX_MATRIX_POINTS // math.prod(sizes[1:]) + 1
    return {n: list(range(s)) for n, s in zip(names, sizes, strict=True)}


@pytest.mark.slow
@pytest.mark.timeout(600)
@BAD
@given(matrix=huge_matrices(), listed=st.booleans())
def test_huge_matrices_are_counted_not_built(matrix: dict[str, list[int]], listed: bool,
                                             refused: Refuse) -> None:
    import time

    from testbed.suite import MAX_MATRIX_POINTS

    params = {k: {"type": "int", "default": 0} for k in matrix}
    n = math.prod(len(v) for v in matrix.values())
    if listed and n:  # the list form: the points written out, as many as the bound allows and one more
        points: Any = [dict.fromkeys(matrix, i) for i in range(MAX_MATRIX_POINTS + 1)]
        frags: tuple[str, ...] = (f"{MAX_MATRIX_POINTS + 1:,} runs",)
    else:
        points = matrix
        empty = [k for k, v in matrix.items() if not v]
        frags = (f"axis '{empty[0]}' has no values",) if empty else \
            (f"{n:,} runs", *(f"{k}: {len(v)}" for k, v in matrix.items()))
    t0 = time.monotonic()
    refused(["run", "gen", "--matrix", "--dry-run"], _suite(parameters=params, matrix=points),
             frags=frags, line=True)
    # counted, not expanded: building 10^8 points would take hours; a generous bound, since the CLI runs under load
    assert time.monotonic() - t0 < 120


NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
NON_FINITE_WORDS = st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity", "-Infinity", "+inf", "1e999"])


@pytest.mark.slow
@pytest.mark.timeout(600)
@BAD
@given(data=st.data())
def test_non_finite_numbers_are_refused(data: st.DataObject, refused: Refuse) -> None:
    x = data.draw(NON_FINITE)
    word = data.draw(NON_FINITE_WORDS)
    where = data.draw(st.sampled_from(["timeouts", "step-timeout", "fault-at", "param-min", "param-max",
                                       "param-default", "matrix", "lab", "chameleon", "role-var", "exec", "extend",
                                       "-p", "env-var"]))
    if where == "timeouts":
        key = data.draw(st.sampled_from(["prepare", "run", "post", "grace", "unreachable", "poll"]))
        refused(["run", "gen", "--dry-run"], _suite(timeouts={key: x}), frags=("finite",), line=True)
    elif where == "step-timeout":
        suite = _suite()
        suite["steps"]["prepare"] = [{"run": "true", "timeout": x}]
        refused(["run", "gen", "--dry-run"], suite, frags=("finite",), line=True)
    elif where == "fault-at":
        refused(["run", "gen", "--dry-run"], _suite(
            faults={"k": {"action": "signal", "rank": 0, "at": x}}, default_faults=["k"]), frags=("finite",),
            line=True)
    elif where in ("param-min", "param-max", "param-default"):
        kind = data.draw(st.sampled_from(["int", "float"]))
        refused(["run", "gen", "--dry-run"], _suite(
            parameters={"n": {"type": kind, where[6:]: x}}), frags=("finite" if where != "param-default" or
                                                                     kind == "float" else "whole number",),
            line=True)
    elif where == "matrix":
        kind = data.draw(st.sampled_from(["int", "float"]))
        refused(["run", "gen", "--matrix", "--dry-run"], _suite(
            parameters={"n": {"type": kind, "default": 1}}, matrix={"n": [1, x]}), line=True)
    elif where == "lab":
        key = data.draw(st.sampled_from(["connect_timeout", "ssh_timeout"]))
        refused(["provision", "gen"], spec={"provider": {
            "kind": "lab", key: x, "hosts": [{"name": "h1", "address": "127.0.0.1", "port": 9}]}}, line=True)
    elif where == "chameleon":
        refused(["provision", "gen"], spec={"provider": {"kind": "chameleon", "hours": x}},
                 line=True)
    elif where == "role-var":
        refused(["provision", "gen"], spec={"provider": {
            "kind": "lab", "hosts": [{"name": "h1", "address": "127.0.0.1", "port": 9}]},
            "vars": {data.draw(st.sampled_from(["mpi_slots", "memlock_limit", "gpu_check_min_gpus"])): x}},
            frags=("not a number a role can use",), line=True)
    elif where == "exec":
        refused(["exec", "gen", "--timeout", word, "--", "true"], raw="",
                 frags=("--timeout",) if word != "1e999" else ())
    elif where == "extend":
        refused(["extend", "gen", "--hours", word], raw="", frags=("--hours",))
    elif where == "-p":
        refused(["run", "gen", "--dry-run", "-p", f"lr={word}"], _suite(
            parameters={"lr": {"type": "float", "default": 0.1}}), frags=("finite",))
    else:  # a ${VAR} that expands to a non-finite number where a number goes
        refused(["run", "gen", "--dry-run"], _suite(timeouts={"run": "${TB_GEN_NUMBER}"}),
                line=True, env={"TB_GEN_NUMBER": word})


# names that are not names: empty, blank, digits first, spaces, dashes, shell and YAML characters, non-ASCII
NOT_NAMES = st.one_of(st.sampled_from(["", " ", "\t", "1A", "A-B", "A B", "A;B", "A=B", "$A", "A.B", "ü", "A\nB",
                                       "-A", "A/B", "`id`"]),
                      st.text(min_size=1, max_size=6).filter(lambda t: not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*",
                                                                                           t)))


@pytest.mark.timeout(600)
@BAD
@given(data=st.data(), bad=NOT_NAMES)
def test_empty_keys_and_names_that_are_not_names(data: st.DataObject, bad: str, refused: Refuse) -> None:
    place = data.draw(st.sampled_from(["env", "launch-env", "parameters", "faults", "spec-vars", "yaml-null",
                                       "--var", "-p"]))
    lab = {"kind": "lab", "hosts": [{"name": "h1", "address": "127.0.0.1", "port": 9}]}
    if place == "env":
        refused(["run", "gen", "--dry-run"], _suite(env={bad: "1"}), line=True)
    elif place == "launch-env":
        refused(["run", "gen", "--dry-run"],
                 {"name": "gen", "steps": {"launch": {"command": "true", "env": {bad: "1"}}}}, line=True)
    elif place == "parameters":
        refused(["run", "gen", "--dry-run"], _suite(parameters={bad: {"type": "int"}}), line=True)
    elif place == "faults" and not bad.strip():  # a fault may have any name but an empty one
        refused(["run", "gen", "--dry-run"], _suite(
            faults={bad: {"action": "signal", "rank": 0, "at": 1}}), frags=("an empty key",), line=True)
    elif place == "spec-vars":
        refused(["provision", "gen"], spec={"provider": lab, "vars": {bad: 1}}, line=True)
    elif place == "yaml-null":  # null, ~ and '' as keys anywhere in a mapping
        key = data.draw(st.sampled_from(["null", "~", "''", '""']))
        text = yaml.safe_dump(_suite(env={"A": "1"}), sort_keys=False).replace("  A: '1'", f"  {key}: '1'")
        refused(["run", "gen", "--dry-run"], raw=text, frags=("an empty key in env",), line=True)
    elif place == "--var" and "=" not in bad:
        refused(["setup", "gen", "--var", f"{bad}=1"], raw="", frags=("--var",))
    elif place == "-p" and "=" not in bad:
        refused(["run", "gen", "--dry-run", "-p", f"{bad}=1"], _suite(
            parameters={"n": {"type": "int", "default": 1}}), frags=("is not key=value",))


@pytest.mark.timeout(600)
@BAD
@given(data=st.data(), names=st.lists(NAME, min_size=1, max_size=5))
def test_two_things_of_one_name(data: st.DataObject, names: list[str], refused: Refuse) -> None:
    twice = [*names, data.draw(st.sampled_from(names))]
    twice = data.draw(st.permutations(twice))
    place = data.draw(st.sampled_from(["steps", "recovery", "post", "sources", "checks", "lab-hosts", "group",
                                       "matrix", "default-faults", "-p", "--source", "--fault"]))
    if place in ("steps", "recovery", "post"):
        suite = _suite()
        suite["steps"][{"steps": "prepare"}.get(place, place)] = [{"name": n, "run": "true"} for n in twice]
        refused(["run", "gen", "--dry-run"], suite, frags=("are named",), line=True)
    elif place == "sources":
        refused(["run", "gen", "--dry-run"], _suite(sources=[
            {"name": n, "repo": "https://example.invalid/x.git", "path": f"~/{i}"} for i, n in enumerate(twice)]),
            frags=("two sources are named",), line=True)
    elif place == "checks":
        refused(["run", "gen", "--dry-run"], _suite(checks=[
            {"name": n, "file": "rank0.out"} for n in twice]), frags=("two checks are named",), line=True)
    elif place == "lab-hosts":
        hosts = [{"name": n.replace("_", "-"), "address": "127.0.0.1", "port": 9} for n in twice]
        refused(["provision", "gen"], spec={"provider": {"kind": "lab", "hosts": hosts}},
                 frags=("two hosts are named",), line=True)
    elif place == "group":
        hosts = [{"name": n.replace("_", "-"), "address": "127.0.0.1", "port": 9} for n in dict.fromkeys(names)]
        refused(["provision", "gen"], spec={"provider": {"kind": "lab", "hosts": hosts},
                                                        "groups": {"g": [n.replace("_", "-") for n in twice]}},
                 frags=("twice",), line=True)
    elif place == "matrix":
        values = [len(n) * 7 + sum(map(ord, n)) for n in twice]  # a value per name: equal names, equal values
        refused(["run", "gen", "--matrix", "--dry-run"], _suite(
            parameters={"n": {"type": "int", "default": 0}}, matrix={"n": values}), frags=("twice",), line=True)
    elif place == "default-faults":
        faults = {n: {"action": "signal", "rank": 0, "at": 1} for n in names}
        refused(["run", "gen", "--dry-run"], _suite(faults=faults, default_faults=twice),
                 frags=("twice",), line=True)
    else:
        option = {"-p": "-p", "--source": "--source", "--fault": "--fault"}[place]
        args = [w for n in twice for w in (option, f"{n}=1" if option != "--fault" else n)]
        faults = {n: {"action": "signal", "rank": 0, "at": 1} for n in names}
        refused(["run", "gen", "--dry-run", *args], _suite(
            parameters={n: {"type": "int", "default": 0} for n in names}, faults=faults), frags=("twice",))


SEPARATORS = st.text(alphabet=", \t", max_size=6)


@pytest.mark.timeout(600)
@BAD
@given(data=st.data(), empty=SEPARATORS)
def test_empty_selections_never_widen_to_every_host(data: st.DataObject, empty: str, refused: Refuse) -> None:
    place = data.draw(st.sampled_from(["--limit", "--hosts", "step-on", "launch-on", "checks-on", "fault-host",
                                       "outputs"]))
    if place == "--limit":
        refused(["setup", "gen", "--limit", empty], raw="", frags=("names no host",))
    elif place == "--hosts":
        refused(["exec", "gen", "--hosts", empty, "--", "true"], raw="", frags=("names no host",))
    elif place == "step-on":
        suite = _suite()
        suite["steps"]["prepare"] = [{"run": "true", "on": empty}]
        refused(["run", "gen", "--on", "local", "--dry-run"], suite, frags=("selects no host",),
                 line=True)
    elif place == "launch-on":
        refused(["run", "gen", "--on", "local", "--dry-run"],
                 {"name": "gen", "steps": {"launch": {"command": "true", "on": empty}}},
                 frags=("selects no host",), line=True)
    elif place == "checks-on":
        refused(["run", "gen", "--on", "local", "--dry-run"], _suite(checks=[
            {"name": "c", "file": "x", "on": empty}]), frags=("selects no host",), line=True)
    elif place == "fault-host":  # a template that renders to nothing
        refused(["run", "gen", "--on", "local", "--dry-run"], _suite(
            parameters={"victim": {"type": "str", "default": empty or ","}},
            faults={"k": {"action": "kill-host", "host": "{{ victim }}", "at": 1}}, default_faults=["k"]),
            frags=("selects no host",), line=True)
    elif empty.strip():  # outputs: a key of commas (an empty key is refused as such)
        refused(["run", "gen", "--on", "local", "--dry-run"], _suite(outputs={empty: ["x"]}),
                 frags=("selects no host",), line=True)


@pytest.mark.slow
@pytest.mark.timeout(600)
@BAD
@given(data=st.data(), name=st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True))
def test_hosts_that_do_not_exist(data: st.DataObject, name: str, refused: Refuse) -> None:
    """The local testbed's hosts are node0..node3 (groups master, workers): any other name is refused."""
    hypothesis.assume(name not in {"node0", "node1", "node2", "node3", "master", "workers", "all"})
    place = data.draw(st.sampled_from(["fault-host", "master", "step-on", "group"]))
    if place == "fault-host":
        refused(["run", "gen", "--on", "local", "--dry-run"], _suite(
            faults={"k": {"action": "kill-host", "host": name, "at": 1}}, default_faults=["k"]),
            frags=(f"'{name}' is no host or group",), line=True)
    elif place == "master":
        refused(["run", "gen", "--on", "local", "--dry-run"], _suite(placement={"master": name}),
                 frags=(f"'{name}' is no host or group",), line=True)
    elif place == "step-on":
        suite = _suite()
        suite["steps"]["post"] = [{"run": "true", "on": f"all,{name}"}]
        refused(["run", "gen", "--on", "local", "--dry-run"], suite,
                 frags=(f"'{name}' is no host or group",), line=True)
    else:
        refused(["provision", "gen"], spec={"provider": {"kind": "lab", "hosts": [
            {"name": "h1", "address": "127.0.0.1", "port": 9}]}, "groups": {"g": ["h1", name]}},
            frags=(f"unknown host '{name}'",), line=True)


# expressions that fail while they are evaluated: arithmetic, missing names, wrong types, results too large
FAILING = st.sampled_from([
    "{{ n / 0 }}", "{{ n // 0 }}", "{{ n % 0 }}", "{{ 1.5 / (n - n) }}", "{{ 'x' + n }}", "{{ n + 'x' }}",
    "{{ n - 'x' }}", "{{ [1, 2][n * 100] }}", "{{ nope }}", "{{ testbed.nope.deeper }}", "{{ n.nope() }}",
    "{{ 10 ** 100000 }}", "{{ 9 ** (9 ** 9) }}", "{{ n ** (10 ** 8) }}", "{{ 'ab' * 10 ** 8 }}", "{{ [0] * 10 ** 9 }}",
    "{{ range(10 ** 9) | list }}", "{{ 1e308 * 10 ** 400 }}", "{{ (n | string)[5:] | float / 0 }}",
    "{{ 'abc' | int + {} }}", "{{ {}.x.y }}", "{{ none_name | default(n) / 0 }}",
])


@pytest.mark.timeout(600)
@BAD
@given(data=st.data(), expr=FAILING)
def test_failing_templates_get_one_message_with_their_line(data: st.DataObject, expr: str, refused: Refuse) -> None:
    place = data.draw(st.sampled_from(["vars", "command", "step", "env", "fault-rank", "fault-command", "hosts",
                                       "environment", "default"]))
    suite = _suite(parameters={"n": {"type": "int", "default": 3}})
    if place == "vars":
        suite["vars"] = {"v": expr}
    elif place == "command":
        suite["steps"]["launch"]["command"] = f"echo {expr}"
    elif place == "step":
        suite["steps"]["prepare"] = [{"name": "s", "run": f"echo {expr}"}]
    elif place == "env":
        suite["steps"]["launch"]["env"] = {"V": expr}
    elif place in ("fault-rank", "fault-command"):
        fault: dict[str, Any] = {"action": "signal", "rank": expr, "at": 1} if place == "fault-rank" else \
            {"action": "command", "command": f"echo {expr}", "at": 1}
        suite.update(faults={"k": fault}, default_faults=["k"])
    elif place == "hosts":
        suite["placement"] = {"hosts": expr}
    elif place == "environment":
        suite["environment"] = expr
    else:
        suite["parameters"]["m"] = {"type": "str", "default": expr}
    refused(["run", "gen", "--on", "local", "--dry-run"], suite, line=True)


@st.composite
def template_bombs(draw: st.DrawFn) -> str:
    """A template that builds a value of up to 10^18 characters or loops up to 10^15 times, from a builder (repeat,
    pad, format width, join, nested loops, a doubling macro) and a size drawn over many orders of magnitude."""
    n = draw(st.integers(0, 18).map(lambda e: 10 ** e)) + draw(st.integers(0, 9))
    k = draw(st.integers(1, 100000))
    return draw(st.sampled_from([
        f"{{{{ 'x' * {n} }}}}", f"{{{{ ['ab'] * {n} }}}}", f"{{{{ 'a' | center({n}) }}}}",
        f"{{{{ 'a'.ljust({n}) }}}}", f"{{{{ '%{n}d' % 1 }}}}", f"{{{{ '{{:>{n}}}'.format(1) }}}}",
        f"{{{{ range({min(n, 100000)}) | join('x' * {k}) }}}}", f"{{{{ [1] | batch({n}, 0) | list | length }}}}",
        f"{{% for i in range({min(n, 100000)}) %}}{{% for j in range({k}) %}}{{% endfor %}}{{% endfor %}}",
        f"{{% macro f(d) %}}{{% if d > 0 %}}{{{{ f(d - 1) }}}}{{{{ f(d - 1) }}}}{{% endif %}}{{% endmacro %}}"
        f"{{{{ f({min(n, 60)}) }}}}",
    ]))


@pytest.mark.slow
@pytest.mark.timeout(300)
@SETTINGS
@given(template=template_bombs(), shell=st.booleans())
def test_templates_are_bounded_whatever_they_build(template: str, shell: bool) -> None:
    """Rendered within the bounds, or refused with one UsageError naming the bound, never a hang or a huge output."""
    from testbed.errors import UsageError
    from testbed.suite import render
    from testbed.templating import MAX_VALUE

    try:
        out = render(template, {}, shell=shell, where="s: steps.launch.command", at="s.yml:7")
    except UsageError as e:
        assert e.where == "s.yml:7" and ("the template is refused" in e.what or "Range too big" in e.what), e.what
    else:
        assert len(out) <= MAX_VALUE
