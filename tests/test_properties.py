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
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
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

            try:
                spec.check_vars(spec.load_testbed("gen"))
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
