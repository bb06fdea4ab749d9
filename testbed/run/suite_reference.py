"""docs/suite-reference.md, generated from the schema so that it cannot drift.

Every key of a suite (the pydantic models of :mod:`testbed.suite` and :mod:`testbed.references`, their types,
defaults and ``Field`` descriptions), every name a suite's templates see (:data:`testbed.run.plan.TEMPLATE_VARIABLES`,
:data:`testbed.run.plan.TESTBED_CONTEXT`) and every filter testbed adds to Jinja2 (:data:`FILTERS`), each with an
example: the first line of a shipped suite that uses it, else one written beside its description (a field's
``json_schema_extra={"example": ...}``, :data:`FILTERS`, :data:`EXAMPLES`). ``tests/test_suite_reference.py`` fails
when a key, variable or filter is undocumented or the committed file differs from :func:`reference_markdown`::

    PYTHONPATH=. python -m testbed.run.suite_reference > docs/suite-reference.md
"""

from __future__ import annotations

import json
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from testbed import paths, suite, templating, yamlfile
from testbed.run.plan import TEMPLATE_VARIABLES, TESTBED_CONTEXT
from testbed.spec import Hardware
from testbed.yamlfile import Loc

COMMAND = "PYTHONPATH=. python -m testbed.run.suite_reference > docs/suite-reference.md"

TEMPLATED: dict[str, set[str]] = {
    "Suite": {"vars", "outputs", "environment", "setup_roles"},
    "Param": {"default"},
    "Placement": {"hosts", "master"},
    "Launch": {"command", "env", "cwd", "needs", "probe"},
    "Step": {"run", "cwd", "relaunch", "needs"},
    "Check": {"file", "contains", "when"},
    "NeedsWhen": {"when", "needs"},
    "ProbeWhen": {"when", "probe"},
    "Fault": {"rank", "host", "when", "command", "restore"},
}
"""The keys whose text is a Jinja2 template rendered per point (testbed.run.plan): their type reads ``template``."""

FILTERS: dict[str, tuple[str, str]] = {
    "raw": ("the value as it is, never shell-quoted (a list: its items quoted, joined by spaces); for text the "
            "suite itself builds, such as flags made in a vars entry", "mpirun {{ mpi_flags | raw }} ./a.out"),
    "quote": ("the value shell-quoted now, and not quoted again: to quote a part of a value the template builds "
              "(a list: each item quoted, joined by spaces)",
              "{{ ('--files ' ~ (names | quote)) | raw }}"),
}
"""Filters testbed adds to Jinja2's (testbed.suite._env): what each does, and an example."""

EXAMPLES: dict[str, str] = {
    "params": "echo {{ params | tojson | quote }}",
    "run_id": "--tag {{ run_id }}",
    "reads": "python3 eval.py --model {{ reads.trained }}/out/model.pt",
    "run_dir": "--out {{ run_dir }}/results",
    "hostfile": "mpirun --hostfile {{ hostfile }} -np {{ world_size }} ./a.out",
    "testbed_hosts": "{% if testbed_hosts > 1 %}--distributed{% endif %}",
    "faults": "{% if 'disk-full' in faults %}--inject-disk-full{% endif %}",
    "hosts": "--peers {{ hosts | join(',') }}",
    "addresses": "--peers {{ addresses | join(',') }}",
    "num_hosts": "--nodes {{ num_hosts }}",
    "master": "ssh {{ master }} hostname",
    "local_rank": "CUDA_VISIBLE_DEVICES={{ local_rank }} python3 train.py",
    "address": "--bind {{ address }}",
    "host_hardware": "NCCL_SOCKET_IFNAME={{ host_hardware.interface }} python3 train.py",
    "suite": "--name {{ suite }}",
    "testbed.name": "--label {{ testbed.name }}",
    "testbed.provider": "--label {{ testbed.name }}-{{ testbed.provider }}",
    "testbed.subnet": "--mca btl_tcp_if_include {{ testbed.subnet }}",
    "testbed.ssh_config": "rsync -e 'ssh -F {{ testbed.ssh_config | raw }}' ...",
    "testbed.spec_known": "{% if testbed.spec_known %}...{% endif %}",
    "testbed.hardware_of": "{{ testbed.hardware_of[master].gpus }}",
    "testbed.gpu_declared": "{% if host in testbed.gpu_declared %}...{% endif %}",
    "testbed.hardware.shared_home": "{% if not testbed.hardware.shared_home %}rsync -a data/ {{ host }}:data/"
                                    "{% endif %}",
    "testbed.hardware.interface": "--mca btl_tcp_if_include {{ testbed.hardware.interface }}",
    "testbed.hardware.gpu_model": "echo {{ host_hardware.gpu_model }} > gpu.txt",
    "testbed.hardware.gpus": "--nproc_per_node {{ host_hardware.gpus }}",
    "testbed.hardware.login_shell": "{% if testbed.hardware.login_shell %}...{% endif %}",
    "testbed.hardware.tools": "{% if 'tc' in testbed.hardware.tools %}...{% endif %}",
    "testbed.hardware.sudo": "{{ 'sudo' | raw if testbed.hardware.sudo else '' }} sysctl -w vm.drop_caches=3",
}
"""Examples of the template variables no shipped suite uses (the others quote a shipped suite's line)."""

def _models_of(ann: object) -> list[tuple[str, type[BaseModel]]]:
    """(path suffix, model) of every model inside a field's type: ``""`` itself, ``"[]"`` a list item, ``".<name>"``
    a mapping's value."""
    origin, args = get_origin(ann), get_args(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [("", ann)]
    if origin in (Union, types.UnionType):
        return [m for a in args for m in _models_of(a)]
    if origin is list:
        return [("[]" + s, m) for s, m in _models_of(args[0])]
    if origin is dict:
        return [(".<name>" + s, m) for s, m in _models_of(args[1])]
    return []


def models() -> dict[str, tuple[type[BaseModel], list[str]]]:
    """Every model of a suite, Suite first then depth first in declared order, with the paths it is written at."""
    out: dict[str, tuple[type[BaseModel], list[str]]] = {}

    def visit(m: type[BaseModel], at: str) -> None:
        first = m.__name__ not in out
        out.setdefault(m.__name__, (m, []))[1].append(at)
        if not first:
            return
        for key, f in m.model_fields.items():
            if not f.exclude:
                for suffix, sub in _models_of(f.annotation):
                    visit(sub, f"{at}.{key}{suffix}".lstrip("."))

    visit(suite.Suite, "")
    return out


def fields(m: type[BaseModel]) -> dict[str, Any]:
    """The keys a suite may write in ``m`` (excluded fields left out), in declared order."""
    return {k: f for k, f in m.model_fields.items() if not f.exclude}


def type_text(ann: object, templated: bool = False) -> str:
    """A field's type in words: ``list of str``, ``int or template``, ``one of `a`, `b```, a model as a link."""
    origin, args = get_origin(ann), get_args(ann)
    if ann is Any:
        return "any"
    if ann is type(None):
        return "null"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return f"[{ann.__name__}](#{ann.__name__.lower()})"
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        parts = [type_text(a, templated) for a in args if a is not type(None)]
        sep = ", or " if any(" " in x for x in parts) else " or "
        return ", ".join(parts[:-1]) + sep + parts[-1] if len(parts) > 1 else parts[0]
    if origin is list:
        inner = type_text(args[0], templated)
        return f"list, each {inner}" if get_origin(args[0]) is Literal else f"list of {inner}"
    if origin is dict:
        return f"mapping of {type_text(args[0])} to {type_text(args[1], templated)}"
    if ann is str and templated:
        return "template"
    return getattr(ann, "__name__", str(ann))


def choices_text(f: FieldInfo) -> str | None:
    """``one of ...`` for a field whose values a registry holds (its type's metadata has ``choices()``: a fault's
    ``action``, testbed.fault_kinds); None for any other field."""
    for m in f.metadata:
        if callable(getattr(m, "choices", None)):
            return "one of " + ", ".join(f"`{c}`" for c in m.choices())
    return None


def default_text(f: FieldInfo) -> str:
    """A field's default as YAML writes it; ``required`` without one."""
    if f.default_factory is not None:
        value = f.get_default(call_default_factory=True)  # no factory of these models reads the validated data
        if isinstance(value, BaseModel):
            return "its keys' defaults"
    elif f.default is PydanticUndefined:
        return "required"
    else:
        value = f.default
    return f"`{json.dumps(value)}`"


# --- examples from the shipped suites ----------------------------------------------------------------------------
@dataclass
class Example:
    where: str  # experiments/<file>, or "" for one written beside the description
    text: str


def shipped_suites() -> list[Path]:
    """The suites testbed ships (never the working folder's), smallest first: their lines are the examples."""
    root = next(d for d in (paths.PACKAGE_DIR / "_data" / "experiments", paths.PACKAGE_DIR.parent / "experiments")
                if d.is_dir())
    found = [*root.glob("*.yml"), *root.glob("*/suite.yml")]
    return sorted(found, key=lambda p: (len(p.read_text().splitlines()), str(p)))


def _label(p: Path) -> str:
    parts = p.parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("experiments"):])


def _block(lines: list[str], line: int, limit: int = 8) -> str:
    """The text of the key at ``line`` (1-based): its line, and the more indented lines below it (comments left
    out), dedented; cut after ``limit`` lines."""
    head = lines[line - 1]
    indent = len(head) - len(head.lstrip()) + (2 if head.lstrip().startswith("- ") else 0)
    out = [head]
    for text in lines[line:]:
        if text.strip() and len(text) - len(text.lstrip()) <= indent:
            break
        if text.strip() and not text.lstrip().startswith("#"):
            out.append(text)
    cut = len(head) - len(head.lstrip())
    body = [t[cut:] for t in out[:limit]] + ([" " * (indent - cut) + "# ..."] if len(out) > limit else [])
    return "\n".join(body).rstrip()


def key_examples() -> dict[tuple[str, str], Example]:
    """(model, key) -> the first shipped suite's lines that write it."""
    found: dict[tuple[str, str], Example] = {}

    def visit(m: type[BaseModel], data: Any, loc: Loc, lines: list[str], where: str,
              located: yamlfile.Located) -> None:
        if not isinstance(data, dict):
            return
        for key, value in data.items():
            f = fields(m).get(key)
            if f is None:
                continue
            line = located.line((*loc, key))
            if (m.__name__, key) not in found and line:
                found[(m.__name__, key)] = Example(where, _block(lines, line))
            for suffix, sub in _models_of(f.annotation):
                if suffix == "" and isinstance(value, dict):
                    visit(sub, value, (*loc, key), lines, where, located)
                elif suffix == "[]" and isinstance(value, list):
                    for i, item in enumerate(value):
                        visit(sub, item, (*loc, key, i), lines, where, located)
                elif suffix == ".<name>" and isinstance(value, dict):
                    for k, item in value.items():
                        visit(sub, item, (*loc, key, k), lines, where, located)

    for p in shipped_suites():
        data, located = yamlfile.load(p)
        visit(suite.Suite, data, (), p.read_text().splitlines(), _label(p), located)
    return found


def name_examples(names: list[str]) -> dict[str, Example]:
    """Template name (``master_addr``, ``testbed.subnet``, a filter ``| raw``) -> the first shipped suite line whose
    ``{{ }}`` or ``{% %}`` uses it."""
    found: dict[str, Example] = {}
    pats = {n: re.compile(r"\|\s*" + re.escape(n[2:]) + r"\b" if n.startswith("| ") else
                          r"(?<![\w.])" + re.escape(n) + r"(?![\w])") for n in names}
    for p in shipped_suites():
        for text in p.read_text().splitlines():
            if text.lstrip().startswith("#"):
                continue
            spans = re.findall(r"\{\{.*?\}\}|\{%.*?%\}", text)
            for n, pat in pats.items():
                if n not in found and any(pat.search(s) for s in spans):
                    found[n] = Example(_label(p), text.strip())
    return found


def _example_md(ex: Example | None, lang: str = "yaml") -> list[str]:
    if ex is None:
        return ["(no example)"]
    src = f"from `{ex.where}`" if ex.where else "written for this reference"
    return [src, "", f"```{lang}", ex.text, "```"]


# --- the page ----------------------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _model_section(name: str, m: type[BaseModel], at: list[str], examples: dict[tuple[str, str], Example]) -> list[str]:
    where = ", ".join(f"`{a}`" for a in at if a) or "the top level of `experiments/<name>/suite.yml`"
    doc = " ".join((m.__doc__ or "").split()).replace("``", "`")
    out = [f"### {name}", "", f"{doc} Written at {where}." if doc else f"Written at {where}.", "",
           "| key | type | default | what it is |", "|---|---|---|---|"]
    for key, f in fields(m).items():
        t = choices_text(f) or type_text(f.annotation, key in TEMPLATED.get(name, set()))
        out.append(f"| `{key}` | {_cell(t)} | {_cell(default_text(f))} | {_cell(f.description or '')} |")
    out += [""]
    for key, f in fields(m).items():
        ex = examples.get((name, key))
        if ex is None and isinstance(f.json_schema_extra, dict) and "example" in f.json_schema_extra:
            ex = Example("", str(f.json_schema_extra["example"]))
        out += [f"`{name}.{key}`: " + (_example_md(ex)[0]), *_example_md(ex)[1:], ""]
    return out


def added_filters() -> list[str]:
    """The filters testbed adds to Jinja2's own (read from the environment suites render in)."""
    from jinja2.filters import FILTERS  # what jinja2.defaults.DEFAULT_FILTERS names

    return sorted(set(suite._env(True).filters) - set(FILTERS))


def _variables_section() -> list[str]:
    names = [*TEMPLATE_VARIABLES, *(f"testbed.{k}" for k in TESTBED_CONTEXT),
             *(f"testbed.hardware.{k}" for k in _hardware_keys())]
    found = name_examples(names)
    out = ["## Template variables", "",
           "Beside its parameters (each by its name) and its `vars` (each by its name, rendered in order, each seeing "
           "the ones before), a suite's templates see these names. Parameter defaults and `placement` are rendered "
           "before the hosts are picked: they see the names down to `faults`; `vars` see the hosts too; everything "
           "after sees `world_size`, and a rank's, step's or fault's templates the names of its own rank and host. "
           "A parameter or var may not take one of these names.", "",
           "| name | what it holds | example |", "|---|---|---|"]
    for n in names:
        desc = TEMPLATE_VARIABLES.get(n) or TESTBED_CONTEXT.get(n.removeprefix("testbed."))
        if desc is None:
            desc = HARDWARE_WORDS.get(n.removeprefix("testbed.hardware."), "")
        ex = found.get(n) or (Example("", EXAMPLES[n]) if n in EXAMPLES else None)
        shown = f"`{_cell(ex.text)}`" + (f" ({ex.where})" if ex.where else "") if ex else "(no example)"
        out.append(f"| `{n}` | {_cell(desc.replace('``', '`'))} | {shown} |")
    out += ["", "The testbed's spec's own `vars:` are there too, by their names: `{{ testbed.python }}`.", ""]
    return out


HARDWARE_WORDS: dict[str, str] = {
    "shared_home": "true when every host sees one home folder (NFS)",
    "interface": "the network interface the hosts reach each other on (eno1)",
    "gpu_model": "the GPUs' model name, or null",
    "gpus": "GPUs per host (0: CPU hosts)",
    "login_shell": "the login user's shell when it is not a POSIX one (/bin/tcsh), else null",
    "tools": "commands every host has that a fault may need (tc, iptables, ...)",
    "sudo": "whether the login user may become root",
}
"""``{{ testbed.hardware.* }}`` and ``{{ host_hardware.* }}`` (testbed.spec.Hardware.context)."""


def _hardware_keys() -> list[str]:
    return list(Hardware().context())


def _filters_section() -> list[str]:
    jinja_used = sorted(set(suite._env(True).filters) - set(FILTERS))
    found = name_examples([f"| {n}" for n in [*FILTERS, *jinja_used]])
    out = ["## Filters", "", "testbed's own:", "", "| filter | what it does | example |", "|---|---|---|"]
    for n, (desc, example) in FILTERS.items():
        ex = found.get(f"| {n}") or Example("", example)
        out.append(f"| `{n}` | {_cell(desc)} | `{_cell(ex.text)}`" + (f" ({ex.where})" if ex.where else "") + " |")
    used = [(n, found[f"| {n}"]) for n in jinja_used if f"| {n}" in found]
    out += ["", "Every filter and test of Jinja2 works too ([Jinja2's list]"
            "(https://jinja.palletsprojects.com/en/stable/templates/#list-of-builtin-filters)), within the bounds "
            "below. The shipped suites use:", "", "| filter | example |", "|---|---|"]
    out += [f"| `{n}` | `{_cell(ex.text)}` ({ex.where}) |" for n, ex in used]
    return [*out, ""]


def _rules_section() -> list[str]:
    return [
        "## Templates: quoting, sandbox, bounds", "",
        "Templates are Jinja2 with `StrictUndefined`: a name that is not defined is an error at `file:line` that "
        "lists the known names, before anything touches a host (`testbed show`, `--dry-run`).", "",
        "**Shell quoting.** In a command (`steps.*.run` and `cwd`, `steps.launch.command` and `cwd`, a fault's "
        "`command` and `restore`, a `relaunch` command) every `{{ }}` value is shell-quoted: one word "
        "(`shlex.quote`), a list as quoted words joined by spaces, `true`/`false` for booleans, `''` for null; a "
        "leading `~/` stays outside the quotes so the shell expands it. `{{ x | raw }}` puts the value in as it is "
        "(for text the suite builds itself); `{{ run_dir }}` is never quoted. Elsewhere nothing is quoted: "
        "parameter defaults, `vars`, `placement`, `steps.launch.env` (exported quoted), `environment`, `outputs`, "
        "`setup_roles`, a fault's `rank`, `host` and `when` render to plain text; a var used in a command is "
        "quoted there.", "",
        "**Sandbox.** Templates run in Jinja2's immutable sandbox: no attribute of Python's internals, no "
        "mutation of lists or mappings, and only these string methods: "
        + ", ".join(f"`{m}`" for m in sorted(templating.STR_METHODS)) + ".", "",
        f"**Bounds** (testbed.templating). One render may take {templating.MAX_STEPS:,} steps (each loop "
        f"iteration, call, filter, test and operator) and {templating.MAX_SECONDS:g} s; one value or output may "
        f"hold {templating.MAX_VALUE:,} characters (or list items), all of one render's values "
        f"{templating.MAX_MADE:,}; a whole number at most {templating.MAX_DIGITS:,} digits. Past a bound the "
        "template is refused with its `file:line`.", ""]


def reference_markdown() -> str:
    """The whole of docs/suite-reference.md."""
    all_models = models()
    examples = key_examples()
    out = ["# Suite reference", "",
           f"Generated from the schema by `{COMMAND}`; do not edit it by hand "
           "(`tests/test_suite_reference.py` fails when it is stale). How to write a suite: "
           "[suites.md](suites.md).", "",
           "A suite is a folder, `experiments/<name>/suite.yml` (or the single file `experiments/<name>.yml`). Its "
           "keys, then every name and filter its templates may use. Each "
           "key's example is the first shipped suite that writes it (smallest suite first), or one written for "
           "this reference.", "",
           "## Keys", "",
           "Models: " + ", ".join(f"[{n}](#{n.lower()})" for n in all_models) + ".", ""]
    for name, (m, at) in all_models.items():
        out += _model_section(name, m, at, examples)
    out += _variables_section() + _filters_section() + _rules_section()
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
