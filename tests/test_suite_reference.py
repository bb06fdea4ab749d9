"""docs/suite-reference.md is generated from the schema (testbed.run.suite_reference) and says every key, template
variable and filter, each with an example: a key, a name the templates see or a filter without its entry fails here,
and so does a committed file that is not what the generator writes now."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from testbed.run import plan as plan_mod
from testbed.run import runner
from testbed.run import suite_reference as ref
from testbed.suite import BUILTINS, list_suites, load_suite

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "suite-reference.md"


def test_the_committed_reference_is_the_generated_one() -> None:
    assert DOC.read_text() == ref.reference_markdown(), f"docs/suite-reference.md is stale: run {ref.COMMAND}"


def test_the_reference_is_linked_from_the_readme_and_the_suites_page() -> None:
    assert "(docs/suite-reference.md)" in (ROOT / "README.md").read_text()
    assert "(suite-reference.md)" in (ROOT / "docs" / "suites.md").read_text()


def test_every_key_has_a_description_a_readable_type_and_an_example() -> None:
    examples = ref.key_examples()
    models = ref.models()
    assert list(models)[:2] == ["Suite", "Requires"] and {"Step", "Fault", "Tolerance"} <= set(models)
    for name, (m, _) in models.items():
        for key, f in ref.fields(m).items():
            assert (f.description or "").strip(), f"{name}.{key} has no description (Field(description=...))"
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            assert (name, key) in examples or "example" in extra, \
                f"{name}.{key}: no shipped suite writes it; give its Field json_schema_extra={{'example': ...}}"
            assert "typing" not in ref.type_text(f.annotation) and "<" not in ref.type_text(f.annotation)
    assert "source" not in ref.fields(models["Suite"][0])  # excluded: where it was loaded from
    md = ref.reference_markdown()
    for name, (m, _) in models.items():
        assert f"### {name}\n" in md and f"](#{name.lower()})" in md
        for key in ref.fields(m):
            assert f"| `{key}` |" in md and f"`{name}.{key}`: " in md


def test_types_read_as_words() -> None:
    from testbed.suite import Fault, Param, Placement, Suite

    assert ref.type_text(Placement.model_fields["hosts"].annotation, True) == "int or template"
    assert ref.type_text(Param.model_fields["type"].annotation) == "one of `str`, `int`, `float`, `bool`"
    assert ref.type_text(Suite.model_fields["files"].annotation) == "list of str"
    assert ref.type_text(Suite.model_fields["faults"].annotation) == "mapping of str to [Fault](#fault)"
    assert ref.default_text(Fault.model_fields["action"]) == "required"
    assert ref.default_text(Suite.model_fields["timeouts"]) == "its keys' defaults"


def _where_key(where: str) -> tuple[str, str] | None:
    """The (model, key) whose template a render's ``where`` names (testbed.run.plan's labels)."""
    w = where.split(": ", 1)[1]
    for pat, model, key in [
        (r"parameters\.\w+\.default", "Param", "default"), (r"placement\.(hosts|master)", "Placement", None),
        (r"vars\.\w+", "Suite", "vars"), (r"steps\.launch\.(command|cwd)", "Launch", None),
        (r"steps\.launch\.env\.\w+", "Launch", "env"), (r"(steps\.\w+|faults\.[\w-]+\.recovery)\[\d+\]", "Step", "run"),
        (r"(steps\.\w+|faults\.[\w-]+\.recovery)\[\d+\]\.cwd", "Step", "cwd"),
        (r"faults\.[\w-]+\.(rank|host|when|command|restore)", "Fault", None),
        (r"(environment|outputs|setup_roles)", "Suite", None)]:
        m = re.fullmatch(pat, w)
        if m:
            return model, key or m.group(m.lastindex or 1)
    return None


MIXED = """provider: {kind: lab, hosts: [{name: gpu0, address: 10.0.0.2}, {name: cpu0, address: 10.0.0.3}]}
user: u
hardware:
  gpu: {model: NVIDIA A100, count: 2}
  hosts:
    cpu0: {gpu: null, interface: ens3}
"""
"""A testbed whose hosts differ (hardware.hosts): its context has hardware_of and gpu_declared."""


@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch, tb_home: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, context) of every template the plans of the shipped suites render: each with its default point and
    each fault, tesla on its own testbed (WATID set), the others with none; mpi-hello on hosts that differ."""
    monkeypatch.setenv("WATID", "jdoe")
    seen: list[tuple[str, dict[str, Any]]] = []
    real = plan_mod.render

    def spy(template: str, context: dict[str, Any], **kw: Any) -> str:
        seen.append((kw.get("where", ""), context))
        return real(template, context, **kw)

    monkeypatch.setattr(plan_mod, "render", spy)
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "mixed.yml").write_text(MIXED)
    runner.plan_run("mpi-hello", "mixed", {}, dry_run=True)
    for name in list_suites():
        s = load_suite(name)
        for faults in [None, *([f] for f in s.faults)]:
            try:
                runner.plan_run(name, "tesla" if name == "tesla" else None, {}, faults=faults, dry_run=True)
            except Exception as e:  # a fault only a parameter's value allows, a point this testbed cannot hold
                assert faults is not None, f"{name}: {e}"
    return seen


def test_every_name_the_templates_see_is_documented(rendered: list[tuple[str, dict[str, Any]]]) -> None:
    from jinja2.defaults import DEFAULT_NAMESPACE

    from testbed.spec import load_testbed

    own: set[str] = set(DEFAULT_NAMESPACE)
    for name in list_suites():
        s = load_suite(name)
        own |= set(s.parameters) | set(s.vars)
    names = {k for _, ctx in rendered for k in ctx} - own
    assert {"rank", "master_addr", "host_hardware", "world_size", "recovering"} <= names  # the spy saw plans
    missing = names - set(plan_mod.TEMPLATE_VARIABLES)
    assert not missing, f"templates see {sorted(missing)}: describe them in testbed.run.plan.TEMPLATE_VARIABLES"
    spec_vars = set(load_testbed("tesla").vars)
    tb_keys = {k for _, ctx in rendered for k in ctx.get("testbed", {})} - spec_vars
    assert {"hardware_of", "gpu_declared", "subnet"} <= tb_keys  # the mixed testbed's spec has hardware.hosts
    assert not tb_keys - set(plan_mod.TESTBED_CONTEXT), "describe them in testbed.run.plan.TESTBED_CONTEXT"
    hw = {k for _, ctx in rendered for k in ctx.get("testbed", {}).get("hardware", {})}
    assert hw and not hw - set(ref.HARDWARE_WORDS), "describe them in testbed.run.suite_reference.HARDWARE_WORDS"
    assert set(plan_mod.TEMPLATE_VARIABLES) <= set(BUILTINS)  # a parameter or var of such a name is refused


def test_every_templated_key_reads_as_a_template(rendered: list[tuple[str, dict[str, Any]]]) -> None:
    keys = {where: _where_key(where) for where, _ in rendered}
    unknown = [w for w, k in keys.items() if k is None]
    assert not unknown, f"a template rendered at {unknown[0]!r}: teach _where_key and TEMPLATED its key"
    for where, (model, key) in ((w, k) for w, k in keys.items() if k):
        assert key in ref.TEMPLATED.get(model, set()), f"{where}: add {key} to TEMPLATED[{model!r}]"
    assert {k for k in keys.values() if k} >= {("Launch", "command"), ("Fault", "rank"), ("Suite", "setup_roles")}


def test_every_variable_has_an_example() -> None:
    md = ref.reference_markdown()
    for n in [*plan_mod.TEMPLATE_VARIABLES, *(f"testbed.{k}" for k in plan_mod.TESTBED_CONTEXT)]:
        row = next((line for line in md.splitlines() if line.startswith(f"| `{n}` |")), None)
        assert row is not None and not row.endswith("(no example) |"), n


def test_every_filter_testbed_adds_is_documented() -> None:
    added = ref.added_filters()
    assert {"raw", "quote"} <= set(added)
    assert set(added) == set(ref.FILTERS), "describe each filter testbed.suite._env adds in suite_reference.FILTERS"
    from testbed.suite import render

    for name, (_, example) in ref.FILTERS.items():
        assert f"| {name}" in example
        render(example, {"mpi_flags": "-x A=1", "names": ["a b", "c"]})  # each example renders
    assert render("x {{ v }} {{ v | raw }} {{ v | quote }}", {"v": "a b"}) == "x 'a b' a b 'a b'"
