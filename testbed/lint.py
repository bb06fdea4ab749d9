"""Static checks of a suite, before any host: what would break on the rented machine and can be read from files.

``lint_suite`` reads the suite, the shipped testbed specs (``inventories/``) and the suite's profile, and touches no
host. ``testbed rehearse`` fails on its findings before it makes a replica; ``testbed run --dry-run`` prints them as
warnings. Each finding is one line naming ``file:line`` where the suite's file gives one:

- **branch heads**: a source with no ``ref:``, or one that names a branch or tag rather than a commit, checks out
  whatever the branch holds on the day of the run; so does a build of the suite's profile (``source_build``)
  whose version is a branch;
- **fault timing**: a suite with faults or recovery whose ``timeouts.grace`` (how long the other ranks get to end
  after one fails) does not exceed the artifact's own timeout (any parameter, var, environment variable or launch
  option whose name holds ``timeout``) plus a checkpoint interval: the others are stopped before the artifact's own
  failure detection lets them checkpoint;
- **unproducible references**: a reference whose ``where:`` asks for a parameter value (or a mode: a declared
  value of a parameter) that neither the default point nor any matrix point runs;
- **built versions**: a set-up check expecting a torch built from one commit (``+git<hash>``) where the profile
  builds torch from another ref, or builds none;
- **unpinned GPU frameworks**: a GPU suite whose profile installs torch, deepspeed, tensorflow or jax without a
  version: the newest release is built for the newest CUDA, which the testbed's driver may not run;
- **bootstrap refusals**: the current get-pip.py run with a Python older than it accepts (in a suite's command, or
  set as a profile python_env's URL for such an interpreter);
- **estimates**: an estimate that gives one time to matrix points differing only in a parameter that scales the run
  (epochs, steps, iterations, a data fraction...);
- **quantities**: a reference whose metric says one unit (%, a fraction, ms, s) and whose column another;
- **host labels**: a reference that picks its row by a host's name;
- **verdicts that need another point's run**: a reference whose row one point makes and whose verdict compares
  with another run (in its own words: the fault-free run, the baseline run) that the point's commands never
  make nor read from another point (``after:``);
- **hardware**: a suite that needs a GPU (or a TPU) when no shipped testbed spec it may run on declares one;
- **the testbed's length**: a matrix whose estimates add up to more than its own testbed's spec gives (a
  lease's hours, an ``expire:``);
- **login PATH**: a command that calls a program only a login shell's PATH has (conda, or what the profile installs
  in ``~/.local/bin``), where steps, ranks and faults run in a non-login shell.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import paths, points, proof
from testbed.errors import TestbedError
from testbed.estimate import declared
from testbed.expiry import span
from testbed.providers import PROVIDERS, provider_class
from testbed.run import forecast
from testbed.setup import profiles as prof
from testbed.state import Store
from testbed.suite import expand_matrix, point_label, point_reads, render, resolve_params

if TYPE_CHECKING:
    from testbed.setup.profiles import SetupPlan
    from testbed.suite import Step, Suite
    from testbed.yamlfile import Loc

COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
"""A ref that names one commit (an abbreviated or full hash): it cannot move."""
LOGIN_ONLY = ("conda", "mamba", "micromamba")
"""Programs a conda installer puts on PATH only through a login shell's start-up files (``conda init``)."""
LOGIN_REACH = ("bash -l", "bash --login", ".bashrc", ".profile", ".bash_profile")
"""Words by which a command reads a login shell's start-up files itself."""
CONDA_REACH = ("condabin", "conda.sh", "/bin/conda", "/bin/mamba", "conda shell", "miniforge3/bin", "miniconda3/bin",
               "anaconda3/bin", "mambaforge/bin")
"""Words by which a command reaches conda without a login shell (its folder on PATH, its shell hook)."""


@dataclass(frozen=True)
class Finding:
    """One static finding: its class, what is wrong (with the numbers and names that show it), and where."""

    kind: str  # branch-head, fault-timing, reference, cross-point, hardware, login-path, ...
    what: str
    where: str

    def line(self) -> str:
        return f"{self.where}: {self.what}"


def lint_suite(s: Suite, points: list[dict[str, Any]] | None = None, *, profile_text: str | None = None,
               specs: dict[str, Path] | None = None) -> list[Finding]:
    """Every static finding of ``s``. ``points``: parameter points whose timing is checked besides the default
    point and the matrix's; ``profile_text``: the text of the suite's profile and roles (default: read from
    ``playbooks/``); ``specs``: the testbed specs it may run on, by name (default: the shipped ``inventories/``)."""
    runs = _runs(s)
    text = profile_text if profile_text is not None else set_up_text(s.profile)
    out = branch_heads(s) + profile_branch_builds(s.profile) + built_version_checks(s.profile) \
        + fault_timing(s, runs + list(points or [])) \
        + unproducible_references(s, runs) + unpinned_frameworks(s, runs + list(points or [])) + bootstrap_refusals(s) \
        + estimate_ignores_scale(s, runs) + unit_mismatches(s) + host_keyed_references(s) \
        + cross_point_verdicts(s, runs) + campaign_outlives_testbed(s) \
        + hardware_missing(s, specs, runs + list(points or [])) + login_path_only(s, text)
    return list(dict.fromkeys(out))


def _runs(s: Suite) -> list[dict[str, Any]]:
    """The default point and every matrix point (those that resolve)."""
    runs: list[dict[str, Any]] = []
    with contextlib.suppress(TestbedError):
        runs.append(resolve_params(s, {}))
    if s.matrix:
        with contextlib.suppress(TestbedError):
            runs += expand_matrix(s, {})
    return runs


# --- sources ----------------------------------------------------------------------------------------------------
def branch_heads(s: Suite) -> list[Finding]:
    """A source with no ref, or whose ref is not a commit hash: what a run checks out moves with the branch."""
    out = []
    for i, src in enumerate(s.sources):
        if src.ref is None:
            out.append(Finding("branch-head", f"source {src.name} has no ref: it follows the head of {src.repo}'s "
                               "default branch, which moves between runs (pin a commit: ref: <hash>)",
                               s.at("sources", i)))
        elif not COMMIT_RE.match(src.ref):
            out.append(Finding("branch-head", f"source {src.name} follows ref {src.ref!r}, a branch or tag of "
                               f"{src.repo} that can move between runs, not a commit (pin one: ref: <hash>)",
                               s.at("sources", i, "ref")))
    return out



_SIMPLE_VAR = re.compile(r"^\s*\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}\s*$")


def _profile_plan(profile: str | None) -> SetupPlan | None:
    """The suite's profile read into its plan (None: no profile, or one that does not load: set-up names that)."""
    if not profile:
        return None
    try:
        return prof.load_profile(profile)
    except (TestbedError, OSError):
        return None


def profile_branch_builds(profile: str | None) -> list[Finding]:
    """A ``source_build`` of the suite's profile whose version is a branch or tag (or none: the default branch's
    head), not a commit: the set-up builds whatever the branch holds that day. A version given as ``{{ var }}`` is
    read through the profile's vars; one computed per host (any other template) is not judged."""
    plan = _profile_plan(profile)
    if plan is None:
        return []
    out = []
    for step in plan.steps:
        if step.role != "source_build":
            continue
        version: Any = step.vars.get("source_build_version", plan.vars.get("source_build_version", "HEAD"))
        for _ in range(4):  # {{ a }} -> {{ b }} -> value, bounded
            m = _SIMPLE_VAR.match(str(version))
            if not m or m.group(1) not in plan.vars:
                break
            version = plan.vars[m.group(1)]
        version = str(version)
        if "{{" in version or "{%" in version or COMMIT_RE.match(version):
            continue
        name = step.vars.get("source_build_name", step.vars.get("source_build_repo", "a build"))
        out.append(Finding("branch-head", f"the profile builds {name} at {version!r}, a branch or tag that can move "
                           "between set-ups, not a commit (pin one: source_build_version: <hash>)", step.where()))
    return out


_BUILT_AT = re.compile(r"\+git([0-9a-f]{7,40})\b")


def built_version_checks(profile: str | None) -> list[Finding]:
    """A set-up check (``gpu_check_expect_torch``) that expects a source build's version naming one commit
    (``2.2.0a0+git8ac9b20``: torch names the commit it was built from) where the profile builds torch from another
    ref, or builds none (a wheel from pip never says ``+git``): the check fails after the builds, every time."""
    plan = _profile_plan(profile)
    if plan is None:
        return []
    builds = [(str(_resolved(st.vars.get("source_build_name", ""), plan.vars)),
               str(_resolved(st.vars.get("source_build_version", "HEAD"), plan.vars)))
              for st in plan.steps if st.role == "source_build"
              and "torch" in f"{st.vars.get('source_build_name', '')} {st.vars.get('source_build_repo', '')}".lower()]
    out = []
    for st in plan.steps:
        want = str(_resolved(st.vars.get("gpu_check_expect_torch", ""), plan.vars))
        m = _BUILT_AT.search(want) if st.role == "gpu_check" and "{{" not in want else None
        if m is None:
            continue
        other = [(n, v) for n, v in builds if not (COMMIT_RE.match(v) and (v.startswith(m[1]) or m[1].startswith(v)))]
        if builds and not other:
            continue
        built = "; ".join(f"{n} at {v!r}" for n, v in other) if builds else "no torch from source (a pip wheel " \
            "never names a commit)"
        out.append(Finding("built-version", f"gpu_check expects torch {want}, the build of commit {m[1]}, and the "
                           f"profile builds {built}: torch names the commit it is built from, so the check fails "
                           "after the builds (expect the commit built: '+git' ~ source_build_commits[NAME][:7])",
                           st.where()))
    return out


GPU_FRAMEWORKS = ("torch", "torchvision", "torchaudio", "deepspeed", "tensorflow", "jax", "jaxlib")
"""Packages whose newest release is built for the newest CUDA: unpinned, a set-up months later installs one the
testbed's NVIDIA driver cannot run (a CUDA 13 build needs driver 580 or later)."""
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def _resolved(value: Any, variables: dict[str, Any]) -> Any:
    """``value`` read through ``{{ var }}`` in ``variables`` (bounded); any other template stays as it is."""
    for _ in range(4):
        m = _SIMPLE_VAR.match(value) if isinstance(value, str) else None
        if not m or m.group(1) not in variables:
            break
        value = variables[m.group(1)]
    return value


def unpinned_frameworks(s: Suite, runs: list[dict[str, Any]] | None = None) -> list[Finding]:
    """In a suite that needs a GPU, a GPU framework (torch, deepspeed, ...) its profile installs with pip without a
    version (or with only a lower bound): the set-up takes the newest release, built for whatever CUDA is newest
    then, whatever driver the testbed has. Lists given as ``{{ var }}`` are read through the profile's vars; a
    list computed otherwise is not judged."""
    if not s.profile or not {"gpu", "cuda"} & set(needs_hardware(s, runs)):
        return []
    try:
        plan = prof.load_profile(s.profile)
    except (TestbedError, OSError):
        return []
    out, seen = [], set()
    for step in plan.steps:
        variables = {**plan.vars, **step.vars}
        for key, value in step.vars.items():
            if not (key.endswith("pip_packages") or key == "packages_pip"):
                continue
            items = _resolved(value, plan.vars)
            for req in items if isinstance(items, list) else []:
                m = _REQ.match(str(_resolved(req, variables)))
                if not m or m.group(1).lower() not in GPU_FRAMEWORKS or re.search(r"==|~=|<", m.group(3)):
                    continue
                if m.group(1).lower() not in seen:
                    seen.add(m.group(1).lower())
                    out.append(Finding("unpinned", f"the profile installs {m.group(1)} without a version ({key}): pip "
                                       "takes the newest release, built for the newest CUDA, which the testbed's "
                                       f"NVIDIA driver may not run (pin it: {m.group(1)}==<version> built for the "
                                       "driver)", step.where()))
    return out


GET_PIP = "https://bootstrap.pypa.io/get-pip.py"
GET_PIP_MIN = (3, 10)
"""The oldest Python the current get-pip.py accepts (pip 26.1, April 2026): an older one gets "This script does not
work on Python 3.N" and must use ``https://bootstrap.pypa.io/pip/3.N/get-pip.py``."""
_PYTHON = re.compile(r"python(3)\.(\d+)\b")


def _old_pythons(text: str) -> list[str]:
    return sorted({f"{a}.{b}" for a, b in _PYTHON.findall(text) if (int(a), int(b)) < GET_PIP_MIN})


def bootstrap_refusals(s: Suite) -> list[Finding]:
    """A bootstrap that refuses the Python it is given: the current get-pip.py (which accepts Python 3.10 and later
    only) for a Python older than that, named in the same command of the suite, or as the interpreter of a profile
    ``python_env`` whose ``python_env_get_pip_url`` is set to it (left empty, the role picks pypa's frozen copy
    for that version itself)."""
    out = []
    for what, text, loc in _commands(s):
        old = _old_pythons(text) if GET_PIP in text else []
        if old:
            out.append(Finding("bootstrap", f"{what} runs {GET_PIP} with Python {', '.join(old)}, which it refuses "
                               f"(it needs {'.'.join(map(str, GET_PIP_MIN))} or later): use "
                               f"https://bootstrap.pypa.io/pip/{old[0]}/get-pip.py", s.at(*loc)))
    try:
        plan = prof.load_profile(s.profile) if s.profile else None
    except (TestbedError, OSError):
        plan = None
    for step in plan.steps if plan is not None else []:
        variables = {**plan.vars, **step.vars} if plan is not None else {}
        url = _resolved(variables.get("python_env_get_pip_url", ""), variables)
        old = _old_pythons(str(_resolved(variables.get("python_env_python", ""), variables)))
        if step.role == "python_env" and url == GET_PIP and old:
            out.append(Finding("bootstrap", f"the profile's python_env bootstraps pip with {GET_PIP} for Python "
                               f"{', '.join(old)}, which it refuses: leave python_env_get_pip_url empty (the role "
                               "then takes pypa's frozen copy for that Python, checked by its sha256)", step.where()))
    return out


_SCALES = re.compile(r"epoch|step|iter|loop|sample|percent|fraction|batches|rounds|tokens|duration|seconds|minutes")
"""Words of a parameter name that says how much work a run does (how long it runs)."""


def estimate_ignores_scale(s: Suite, runs: list[dict[str, Any]]) -> list[Finding]:
    """An estimate that gives one time to points that differ only in a parameter that scales the run (its name says
    epochs, steps, iterations, a data fraction...): ``plan`` and budgets would be wrong for all but one of them."""
    if s.estimate is None or not s.matrix:
        return []
    raw = s.estimate.model_dump() if hasattr(s.estimate, "model_dump") else s.estimate
    try:
        est = declared(raw)
        timed = [(r, est.pick(r).seconds(r)) for r in runs]
    except ValueError:  # a point the estimate cannot time is the forecast's to say
        return []
    out = []
    for name, prm in s.parameters.items():
        if prm.type not in ("int", "float") or not _SCALES.search(name.lower()):
            continue
        groups: dict[str, dict[Any, float]] = {}
        for r, sec in timed:
            key = repr(sorted((k, repr(v)) for k, v in r.items() if k != name))
            groups.setdefault(key, {})[r.get(name)] = sec
        flat = next((g for g in groups.values() if len(g) > 1 and len(set(g.values())) == 1), None)
        if flat is not None:
            values = ", ".join(str(v) for v in sorted(flat, key=str))
            out.append(Finding("estimate", f"the estimate gives {next(iter(flat.values())):.0f} s to the points whose "
                               f"{name} is {values}, though {name} scales the run: name it in the estimate "
                               f"(for example '1m * {name}')", s.at("estimate")))
    return out


_UNITS: tuple[tuple[str, re.Pattern[str], re.Pattern[str]], ...] = (  # (unit, as a metric says it, as a column does)
    ("percent", re.compile(r"%|\bpercent"), re.compile(r"(_|^)(pct|percent(age)?)$")),
    ("fraction", re.compile(r"\b(fraction|ratio|share)\b"), re.compile(r"(_|^)(fraction|frac|ratio|share)$")),
    ("milliseconds", re.compile(r"\bms\b|millisecond"), re.compile(r"(_|^)(ms|millis(econds)?)$")),
    ("seconds", re.compile(r"\b(s|sec|secs|seconds?)\b"), re.compile(r"(_|^)(s|sec|secs|seconds)$")),
)


def _unit(text: str, column: bool) -> str | None:
    return next((unit for unit, said, named in _UNITS if (named if column else said).search(text.lower())), None)


def unit_mismatches(s: Suite) -> list[Finding]:
    """A reference whose metric says one unit (``%``, a fraction, ``ms``, ``s``) and whose column another: the verdict
    would compare a different quantity than the paper's claim (a count, ``reduce: count``, has no unit)."""
    out = []
    for i, m in enumerate(s.references.metrics if s.references is not None else []):
        if getattr(m, "reduce", None) == "count" or not m.column:
            continue
        said, read = _unit(m.metric, False), _unit(m.column, True)
        if said and read and said != read:
            out.append(Finding("quantity", f"reference {m.metric!r} is in {said} but compares column {m.column!r}, "
                               f"which is in {read}: the verdict would compare a different quantity than the claim "
                               "(name the column that holds the claim's quantity, or convert it in the parser)",
                               s.at("references", "metrics", i)))
    return out


def host_keyed_references(s: Suite) -> list[Finding]:
    """A reference that picks its row by a host's name (``where: {host: ...}``): the verdict holds only on a testbed
    whose hosts are named so (a replica, another lab or a new lease names them otherwise); a rank or a parameter
    says the same of every testbed."""
    out = []
    for i, m in enumerate(s.references.metrics if s.references is not None else []):
        for key in ("host", "hostname", "node"):
            if key in m.where and isinstance(m.where[key], str):
                out.append(Finding("host-label", f"reference {m.metric!r} picks its row by the host name "
                                   f"{m.where[key]!r} ({key}:): another testbed names its hosts otherwise, so the "
                                   "verdict would say not measured there (key it by rank, or by a parameter)",
                                   s.at("references", "metrics", i, "where", key)))
    return out

# --- fault timing -----------------------------------------------------------------------------------------------
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|m|min|h)?\s*$")
_UNIT = {None: 1.0, "ms": 0.001, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def seconds(name: str, value: Any) -> float | None:
    """``value`` as seconds (None: not a duration): a number (milliseconds when ``name`` ends in ``ms``, minutes
    in ``min``), or a string such as ``30``, ``30s``, ``5m``, ``1500ms``."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        n, unit = float(value), None
    else:
        m = _DURATION.match(str(value))
        if not m:
            return None
        n, unit = float(m.group(1)), m.group(2)
    if unit is None:
        low = name.lower()
        unit = "ms" if low.endswith("ms") else "min" if low.endswith(("min", "minutes")) else None
    return n * _UNIT[unit]


def _timeouts(s: Suite, p: dict[str, Any]) -> list[tuple[str, float]]:
    """(what it is, seconds) of every timeout the artifact itself keeps at point ``p``: parameters, vars and
    environment variables whose name holds 'timeout', and ``--...timeout... N`` or ``X_TIMEOUT=N`` written in the
    launch command."""
    found: list[tuple[str, float]] = []
    for k in s.parameters:
        if "timeout" in k.lower() and (v := seconds(k, p.get(k))) is not None:
            found.append((f"parameter {k}", v))
    for k, raw in s.vars.items():
        if "timeout" in k.lower():
            with contextlib.suppress(TestbedError):
                v = seconds(k, render(raw, dict(p), shell=False) if "{" in raw else raw)
                if v is not None:
                    found.append((f"var {k}", v))
    for k, raw in {**s.env, **s.steps.launch.env}.items():
        if "timeout" in k.lower():
            with contextlib.suppress(TestbedError):
                v = seconds(k, render(raw, dict(p), shell=False) if "{" in raw else raw)
                if v is not None:
                    found.append((f"environment variable {k}", v))
    words = proof._words(s.steps.launch.command)
    for i, w in enumerate(words):
        key, eq, value = w.partition("=")
        if "timeout" not in key.lower():
            continue
        if key.startswith("--") and not eq and i + 1 < len(words):
            value = words[i + 1]
        if (v := seconds(key.lstrip("-"), value)) is not None:
            found.append((f"launch option {key}", v))
    return found


def checkpoint_interval(s: Suite, p: dict[str, Any]) -> tuple[str, float] | None:
    """The largest checkpoint interval in seconds a parameter or var of ``p`` gives (a name holding ckpt or
    checkpoint and a unit of time: ``ckpt_interval``, ``checkpoint_seconds``), else None."""
    best: tuple[str, float] | None = None
    items: list[tuple[str, Any]] = [(k, p.get(k)) for k in s.parameters]
    for k, raw in s.vars.items():
        with contextlib.suppress(TestbedError):
            items.append((k, render(raw, dict(p), shell=False) if "{" in raw else raw))
    for k, value in items:
        low = k.lower()
        if ("ckpt" in low or "checkpoint" in low) and re.search(r"interval|seconds|secs|_s$|_sec$|time", low):
            v = seconds(k, value)
            if v is not None and (best is None or v > best[1]):
                best = (k, v)
    return best


def fault_timing(s: Suite, points: list[dict[str, Any]]) -> list[Finding]:
    """A suite with faults or a recovery whose grace does not exceed an artifact timeout plus a checkpoint."""
    if not (s.faults or s.steps.recovery):
        return []
    grace = s.timeouts.grace
    out = []
    for p in points:
        ckpt = checkpoint_interval(s, p)
        allow = ckpt[1] if ckpt else 0.0
        for what, t in _timeouts(s, p):
            if grace <= t + allow:
                plus = f" plus a checkpoint interval of {allow:g} s ({ckpt[0]})" if ckpt else " plus a checkpoint"
                out.append(Finding("fault-timing", f"timeouts.grace {grace:g} s cannot cover the artifact's {what} "
                                   f"{t:g} s{plus}: after one rank fails, the others are stopped before their own "
                                   "timeout lets them notice, checkpoint and end (raise grace above "
                                   f"{t + allow:g} s)", s.at("timeouts", "grace")))
    return out


# --- references -------------------------------------------------------------------------------------------------
def _same(a: Any, b: Any) -> bool:
    """Whether a point's value and a reference's cell are one value (1 and 1.0 are; 'True' and true are)."""
    if a is None or b is None:
        return False
    if not isinstance(a, bool) and not isinstance(b, bool):
        with contextlib.suppress(TypeError, ValueError):
            return float(a) == float(b)
    return str(a).lower() == str(b).lower()


def unproducible_references(s: Suite, runs: list[dict[str, Any]]) -> list[Finding]:
    """References whose row no point can produce: a ``where:`` naming a parameter value that no point (the default
    one, the matrix's) runs with, or a string that is a declared value (choice or matrix value) of a parameter
    no point runs with."""
    if s.references is None or not runs:
        return []
    declared = _declared(s)
    out = []
    for i, m in enumerate(s.references.metrics):
        asked = {k: v for k, v in m.where.items() if k in s.parameters}
        if asked and not any(all(r.get(k) is None or _same(r.get(k), v) for k, v in asked.items()) for r in runs):
            shown = ", ".join(f"{k}={v}" for k, v in asked.items())
            out.append(Finding("reference", f"reference {m.metric!r} needs a run with {shown}, which neither the "
                               "default point nor any matrix point is (add it to the matrix, or drop the reference)",
                               s.at("references", "metrics", i, "where")))
            continue
        for k, v in m.where.items():
            if k in s.parameters or not isinstance(v, str):
                continue
            modes = [p for p, vals in declared.items() if any(_same(v, x) for x in vals)]
            if modes and not any(_same(r.get(p), v) for p in modes for r in runs):
                out.append(Finding("reference", f"reference {m.metric!r} reads rows of {k} {v!r}, made by a run "
                                   f"with {modes[0]}={v}, which neither the default point nor any matrix point "
                                   "enables (add it to the matrix, or drop the reference)",
                                   s.at("references", "metrics", i, "where")))
    return out


def _declared(s: Suite) -> dict[str, list[Any]]:
    """Each str parameter's declared values (its choices, its matrix values): the modes a row may be named by."""
    declared: dict[str, list[Any]] = {}
    for k, prm in s.parameters.items():
        values = list(prm.choices or [])
        if isinstance(s.matrix, dict):
            values += s.matrix.get(k, [])
        elif isinstance(s.matrix, list):
            values += [pt[k] for pt in s.matrix if k in pt]
        if prm.type == "str":
            declared[k] = values
    return declared


def _tied(where: dict[str, Any], runs: list[dict[str, Any]], s: Suite, declared: dict[str, list[Any]]) -> set[int]:
    """The runs a reference's row comes from, as its ``where:`` names them (by a parameter, or by a mode: a declared
    value of a parameter); every run when it names none."""
    tied = set(range(len(runs)))
    for k, v in where.items():
        if k in s.parameters:
            tied &= {j for j, r in enumerate(runs) if _same(r.get(k), v)}
            continue
        modes = [p for p, vals in declared.items() if isinstance(v, str) and any(_same(v, x) for x in vals)]
        if modes:
            tied &= {j for j, r in enumerate(runs) if any(_same(r.get(p), v) for p in modes)}
    return tied


OTHER_RUN_RE = re.compile(r"\b((?:fault|error|failure|injection|bug)[- _]?free|uninjected|baseline|vanilla|unmodified)"
                          r"[- ](?:runs?|training)\b", re.IGNORECASE)
"""A reference's words naming another run its verdict compares with (``within ~2% of the fault-free run``)."""
OTHER_RUN_WORDS = {"free": ("fault_free", "fault-free", "faultfree", "error_free", "error-free", "failure_free",
                            "failure-free", "injection_free", "no_fault", "nofault", "uninjected"),
                   "base": ("baseline", "vanilla", "unmodified")}
"""What a command says when it makes such a run, by its kind: any of these words (a file, a flag, a folder)."""


def cross_point_verdicts(s: Suite, runs: list[dict[str, Any]]) -> list[Finding]:
    """A reference whose row one point makes and whose verdict compares with another run (its words: the fault-free
    run, the baseline run) that this point's commands never make, nor read from another point (``after:``): run
    alone the point has nothing to compare with, and in a campaign it is judged against another point's run."""
    runs = [dict(x) for x in {repr(sorted(r.items())): r for r in runs}.values()]
    if s.references is None or len(runs) < 2:
        return []
    said = [points.sketch(s, r).lower() for r in runs]
    edges = point_reads(s, runs)
    declared = _declared(s)
    out = []
    for i, m in enumerate(s.references.metrics):
        words = OTHER_RUN_RE.search(" ".join([m.metric, m.source, m.tolerance.why]))
        tied = _tied(m.where, runs, s, declared)
        if words is None or not tied or len(tied) == len(runs):
            continue
        kind = OTHER_RUN_WORDS["base" if words[1].lower() in OTHER_RUN_WORDS["base"] else "free"]
        makes = [j for j, text in enumerate(said) if any(w in text for w in kind)]
        for j in sorted(tied):
            if j in makes or any(k in makes for k in edges[j].values() if k is not None):
                continue
            others = [point_label(s, runs[k]) for k in makes]
            who = f"only {' and '.join(others)} {'makes' if len(others) == 1 else 'make'}" if others else \
                "no point makes"
            out.append(Finding("cross-point", f"reference {m.metric!r} is judged on the run of "
                               f"{point_label(s, runs[j])} against {words[0].lower()!r}, which {who}: that point run "
                               "alone has no such run to compare with, and a campaign judges it against another "
                               "point's (make that run in this point too, or declare `after:` so it reads the point "
                               "that makes it)",
                               s.at("references", "metrics", i)))
    return out


# --- the testbed's length -----------------------------------------------------------------------------------------
def campaign_outlives_testbed(s: Suite) -> list[Finding]:
    """A matrix whose campaign, as its estimates add up on the suite's own testbed, is longer than that testbed's spec
    gives (a lease's hours, an ``expire:``): rented as shipped, the campaign is refused, or the lease ends under it."""
    if not s.matrix or not s.testbed:
        return []
    try:
        fc = forecast.forecast(s, s.testbed, {}, matrix=True, store=Store.empty(paths.state_home() / "lint"))
    except TestbedError:
        return []  # a suite its testbed refuses, or no spec: other findings and refusals name it
    left, total = fc.fit.get("left_seconds"), fc.total_seconds
    if left is None or total is None or total <= left:
        return []
    spec = paths.find_resource("inventories", f"{s.testbed}.yml")
    return [Finding("testbed-length", f"the campaign of {s.name} is estimated at {span(total)} on testbed "
                    f"{s.testbed!r}, whose spec gives {span(left)} ({fc.fit.get('basis')}"
                    + (f", {spec}" if spec else "") + "): rented as shipped, it is refused or its lease ends under "
                    "it (give the spec a longer lease or expiry, or split the matrix)", s.at("testbed"))]


# --- hardware ---------------------------------------------------------------------------------------------------
def needs_hardware(s: Suite, runs: list[dict[str, Any]] | None = None) -> list[str]:
    """What the suite's ranks need beyond a CPU host, at any of ``runs`` (default: the default point and every
    matrix point; a point whose needs cannot be rendered counts for none): gpu and/or tpu."""
    need: set[str] = set()
    for p in runs if runs is not None else _runs(s):
        with contextlib.suppress(TestbedError):
            need |= set(points.launch_needs(s, p))
    out = []
    if need & {"gpu", "cuda", "nvidia-driver"}:
        out.append("gpu")
    if "tpu" in need:
        out.append("tpu")
    return out


def _count(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 1  # a template or a variable: declared, its number filled in later


def spec_hardware(path: Path) -> tuple[str, set[str]] | None:
    """(provider kind, what its hosts have of gpu and tpu) as a testbed spec file declares them, read as written
    (a spec whose ``${VAR}`` is unset here still declares its hardware); None when it cannot be read."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("provider"), dict):
        return None
    kind = str(data["provider"].get("kind", ""))
    raw = data.get("hardware")
    hw: dict[str, Any] = raw if isinstance(raw, dict) else {}
    listed = hw.get("hosts")
    hosts: dict[str, Any] = listed if isinstance(listed, dict) else {}
    gpus = [hw.get("gpu")] + [h.get("gpu") for h in hosts.values() if isinstance(h, dict)]
    has = {"gpu"} if any(isinstance(g, dict) and _count(g.get("count", 1)) > 0 for g in gpus) else set()
    if kind in PROVIDERS and provider_class(kind).accelerator == "tpu":
        has.add("tpu")
    return kind, has


def hardware_missing(s: Suite, specs: dict[str, Path] | None = None,
                     runs: list[dict[str, Any]] | None = None) -> list[Finding]:
    """A suite that needs a GPU (TPU) at a point of ``runs`` when no testbed spec it may run on (of a provider kind
    it allows) declares one, or when the testbed it names lacks it."""
    need = needs_hardware(s, runs)
    if not need:
        return []
    loaded = {name: hw for name, path in (specs if specs is not None else paths.list_resources("inventories")).items()
              if (hw := spec_hardware(Path(path))) is not None}
    allowed = {n: hw for n, (kind, hw) in loaded.items() if not s.requires.providers or kind in s.requires.providers}
    out = []
    for n in need:
        word = "a GPU" if n == "gpu" else "a TPU"
        having = [name for name, hw in allowed.items() if n in hw]
        if not having:
            kinds = ", ".join(s.requires.providers) or "any"
            checked = ", ".join(sorted(allowed)) or "none"
            out.append(Finding("hardware", f"suite {s.name} needs {word}, and no shipped testbed spec it may run on "
                               f"(provider kinds: {kinds}; specs: {checked}) declares one: there is nothing to rent "
                               f"it on (ship a spec with hardware: {n}: ...)", s.at("requires")))
        elif s.testbed in loaded and n not in loaded[s.testbed][1]:
            out.append(Finding("hardware", f"suite {s.name} needs {word}, and its testbed {s.testbed} declares none "
                               f"(specs that do: {', '.join(having)})", s.at("testbed")))
    return out


# --- login PATH -------------------------------------------------------------------------------------------------
def set_up_text(profile: str | None) -> str:
    """The text of what the profile's set-up would do (its file, and its roles' tasks, defaults, vars and
    templates): a command it names is one it may install. Bounded: role files of up to 256 KiB each."""
    if not profile:
        return ""
    try:
        plan = prof.load_profile(profile)
        parts = [prof.available_profiles()[profile].read_text(errors="replace")]
        roots = prof.role_roots()
    except (TestbedError, OSError, KeyError):
        return ""
    for role in plan.roles:
        for root in roots:
            for f in sorted((root / role).glob("*/*"))[:200]:
                with contextlib.suppress(OSError):
                    if f.is_file() and f.stat().st_size <= 256 << 10:
                        parts.append(f.read_text(errors="replace"))
    return "\n".join(parts)


def login_only_programs(profile_text: str) -> dict[str, str]:
    """Program -> the folder only a login PATH holds it in: conda's (conda, mamba), and what the profile puts
    in ``~/.local/bin``."""
    out = dict.fromkeys(LOGIN_ONLY, "it is in a conda installation's bin, which conda init adds for login shells")
    for m in re.finditer(r"\.local/bin/([A-Za-z0-9_][A-Za-z0-9_.+-]*)", profile_text):
        out.setdefault(m.group(1), "the profile installs it in ~/.local/bin, which a login shell's ~/.profile adds")
    return out


def _commands(s: Suite) -> list[tuple[str, str, Loc]]:
    """(what, command text, location) of every command the suite runs on a host."""
    out: list[tuple[str, str, Loc]] = []

    def steps(items: list[Step], label: str, loc: Loc) -> None:
        for i, st in enumerate(items):
            if st.run:
                out.append((f"{label} step '{st.name or f'{label}-{i + 1}'}'", st.run, (*loc, i, "run")))

    steps(s.steps.prepare, "prepare", ("steps", "prepare"))
    out.append(("the launch command", s.steps.launch.command, ("steps", "launch", "command")))
    steps(s.steps.recovery, "recovery", ("steps", "recovery"))
    steps(s.steps.post, "post", ("steps", "post"))
    for name, f in s.faults.items():
        for key in ("command", "restore"):
            text = getattr(f, key)
            if text:
                out.append((f"fault {name}'s {key}", text, ("faults", name, key)))
        if f.recovery:
            steps(f.recovery, f"fault {name}'s recovery", ("faults", name, "recovery"))
    return out


def login_path_only(s: Suite, profile_text: str) -> list[Finding]:
    """Commands calling a program by name that only a login shell's PATH holds, without reaching it themselves
    (its folder on PATH, its path, a login shell): steps, ranks and faults run in a non-login shell over ssh."""
    only = login_only_programs(profile_text)
    out = []
    for what, text, loc in _commands(s):
        if any(w in text for w in LOGIN_REACH):
            continue
        for prog in proof.commands_called(text):
            where = only.get(prog)
            if where is None:
                continue
            reach = CONDA_REACH if prog in LOGIN_ONLY else (".local/bin",)
            if not any(w in text for w in reach):
                out.append(Finding("login-path", f"{what} calls {prog}, which only a login shell's PATH has ({where}); "
                                   "steps, ranks and faults run in a non-login shell, where it is not found (call it "
                                   "by its path, or put its folder on PATH in the command)", s.at(*loc)))
    return out
