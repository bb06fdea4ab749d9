"""Suites: ``experiments/<name>/suite.yml`` (or the single file ``experiments/<name>.yml``) validated into typed
models, parameters and matrices.

A suite says what to set up (``profile``), what sources and files a run needs, its parameters (typed, with
defaults and allowed values) and matrix, where ranks run (``placement``), its steps (``prepare``, ``launch``,
``recovery``, ``post``), timeouts, outputs, checks and faults. Commands are Jinja2 templates rendered with
StrictUndefined; every ``{{ value }}`` that reaches a shell is quoted (``shlex.quote``), so parameters holding
shell metacharacters stay inert. ``{{ x | raw }}`` opts out (for values the suite itself builds).
"""

from __future__ import annotations

import itertools
import math
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from testbed import fault_kinds, paths, rx, suite_fetch, templating, yamlfile
from testbed.errors import UsageError
from testbed.estimate import ESTIMATE_RULE, declared
from testbed.references import References
from testbed.spec import TOOL_RE
from testbed.tables import DeclaredTable, table_names
from testbed.yamlfile import Invalid, Loc

if TYPE_CHECKING:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

SUITE_NAME_RE = r"^[a-z][a-z0-9-]{0,40}$"
PARAM_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
ENV_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"  # what a shell takes after 'export'
MAX_MATRIX_POINTS = 1000
"""The most runs one matrix may hold: a campaign plans every point before its first run (about 6 ms each)."""
MAX_RANKS = 4096
"""The most ranks (and hosts) one run may have, counted before any is planned (a TPU v4-4096 pod has 1,024
hosts; testbed.run.plan refuses more)."""
MAX_WAIT = 30 * 86400
"""The longest timeout, grace or fault time a suite may give, in seconds (a month: the longest expiry too)."""
BUILTINS = {
    "params": "every parameter", "testbed": "the testbed (name, provider, subnet, hardware, vars)",
    "suite": "the suite's name", "run_id": "the run's id", "run_dir": "the run folder", "hostfile": "the MPI hostfile",
    "attempt": "the launch attempt", "recovering": "whether a recovery relaunched the ranks",
    "testbed_hosts": "the testbed's host count", "faults": "the faults fired", "hosts": "the run's host names",
    "addresses": "the run's host addresses", "num_hosts": "the run's host count", "master": "rank 0's host",
    "master_addr": "rank 0's address", "world_size": "the rank count", "rank": "the rank",
    "local_rank": "the rank on its host", "host": "the host a command runs on", "address": "that host's address",
    "host_hardware": "that host's hardware", "reads": "the run folders of the points this point reads",
    # Jinja2's own globals and names
    "range": "Jinja2's range()", "dict": "Jinja2's dict()", "lipsum": "Jinja2's lipsum()",
    "cycler": "Jinja2's cycler()", "joiner": "Jinja2's joiner()", "namespace": "Jinja2's namespace()",
    "loop": "a for loop's state", "self": "the template's blocks", "caller": "a call block's body",
    "varargs": "a macro's extra arguments", "kwargs": "a macro's keyword arguments",
}
"""The names a suite's templates get from testbed (testbed.run.plan) and Jinja2: a parameter or var of one of these
names would be shown, then lost behind it (or hide it), so it is refused."""
SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGSEGV", "SIGABRT", "SIGBUS", "SIGSTOP", "SIGCONT", "SIGUSR1",
           "SIGUSR2", "SIGHUP", "SIGQUIT")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


def _env_names(env: dict[str, str]) -> dict[str, str]:
    """Environment variable names a shell can export: a name that is not one would break (or inject into) the
    ``export NAME=value`` lines every rank and step starts with."""
    for k in env:
        if not re.match(ENV_RE, k):
            raise Invalid(f"'{k}' is not an environment variable name", loc=(k,),
                          fix="use letters, digits and _, not starting with a digit (e.g. MY_VAR)")
    return env


def selector_parts(on: str) -> list[str]:
    """The comma-separated items of a host selection (``all``, ``master``, a group, a host, ``rank:K``)."""
    return [p.strip() for p in on.split(",") if p.strip()]


def _selector(v: str | None) -> str | None:
    """A host selection names at least one thing: an empty one would widen to every host or none."""
    if v is not None and "{{" not in v and not selector_parts(v):
        raise Invalid(f"{v!r} selects no host", fix="name all, master, workers, a group, a host or rank:K")
    return v


class Param(Strict):
    """One parameter: ``-p name=value`` on the command line, ``{{ name }}`` in templates."""

    type: Literal["str", "int", "float", "bool"] = Field("str", description="what a value is converted to and "
                                                         "checked as (-p values arrive as text)")
    default: Any = Field(None, description="the value when -p gives none; a string default may be a template "
                         "(rendered before the hosts are known)")
    choices: list[Any] | None = Field(None, description="the only values allowed")
    min: float | None = Field(None, description="smallest allowed value (int and float parameters)")
    max: float | None = Field(None, description="largest allowed value (int and float parameters)")
    help: str = Field("", description="what it means: shown by testbed show and in a missing parameter's error")
    required: bool = Field(False, description="a run without -p for it (and no default) is refused",
                           json_schema_extra={"example": 'dataset: {type: str, required: true}'})


class Requires(Strict):
    providers: list[str] = Field(default_factory=list, description="providers it runs on; empty: any")
    hosts: int = Field(1, ge=1, le=MAX_RANKS, description="minimum number of hosts")
    accelerator: str | None = Field(None, description="cpu, gpu or tpu")


class Source(Strict):
    """A repository cloned (or updated) on every host of the run before the prepare steps."""

    name: str = Field(pattern=PARAM_RE, description="what --source NAME=PATH|URL[@REF] and the spec's sources: "
                      "call it, and the manifest records it by")
    repo: str = Field(description="the git URL cloned on the hosts")
    ref: str | None = Field(None, description="the branch, tag or commit checked out; default: the remote's HEAD")
    path: str = Field(description="where it lives on the host, e.g. ~/my-app")
    submodules: bool = Field(False, description="also check out its submodules, recursively (GitHub's ssh URLs "
                             "fetched over https)")
    edits: list[str] = Field(default_factory=list, description="tracked files of the checkout (globs relative to "
                             "it) that the suite's steps change on purpose; testbed rehearse fails a run that "
                             "changes any other")


Need = Literal["gpu", "tpu", "cuda", "nvidia-driver", "network", "torch-fork"]
"""What a step or rank needs beyond a CPU host (torch-fork: a fork of PyTorch the profile builds from source for
hours); ``testbed rehearse`` replaces (launch) or skips (steps) what the local replica lacks."""


NEEDS: tuple[str, ...] = get_args(Need)
NEEDS_FIX = f"a need is one of {', '.join(NEEDS)}"


def template_syntax(text: str) -> str:
    """``text`` when it parses as a Jinja2 template (checked when the suite loads, rendered per point)."""
    import jinja2

    try:
        _env(False).parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise Invalid(f"template error in {text!r}: {e.message}", fix="fix the Jinja2 syntax") from None
    return text


def condition_syntax(cond: str) -> str:
    """``cond`` when it parses as a Jinja2 condition (an ``{% if %}`` test over the point's parameters)."""
    import jinja2

    try:
        _env(False).parse("{% if " + cond + " %}1{% endif %}")
    except jinja2.TemplateSyntaxError as e:
        raise Invalid(f"'when: {cond}' is not a condition: {e.message}",
                      fix="write a Jinja2 test over the point's parameters, e.g. when: \"gpus > 0\"") from None
    return cond


class NeedsWhen(Strict):
    """Needs that apply only at the points where ``when`` holds."""

    when: str = Field(description="a Jinja2 condition over the point's parameters (no braces)",
                      json_schema_extra={"example": 'when: "gpus > 0"'})
    needs: list[str] = Field(description="what those points need (gpu, tpu, cuda, nvidia-driver, network, "
                             "torch-fork)", json_schema_extra={"example": "needs: [gpu, cuda]"})

    _when = field_validator("when")(classmethod(lambda cls, v: condition_syntax(v)))

    @field_validator("needs")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        return known_needs(v)


class ProbeWhen(Strict):
    """Programs a rehearsal probes only at the points where ``when`` holds."""

    when: str = Field(description="a Jinja2 condition over the point's parameters (no braces)",
                      json_schema_extra={"example": "when: \"model == 'bert'\""})
    probe: list[str] = Field(description="the programs probed at those points (as steps.launch.probe)",
                             json_schema_extra={"example": "probe: [bert/run.py]"})


def known_needs(v: list[str]) -> list[str]:
    """Each item a need; a template item is rendered per point, and checked then."""
    for i, n in enumerate(v):
        if is_template(n):
            template_syntax(n)
        elif n not in NEEDS:
            raise Invalid(f"'{n}' is not a need", loc=(i,), fix=NEEDS_FIX)
    return v


def _per_point(v: Any, key: str) -> Any:
    """A ``needs:`` or ``probe:`` value as written, checked before it is typed (one message at the culprit's line):
    a list of items (``needs``: each a need or a template) and ``{when, <key>}`` entries, or (``needs``) one
    template."""
    if isinstance(v, str) and key == "needs":
        return template_syntax(v)
    for i, n in enumerate(v if isinstance(v, list) else []):
        try:
            if isinstance(n, str) and key == "needs":
                known_needs([n])
            elif isinstance(n, str) and is_template(n):
                template_syntax(n)
            elif isinstance(n, dict) and set(n) == {"when", key}:
                condition_syntax(str(n["when"]))
                if key == "needs" and isinstance(n[key], list):
                    try:
                        known_needs([str(x) for x in n[key]])
                    except Invalid as e:
                        raise Invalid(str(e), loc=(key, *e.loc), fix=e.fix) from None
            elif isinstance(n, dict):
                raise Invalid(f"an entry of {key} per point has the keys when and {key}, not "
                              f"{', '.join(map(str, n)) or 'none'}", fix=f"write {{when: CONDITION, {key}: [...]}}")
        except Invalid as e:
            raise Invalid(str(e), loc=(i, *e.loc[1:]) if isinstance(n, str) else (i, *e.loc), fix=e.fix) from None
    return v


PointNeeds = str | list[str | NeedsWhen]
"""``needs:`` per point: a list of needs (each item may be a template, or a ``{when, needs}`` entry), or one
template rendered per point to needs (spaces or commas)."""


class Step(Strict):
    """A command run on a set of hosts (in parallel) that must finish before the next step."""

    name: str | None = Field(None, min_length=1, description="its log is kept by this name")
    on: str = Field("all", description="all, master, workers, a group, a host name or rank:K")
    run: str | None = Field(None, description="the shell command (a template; its values shell-quoted), run in the "
                            "run folder on each selected host")
    relaunch: bool | str | None = Field(None, description="recovery only: restart every rank (true: the launch "
                                        "command with attempt+1; a string: that command)")
    repair: bool = Field(False, description="recovery only: bring back every host of the run that does not answer "
                                            "(provision --repair), set it up again, and upload the run to it")
    setup: bool = Field(True, description="repair only: apply the run's profile to a repaired host",
                        json_schema_extra={"example": '- {name: repair, repair: true, setup: false}'})
    attempts: int = Field(2, ge=1, le=100, description="repair only: how many host repairs the run may make")
    timeout: float | None = Field(None, gt=0, le=MAX_WAIT, description="seconds it may take on a host; default: "
                                  "timeouts.prepare (timeouts.post for a post step)")
    cwd: str | None = Field(None, description="folder to cd into first (a template), relative to the run folder, "
                            "~/ or absolute")
    per: Literal["host", "home"] = Field("host", description="home: the step writes only under ~/ and runs once per "
                                         "home folder (on the first of its hosts when the testbed's home is shared)")
    needs: PointNeeds = Field(default_factory=list, description="what the step needs beyond a CPU host (gpu, tpu, "
                              "cuda, nvidia-driver, network, torch-fork); a rehearsal skips it, with the reason, on "
                              "hosts that lack it. Per point: an item may be a template, or {when: CONDITION, "
                              "needs: [...]}; or the whole value one template rendered to needs",
                              json_schema_extra={"example": "needs: [network, {when: \"gpus > 0\", needs: [gpu]}]"})

    _on = field_validator("on")(classmethod(lambda cls, v: _selector(v)))
    _needs = field_validator("needs", mode="before")(classmethod(lambda cls, v: _per_point(v, "needs")))

    @model_validator(mode="after")
    def _one(self) -> Step:
        if (self.run is not None) + (self.relaunch not in (None, False)) + self.repair != 1:
            raise ValueError("a step needs exactly one of 'run', 'relaunch' or 'repair'")
        return self


class Checkpoint(Strict):
    """Where the workload's checkpoints live, and the log lines that tell steps (for the steps a recovery redoes)."""

    file: str = Field(description="the checkpoint file, relative to the run folder (or ~/ or absolute)")
    on: str = Field("master", description="the host(s) that hold it: master, all, a group, a host or rank:K")
    rank: int = Field(0, ge=0, description="the rank whose log the patterns below read",
                      json_schema_extra={"example": 'rank: 0'})
    saved: str | None = Field(None, description="regex of the log line written with a checkpoint; group 1: its step")
    progress: str | None = Field(None, description="regex of the log line of each step; group 1: the global step")

    _on = field_validator("on")(classmethod(lambda cls, v: _selector(v)))

    @field_validator("saved", "progress")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            why = rx.problem(v)
            if why is not None:
                raise ValueError(why)
            if rx.compile(v).groups < 1:
                raise ValueError("it needs a group (in parentheses) capturing the step number")
        return v


class Launch(Strict):
    """The run itself: ``command`` per rank on ``on`` hosts (or one launcher such as mpirun on the master)."""

    on: str = Field("all", description="the hosts that start ranks: all, master, workers, a group, a host name or "
                    "rank:K (comma-separated)")
    ranks_per_host: int = Field(1, ge=1, le=256, description="ranks started on each of those hosts (local_rank 0 "
                                "to this - 1)",
                                json_schema_extra={"example": 'ranks_per_host: 4'})
    command: str = Field(description="each rank's shell command (a template rendered per rank; values "
                         "shell-quoted), started detached in the run folder")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables of each rank; values are "
                                "templates rendered per rank (not shell-quoted: exported quoted)")
    cwd: str | None = Field(None, description="folder each rank starts in (a template), relative to the run "
                            "folder, ~/ or absolute")
    needs: PointNeeds | None = Field(None, description="what the ranks need beyond a CPU host; default: the "
                                     "suite's requires.accelerator (gpu or tpu). Per point: an item may be a "
                                     "template, or {when: CONDITION, needs: [...]}; or the whole value one template "
                                     "rendered to needs (spaces or commas; empty: none)",
                                     json_schema_extra={"example": "needs: \"{{ 'gpu cuda' if gpus > 0 else '' }}\""})
    probe: list[str | ProbeWhen] = Field(default_factory=list, description="the programs (Python scripts, relative "
                                         "to the launch folder) a rehearsal replaces by a probe when the ranks' needs "
                                         "are not met (a compiled program named here: its ranks are skipped, with "
                                         "the reason); default: every Python script the ranks start from a source "
                                         "checkout. Per point: an item may be a template (empty: none), or {when: "
                                         "CONDITION, probe: [...]}")

    _on = field_validator("on")(classmethod(lambda cls, v: _selector(v)))
    _needs = field_validator("needs", mode="before")(classmethod(lambda cls, v: _per_point(v, "needs")))
    _probe = field_validator("probe", mode="before")(classmethod(lambda cls, v: _per_point(v, "probe")))
    _env = field_validator("env")(classmethod(lambda cls, v: _env_names(v)))


class Steps(Strict):
    prepare: list[Step] = Field(default_factory=list, description="steps run in order after the sources are "
                                "checked out and before the launch")
    launch: Launch = Field(description="the ranks")
    recovery: list[Step] = Field(default_factory=list, description="steps run after a fault fires or a host is "
                                 "lost, once per attempt: repair, then relaunch the ranks")
    post: list[Step] = Field(default_factory=list, description="steps run after every rank ended, before the "
                             "checks and the collect")


class Placement(Strict):
    hosts: int | str | None = Field(None, description="how many hosts the run uses (template allowed); "
                                    "default: all")
    master: str | None = Field(None, description="host name or group holding rank 0; default: group 'master'",
                               json_schema_extra={"example": 'master: node0'})
    slots: int = Field(1, ge=1, description="slots per host in the rendered MPI hostfile",
                       json_schema_extra={"example": 'slots: 8'})

    _master = field_validator("master")(classmethod(lambda cls, v: _selector(v)))


class Timeouts(Strict):
    prepare: float = Field(1800, gt=0, le=MAX_WAIT, description="seconds each source, prepare and recovery step "
                           "(and a repair) may take, unless the step sets its own timeout")
    run: float = Field(3600, gt=0, le=MAX_WAIT, description="seconds from the first launch until every rank ended, "
                                               "recoveries included; then the run is stopped: timed-out")
    post: float = Field(600, gt=0, le=MAX_WAIT, description="seconds each post step may take, unless it sets "
                        "its own timeout",
                        json_schema_extra={"example": 'timeouts: {post: 1200}'})
    grace: float = Field(10, ge=0, le=MAX_WAIT, description="after one rank fails, how long the others get to end")
    unreachable: float = Field(8, gt=0, le=MAX_WAIT, allow_inf_nan=False, description="seconds over which a host "
                               "must be found "
                               "lost (connection refused, no route, its machine gone at the provider), by 'probes' "
                               "probes spaced over them, before the run judges it lost and may repair it; a probe "
                               "that times out finds the host slow, never lost (the testbed's lost_after raises it)")
    probes: int = Field(3, ge=2, le=20, description="how many probes in a row, spaced over 'unreachable' seconds, "
                                                    "must each find a host lost before it is judged lost",
                        json_schema_extra={"example": 'timeouts: {unreachable: 30, probes: 5}'})
    poll: float = Field(1.0, gt=0, le=30, description="seconds between two polls of the ranks (their exit codes "
                        "and the log lines faults and progress wait for)")


class Fault(Strict):
    """A fault fired during the run: at a time after launch or when a log line appears."""

    description: str = Field("", description="what it does, in words (testbed show lists it)")
    action: fault_kinds.FaultAction = Field(description="what it does: " + "; ".join(
        f"{k.name}: {k.doc}" for k in fault_kinds.kinds()))
    signal: str = Field("SIGKILL", description="signal action: the signal sent to the target rank's process "
                        "group (SIGKILL, SIGTERM, ...; the SIG may be left out)")
    command: str | None = Field(None, description="command action: the shell command run on the target host (a "
                                "template; values shell-quoted)")
    restore: str | None = Field(None, description="command that undoes it (run before recovery)")
    rank: int | str | None = Field(None, description="target rank (template allowed)")
    host: str | None = Field(None, description="target host: a host's name, master, rank:K, a group of one host, "
                             "or a template giving one (a selection of several hosts is refused at file:line: a "
                             "fault fires on one); default: the rank's",
                             json_schema_extra={"example": 'host: "{{ hosts[-1] }}"'})
    at: float | None = Field(None, ge=0, le=MAX_WAIT, description="seconds after launch")
    when: str | None = Field(None, description="regular expression matched against the watched rank's log")
    watch_rank: int | None = Field(None, description="rank whose log 'when' watches; default: the target rank")
    recovery: list[Step] | None = Field(None, description="default: steps.recovery")
    needs: list[str] = Field(default_factory=list, description="what firing it needs on its host: gpu, tpu, cuda, "
                             "nvidia-driver, network, or a command (tc, iptables, setpci); a run on a testbed that "
                             "lacks one is refused before any host, a rehearsal skips the point with the reason")

    _host = field_validator("host")(classmethod(lambda cls, v: _selector(v)))

    @field_validator("needs")
    @classmethod
    def _needs(cls, v: list[str]) -> list[str]:
        for n in v:
            if not re.match(TOOL_RE, n):
                raise ValueError(f"'{n}' is neither a capability (gpu, tpu, cuda, nvidia-driver, network) nor a "
                                 "command name")
        return v

    @field_validator("signal")
    @classmethod
    def _sig(cls, v: str) -> str:
        s = v.upper() if v.upper().startswith("SIG") else "SIG" + v.upper()
        if s not in SIGNALS:
            raise ValueError(f"unknown signal {v}; one of {', '.join(SIGNALS)}")
        return s

    @model_validator(mode="after")
    def _check(self) -> Fault:
        fault_kinds.get(self.action).check(self)  # its trigger and the fields its kind needs
        if self.when is not None:
            try:
                re.compile(self.when)
            except re.error as e:
                raise ValueError(f"'when' is not a regular expression: {e}") from None
            python_only = re.search(r"\\[dD]|\(\?|[*+?}]\?", self.when)
            if python_only:  # grep -E would never match: the fault would silently never fire
                raise ValueError(f"'when' is matched on the host by grep -E, which has no "
                                 f"'{python_only.group(0)}' (write [0-9] for \\d; no (?...) groups, no lazy "
                                 "quantifiers)")
        return self


class Check(Strict):
    """After the run: ``file`` (glob in the run dir) exists on the hosts and, optionally, matches a regex; or, in
    the report, rows of a results ``table`` (and their ``column`` within ``min``..``max``)."""

    name: str = Field(description="what the run's events and logs (or the report's checks) call it (check <name>)")
    file: str | None = Field(None, description="a glob relative to the run folder; at least one file must match on "
                             "each host (a check names a file or a table)")
    contains: str | None = Field(None, description="an extended regular expression (grep -E) some line of the "
                                 "file(s) must match")
    on: str = Field("all", description="the hosts checked: all, master, workers, a group, a host name or rank:K")
    table: str | None = Field(None, description="a results table (a declared table, a report.py parser's, or one "
                              "testbed's report makes): judged in the report, not on the hosts",
                              json_schema_extra={"example": "- {name: loss finite, table: steps, column: loss, "
                                                            "max: 100}"})
    where: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="table only: the rows checked (column -> cell value); default: all",
        json_schema_extra={"example": "where: {host: node0}"})
    column: str | None = Field(None, description="table only: the column whose every value min and max bound",
                               json_schema_extra={"example": "column: loss"})
    min: float | None = Field(None, description="table only: the smallest value the column may hold",
                              json_schema_extra={"example": "min: 0"})
    max: float | None = Field(None, description="table only: the largest value the column may hold",
                              json_schema_extra={"example": "max: 100"})
    rows: int = Field(1, ge=0, description="table only: the fewest rows it must have (where they match)",
                      json_schema_extra={"example": "rows: 10"})
    when: str | None = Field(None, description="a Jinja2 condition over the point's parameters (no braces): the "
                             "check applies only at the points where it holds (file and contains may also be "
                             "templates over them)", json_schema_extra={"example": "when: \"task == 'train'\""})

    _on = field_validator("on")(classmethod(lambda cls, v: _selector(v)))
    _when = field_validator("when")(classmethod(lambda cls, v: v if v is None else condition_syntax(v)))
    _tmpl = field_validator("file", "contains")(
        classmethod(lambda cls, v: template_syntax(v) if v is not None and is_template(v) else v))

    @model_validator(mode="after")
    def _kind(self) -> Check:
        if (self.file is None) == (self.table is None):
            raise Invalid("a check names a 'file' (on the hosts) or a 'table' (in the report)",
                          fix="give one of file: GLOB or table: NAME")
        fields_set = self.model_fields_set
        extra: list[str]
        if self.file is not None:
            extra = [k for k in ("where", "column", "min", "max", "rows") if k in fields_set]
            if extra:
                raise Invalid(f"'{extra[0]}' checks a table, not a file", loc=(extra[0],),
                              fix="drop it, or check a table: table: NAME")
        else:
            extra = [k for k in ("contains", "on") if k in fields_set]
            if extra:
                raise Invalid(f"'{extra[0]}' checks files on the hosts, not a table", loc=(extra[0],),
                              fix="drop it (a table check reads the report's table; where: picks its rows)")
            if (self.min is not None or self.max is not None) and self.column is None:
                raise Invalid("min and max bound a column", loc=("min" if self.min is not None else "max",),
                              fix="add column: NAME")
        return self


class After(Strict):
    """Matrix points that read another point's output: each runs after the point it reads, in a campaign, and
    finds its run folder as ``{{ reads.<name> }}``."""

    name: str = Field(pattern=PARAM_RE, description="what the reading points call the output: {{ reads.<name> }} is "
                      "the run folder of the point read, on the hosts (the reading point runs on that point's hosts)",
                      json_schema_extra={"example": "name: trained"})
    point: dict[str, bool | int | float | str] = Field(default_factory=dict, description="the points that read "
                                                       "(parameter -> value); empty: every point",
                                                       json_schema_extra={"example": "point: {phase: eval}"})
    reads: dict[str, bool | int | float | str] = Field(min_length=1, description="the point each of them reads: "
                                                       "its own parameters with these values in place (a matrix "
                                                       "point; a cycle is refused)",
                                                       json_schema_extra={"example": "reads: {phase: train}"})


class EstimateBy(Strict):
    """``estimate:`` per value of a parameter: ``cases`` maps its values to estimates; ``other`` the rest."""

    by: str = Field(description="the parameter whose value picks the estimate")
    cases: dict[str, str] = Field(min_length=1, description="its values, each with an estimate (a duration, or a "
                                  "sum of terms)")
    other: str | None = Field(None, description="the estimate of every other value; none: those have no estimate")


class Suite(Strict):
    """One suite: ``experiments/<name>/suite.yml`` (or ``experiments/<name>.yml``)."""

    name: str = Field(pattern=SUITE_NAME_RE, description="the suite's name: lower-case letters, digits and -; "
                      "default: its folder's name (or the file's)")
    description: str = Field("", description="one line on what it runs (testbed list suites, testbed show)")
    testbed: str | None = Field(None, description="default --on")
    requires: Requires = Field(default_factory=Requires, description="what a testbed must have for the suite: "
                               "checked at plan, before anything is rented")
    profile: str | None = Field(None, description="the set-up profile (playbooks/profiles/<name>.yml) a run "
                                "applies to its hosts first")
    setup_roles: str | None = Field(None, max_length=2000, description="the profile's roles a point needs, when it "
                                    "needs fewer than all: a template rendered per point to role names (spaces or "
                                    "commas); empty: the whole profile. Each is checked against the profile")
    sources: list[Source] = Field(default_factory=list, description="git repositories checked out on the hosts "
                                  "before the prepare steps")
    files: list[str] = Field(default_factory=list, description="files next to the suite copied into the run dir")
    parameters: dict[str, Param] = Field(default_factory=dict, description="the run's inputs by name (-p "
                                         "name=value); each is a template variable of its name")
    matrix: dict[str, list[Any]] | list[dict[str, Any]] | None = Field(
        None, description="the campaign of --matrix: per parameter, its values (every combination), or a list of "
        "points (each some parameters' values)")
    after: list[After] = Field(default_factory=list, description="matrix points that read what other points "
                               "made: a campaign runs each after the point it reads, on that point's hosts, and "
                               "plan and --dry-run show the order",
                               json_schema_extra={"example": "after:\n  - {name: trained, point: {phase: eval}, "
                                                             "reads: {phase: train}}"})
    vars: dict[str, str] = Field(default_factory=dict, description="derived values (templates), in order")
    placement: Placement = Field(default_factory=Placement, description="which hosts the run uses and which one "
                                 "holds rank 0")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables exported (as written, "
                                "not templates) before every step and rank")
    steps: Steps = Field(description="what runs where: prepare, launch, recovery, post")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="how long each phase may take, and how lost "
                               "hosts are found")
    outputs: list[str] | dict[str, list[str]] = Field(
        default_factory=list, description="globs of files to collect: relative to the run folder, '~/'-relative "
        "or absolute; a list for every host, or a mapping of host selections (all, master, ...) to lists; a "
        "template is rendered per point (empty: none for that point)")
    environment: str | None = Field(None, description="the venv or conda env (its prefix, e.g. ~/app_env) every "
                                    "step and rank runs in; a template (per host and rank)")
    checks: list[Check] = Field(default_factory=list, description="after the post steps: files that must exist on "
                                "the hosts, and lines they must hold; a failed check fails the run")
    faults: dict[str, Fault] = Field(default_factory=dict, description="the faults a run may fire, by name "
                                     "(--fault NAME, or a 'fault' parameter)")
    default_faults: list[str] = Field(default_factory=list, description="the faults fired when neither --fault "
                                      "nor a 'fault' parameter picks")
    demo: list[list[str]] = Field(default_factory=list, description="the runs 'testbed demo' makes of the suite, "
                                  "in order: each the options added to 'testbed run SUITE --on TESTBED --no-setup' "
                                  "([]: a plain run); {seed} in an option becomes a number that changes from one "
                                  "demo to the next. The demo runs every suite that has some, by name")
    checkpoint: Checkpoint | None = Field(None, description="where checkpoints live (what a recovery resumes from)")
    estimate: str | EstimateBy | None = Field(
        None, description="wall time of one run, for 'testbed plan' and 'run --budget' when no earlier run of the "
        "point is recorded: a duration (5m), or a sum of terms, each a duration times numbers or int/float "
        "parameters ('2m + 40s * epochs'); or one such per value of a parameter ({by, cases, other})")
    progress: str | None = Field(None, description="regex of the log lines worth showing while the run goes on: each "
                                 "rank's last match is shown under the live status line (default: the checkpoint's "
                                 "progress pattern, else each rank's last line)",
                                 json_schema_extra={"example": 'progress: "epoch [0-9]+ step [0-9]+"'})
    tables: dict[str, DeclaredTable] = Field(default_factory=dict, description="results tables read from the "
                                             "collected run without Python, by name: a regex over files, or CSV or "
                                             "JSON files with the columns to keep (testbed.tables); references "
                                             "and checks name them",
                                             json_schema_extra={"example": "tables:\n  steps: {files: \"rank*.out\", "
                                                                "regex: 'step (?P<step>\\d+) loss (?P<loss>\\S+)'}"})
    references: References | None = Field(None, description="the artifact's published numbers, their sources and "
                                           "tolerances: the verdicts a report opens with (testbed.references)")
    source: str | None = Field(None, exclude=True)
    _located: Any = PrivateAttr(None)  # the file's line lookup (yamlfile.Located), when loaded from one

    _env = field_validator("env")(classmethod(lambda cls, v: _env_names(v)))
    _tables = field_validator("tables")(classmethod(lambda cls, v: table_names(v)))

    @field_validator("demo")
    @classmethod
    def _demo(cls, v: list[list[str]]) -> list[list[str]]:
        """A demo run is a run of the demo's own local testbed: the options pick its point and faults, never another
        testbed (--on: a billed one), a campaign (--matrix), a budget or a source."""
        for run in v:
            i = 0
            while i < len(run):
                opt = run[i]
                if opt in DEMO_VALUED and i + 1 < len(run):
                    i += 2
                elif opt in DEMO_FLAGS:
                    i += 1
                else:
                    raise ValueError(f"demo option {opt!r} is not one a demo run takes (only "
                                     f"{', '.join(sorted(DEMO_VALUED))} with a value, and {', '.join(DEMO_FLAGS)}): "
                                     "the demo runs on its own local testbed, one run at a time")
        return v

    @field_validator("progress")
    @classmethod
    def _progress(cls, v: str | None) -> str | None:
        if v is not None and (why := rx.problem(v)) is not None:
            raise ValueError(why)
        return v

    @field_validator("vars")
    @classmethod
    def _vnames(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not re.match(PARAM_RE, k):
                raise Invalid(f"'{k}' is not a name a template can use", loc=(k,),
                              fix="name it like a variable: letters, digits and _ (e.g. per_host)")
            _not_builtin(k, "var")
        return v

    @field_validator("parameters")
    @classmethod
    def _pnames(cls, v: dict[str, Param]) -> dict[str, Param]:
        for k, p in v.items():
            if not re.match(PARAM_RE, k):
                raise Invalid(f"parameter name '{k}' must be letters, digits and _", loc=(k,),
                              fix="name it like a variable (e.g. batch_size)")
            _not_builtin(k, "parameter")
            if p.default is not None:
                try:
                    p.default = typed(p, p.default)
                except ValueError as e:
                    raise Invalid(f"default {p.default!r} {e}", loc=(k, "default"),
                                  fix=f"give {_KIND[p.type]}" + _span(p)) from None
        return v

    @field_validator("matrix")
    @classmethod
    def _size(cls, v: dict[str, list[Any]] | list[dict[str, Any]] | None) -> Any:
        """Counted before anything is expanded: a matrix over the bound is refused at once, not built."""
        if v is not None:
            check_matrix_size(v)
        return v

    @field_validator("outputs")
    @classmethod
    def _outputs_on(cls, v: list[str] | dict[str, list[str]]) -> Any:
        for on in v if isinstance(v, dict) else ():
            if not selector_parts(on):
                raise Invalid(f"{on!r} selects no host", loc=(on,),
                              fix="name all, master, workers, a group, a host or rank:K")
        return v

    @model_validator(mode="after")
    def _refs(self) -> Suite:
        seen_faults: set[str] = set()
        for i, f in enumerate(self.default_faults):
            if f not in self.faults:
                raise ValueError(f"default_faults names unknown fault '{f}' (faults: {', '.join(self.faults)})")
            if f in seen_faults:
                raise Invalid(f"default_faults lists '{f}' twice", loc=("default_faults", i), fix="list it once")
            seen_faults.add(f)
        points = self.matrix if isinstance(self.matrix, list) else [self.matrix or {}]
        for pt in points:
            for k in pt:
                if k not in self.parameters:
                    raise ValueError(f"matrix uses '{k}', which is not a parameter")
        self._check_matrix_values()
        self._check_estimate()
        self._check_after()
        for k in self.vars:
            if k in self.parameters:
                raise Invalid(f"'{k}' is both a parameter and a var (the var would silently replace -p {k})",
                              loc=("vars", k), fix="rename the var, or drop it and use the parameter")
        _distinct([s.name for s in self.sources], ("sources",), "source", "name")
        _distinct([c.name for c in self.checks], ("checks",), "check", "name")
        _distinct([log_key(c.name) for c in self.checks], ("checks",), "check", "name", log=True)
        for phase in ("prepare", "recovery", "post"):
            names = step_names(getattr(self.steps, phase), phase)
            _distinct(names, ("steps", phase), f"{phase} step", "name")
            _distinct([log_key(n) for n in names], ("steps", phase), f"{phase} step", "name", shown=names, log=True)
        for fname, fault in self.faults.items():
            if fault.recovery is not None:
                names = step_names(fault.recovery, "recovery")
                _distinct(names, ("faults", fname, "recovery"), "recovery step", "name")
                _distinct([log_key(n) for n in names], ("faults", fname, "recovery"), "recovery step", "name",
                          shown=names, log=True)
        return self

    def _check_estimate(self) -> None:
        """``estimate`` reads as an estimate and names only int or float parameters."""
        if self.estimate is None:
            return
        raw = self.estimate.model_dump() if isinstance(self.estimate, EstimateBy) else self.estimate
        try:
            est = declared(raw)
        except ValueError as e:
            raise Invalid(str(e.args[0]), loc=("estimate", *(e.args[1] if len(e.args) > 1 else ())),
                          fix=f"write {ESTIMATE_RULE}") from None
        if est.by is not None:
            p = self.parameters.get(est.by)
            if p is None:
                raise Invalid(f"by: {est.by!r} is not a parameter", loc=("estimate", "by"),
                              fix=f"name one of this suite's parameters ({', '.join(self.parameters) or 'none'})")
            for k in est.cases:
                if p.choices is not None and k not in {str(c).lower() if isinstance(c, bool) else str(c)
                                                       for c in p.choices}:
                    raise Invalid(f"case {k!r} is not a value of {est.by} ({', '.join(map(str, p.choices))})",
                                  loc=("estimate", "cases", k), fix="name the parameter's values")
        for name in est.names:
            p = self.parameters.get(name)
            if p is None:
                raise Invalid(f"{name!r} is not a parameter", loc=("estimate",),
                              fix=f"use parameters of this suite ({', '.join(self.parameters) or 'none'})")
            if p.type not in ("int", "float"):
                raise Invalid(f"parameter {name!r} is a {p.type}, not a number", loc=("estimate",),
                              fix="multiply only by int or float parameters (or write one estimate per run)")

    def _check_after(self) -> None:
        """``after:`` names parameters with their types' values, reads points of the matrix, and makes no cycle."""
        if not self.after:
            return
        if not self.matrix:
            raise Invalid("after: orders the points of a matrix, and the suite has none", loc=("after",),
                          fix="add matrix:, or drop after:")
        _distinct([a.name for a in self.after], ("after",), "after entry", "name")
        for i, a in enumerate(self.after):
            for key in ("point", "reads"):
                for k, v in getattr(a, key).items():
                    p = self.parameters.get(k)
                    if p is None:
                        raise Invalid(f"'{k}' is not a parameter", loc=("after", i, key, k),
                                      fix=f"name one of this suite's parameters ({', '.join(self.parameters)})")
                    try:
                        getattr(a, key)[k] = typed(p, v)
                    except ValueError as e:
                        raise Invalid(f"{v!r} {e}", loc=("after", i, key, k),
                                      fix=f"give {k} {_KIND[p.type]}" + _span(p)) from None
        points = [{k: v for k, v in pt.items()} for pt in _raw_points(self)]
        edges = point_reads(self, points, missing="refuse")
        cycle = _cycle(edges)
        if cycle:
            shown = " -> ".join(point_label(self, points[j]) for j in cycle)
            raise Invalid(f"the points read each other in a cycle: {shown}", loc=("after",),
                          fix="a point may only read points that do not read it, directly or through others")

    def _check_matrix_values(self) -> None:
        """Every matrix value has its parameter's type and range, and no point is there twice."""
        if isinstance(self.matrix, dict):
            for k, values in self.matrix.items():
                p = self.parameters[k]
                typed_values = []
                for i, val in enumerate(values):
                    try:
                        typed_values.append(typed(p, val))
                    except ValueError as e:
                        raise Invalid(f"{val!r} {e}", loc=("matrix", k, i),
                                      fix=f"give {k} {_KINDS[p.type]}" + _span(p)) from None
                _distinct([repr(x) for x in typed_values], ("matrix", k), f"matrix axis '{k}' value", None,
                          shown=[str(x) for x in values])
        elif isinstance(self.matrix, list):
            keys = []
            for i, pt in enumerate(self.matrix):
                for k, val in pt.items():
                    try:
                        typed(self.parameters[k], val)
                    except ValueError as e:
                        raise Invalid(f"{val!r} {e}", loc=("matrix", i, k),
                                      fix=f"give {k} {_KIND[self.parameters[k].type]}" + _span(self.parameters[k])) \
                            from None
                full = {k: p.default for k, p in self.parameters.items() if p.default is not None}
                full.update((k, typed(self.parameters[k], val)) for k, val in pt.items())
                keys.append(repr(sorted(full.items())))  # a value written out equal to its default is the same run
            _distinct(keys, ("matrix",), "matrix point", None, shown=[str(pt) for pt in self.matrix])

    def at(self, *loc: str | int) -> str:
        """``file:line`` of ``loc`` (keys and indexes) in the suite's file; the file (or the suite's name)
        when the line is not known."""
        line = self._located.line(loc) if self._located is not None else None
        place = self.source or self.name
        return f"{place}:{line}" if line else place

    @property
    def dir(self) -> Path:
        return Path(self.source).parent if self.source else Path.cwd()


def _not_builtin(name: str, what: str) -> None:
    """Refuse a parameter or var named like a built-in template name (``BUILTINS``)."""
    if name in BUILTINS:
        meaning = BUILTINS[name]
        raise Invalid(f"{what} '{name}' has the name of a built-in template variable ({meaning}): one of the two "
                      "would be lost", loc=(name,), fix=f"rename the {what} (e.g. my_{name}); built-in names: "
                                                        f"{', '.join(sorted(BUILTINS))}")


def step_names(items: list[Step], phase: str) -> list[str]:
    """The names the steps of ``phase`` go by (their own, else ``<phase>-<n>``): their logs are kept by name."""
    return [s.name or f"{phase}-{i + 1}" for i, s in enumerate(items)]


def log_key(name: str) -> str:
    """What is left of a step's name in its log file's name (testbed.run.supervisor.step_log_name, which also cuts
    '<phase>-<step>-<host>' at 200 characters): two steps whose names differ only in what this replaces, or after
    its first 150 characters, would write one log."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:150]


def _distinct(names: list[str], loc: Loc, what: str, key: str | None,
              shown: list[str] | None = None, log: bool = False) -> None:
    """Refuse the second of two items of one name (``Invalid`` at that item's line); ``log``: ``names`` are log
    keys, and two that are one are refused as sharing a log file."""
    seen: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in seen and log:
            first, label = (shown or names)[seen[n]], (shown or names)[i]
            raise Invalid(f"{what}s '{first}' and '{label}' would write one log file ({n}: the name's spaces and "
                          f"signs become _)", loc=(*loc, i, key or "name"),
                          fix=f"give each {what} a name that differs in its letters, digits, '.', '-' or '_'")
        if n in seen:
            label = (shown or names)[i]
            raise Invalid(f"two {what}s are named '{label}' (items {seen[n] + 1} and {i + 1})" if key else
                          f"{what} '{label}' is there twice (items {seen[n] + 1} and {i + 1})",
                          loc=(*loc, i, *((key,) if key else ())),
                          fix=f"give each {what} its own name" if key else "list it once")
        seen[n] = i


# --- points that read other points --------------------------------------------------------------------------
def _raw_points(suite: Suite) -> list[dict[str, Any]]:
    """Every matrix point as typed values over the parameters' defaults (checked as the suite loads)."""
    m = suite.matrix or {}
    defaults = {k: p.default for k, p in suite.parameters.items() if p.default is not None}
    raw = [dict(zip(m, combo, strict=True)) for combo in itertools.product(*m.values())] if isinstance(m, dict) \
        else [dict(x) for x in m]
    return [{**defaults, **{k: typed(suite.parameters[k], v) for k, v in pt.items()}} for pt in raw]


def _same_point(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two points (typed parameter values) are one: compared as text, as -p gives them."""
    return all(str(a.get(k)) == str(b.get(k)) for k in {*a, *b} if not k.startswith("_"))


def point_label(suite: Suite, point: dict[str, Any]) -> str:
    """``phase=eval, model=bert``: the point's values of the matrix's parameters."""
    m = suite.matrix or {}
    keys = list(m) if isinstance(m, dict) else list(dict.fromkeys(k for pt in m for k in pt))
    if not keys:
        keys = [k for k, p in suite.parameters.items() if k in point and point[k] != p.default]
    return ", ".join(f"{k}={point.get(k)}" for k in keys) or "the default point"


def point_reads(suite: Suite, points: list[dict[str, Any]], *, missing: str = "none") -> list[dict[str, int | None]]:
    """For each point, what it reads: ``after`` entry name -> the index of the point read in ``points`` (None:
    not among them). ``missing="refuse"``: a point read that is not among ``points``, or an entry no point
    matches, is refused (``Invalid`` at its line: the suite's whole matrix is checked so as it loads)."""
    out: list[dict[str, int | None]] = [{} for _ in points]
    for e, a in enumerate(suite.after):
        matched = False
        for i, pt in enumerate(points):
            if not all(_same_point({k: pt.get(k)}, {k: v}) for k, v in a.point.items()):
                continue
            matched = True
            want = {**pt, **a.reads}
            j = next((j for j, q in enumerate(points) if _same_point(q, want)), None)
            if j is None and missing == "refuse":
                raise Invalid(f"point {point_label(suite, pt)} reads point {point_label(suite, want)}, which is no "
                              "point of the matrix", loc=("after", e, "reads"),
                              fix="name values of a matrix point, or add that point to the matrix")
            out[i][a.name] = j
        if not matched and missing == "refuse":
            raise Invalid(f"after entry '{a.name}': no matrix point has {a.point}", loc=("after", e, "point"),
                          fix="name values of matrix points (or leave point: out for every point)")
    return out


def reads_of(suite: Suite, params: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What the point ``params`` reads: ``after`` entry name -> the parameters of the point read."""
    return {a.name: {**params, **a.reads} for a in suite.after
            if all(_same_point({k: params.get(k)}, {k: v}) for k, v in a.point.items())}


def _cycle(edges: list[dict[str, int | None]]) -> list[int] | None:
    """The points of a cycle of reads (the first found, its first point again at the end), or None."""
    state: dict[int, int] = {}  # 1: on the path, 2: done

    def visit(i: int, path: list[int]) -> list[int] | None:
        state[i] = 1
        for j in edges[i].values():
            if j is None or state.get(j) == 2:
                continue
            if state.get(j) == 1:
                return [*path[path.index(j):], i, j] if j in path else [i, j]
            found = visit(j, [*path, i])
            if found:
                return found
        state[i] = 2
        return None

    for i in range(len(edges)):
        if i not in state and (found := visit(i, [])):
            return found
    return None


def order_points(suite: Suite, points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``points`` with every point after the points it reads (otherwise in matrix order); a point that reads one
    ``points`` leaves out is refused."""
    edges = point_reads(suite, points)
    for i, reads in enumerate(edges):
        for name, j in reads.items():
            if j is None:
                e = next(k for k, a in enumerate(suite.after) if a.name == name)
                raise UsageError(f"point {point_label(suite, points[i])} reads another point's output "
                                 f"(after: {name}), which is not among the points to run", where=suite.at("after", e),
                                 fix="drop the -p values that leave the point it reads out of the campaign")
    if not suite.after:
        return points
    cycle = _cycle(edges)
    if cycle:
        raise UsageError("the points read each other in a cycle: " + " -> ".join(point_label(suite, points[j])
                         for j in cycle), where=suite.at("after"), fix="break the cycle in after:")
    done: list[int] = []
    while len(done) < len(points):
        i = next(i for i in range(len(points)) if i not in done and all(j in done for j in edges[i].values()))
        done.append(i)
    return [points[i] for i in done]


def matrix_size(matrix: dict[str, list[Any]] | list[dict[str, Any]]) -> int:
    """How many points ``matrix`` holds, counted without building one."""
    return math.prod(len(v) for v in matrix.values()) if isinstance(matrix, dict) else len(matrix)


def check_matrix_size(matrix: dict[str, list[Any]] | list[dict[str, Any]]) -> None:
    """Refuse (``Invalid``) a matrix with an empty axis or more than ``MAX_MATRIX_POINTS`` points."""
    if isinstance(matrix, dict):
        for k, values in matrix.items():
            if not values:
                raise Invalid(f"axis '{k}' has no values: the matrix would hold no run", loc=(k,),
                              fix=f"give {k} at least one value, or remove the axis")
    n = matrix_size(matrix)
    if n > MAX_MATRIX_POINTS:
        axes = " x ".join(f"{k}: {len(v)}" for k, v in matrix.items()) if isinstance(matrix, dict) else \
            f"{n:,} points listed"
        raise Invalid(f"{n:,} runs ({axes}); a matrix holds at most {MAX_MATRIX_POINTS:,}", loc=(),
                      fix=f"drop values or axes, or split the sweep into several suites of at most "
                          f"{MAX_MATRIX_POINTS:,} runs each")


# --- loading --------------------------------------------------------------------------------------------------
def suite_path(name: str) -> Path:
    """The YAML of the suite ``name`` names: a path to a .yml file or to a suite folder (one holding a
    ``suite.yml``), a suite's name (:func:`testbed.paths.find_suite`: this folder's ``experiments/`` first), or
    ``git+URL@COMMIT#PATH`` (fetched into the state home: :mod:`testbed.suite_fetch`)."""
    if suite_fetch.is_git_suite(name):
        return suite_fetch.suite_file(name)
    p = Path(name)
    if p.suffix in (".yml", ".yaml") and p.exists():  # not only a regular file: the loader refuses the others
        return p
    pathlike = "/" in name or name in (".", "..")
    if pathlike and p.is_dir():
        if (p / paths.SUITE_FILE).is_file():
            return p / paths.SUITE_FILE
        raise UsageError(f"the folder {name} holds no {paths.SUITE_FILE}", where=name,
                         fix=f"a suite folder holds its YAML as {paths.SUITE_FILE}; name that folder, or the .yml")
    if not re.match(SUITE_NAME_RE, name):
        raise UsageError(f"'{name}' is not a suite name", where="command line",
                         fix="use lower-case letters, digits and '-', a path to a suite folder or a .yml file, or "
                             f"{suite_fetch.FORM}")
    found = paths.find_suite(name)
    if found is None:
        import difflib

        known = list(paths.list_suite_files())
        close = difflib.get_close_matches(name, known, n=1)
        raise UsageError(f"no suite named '{name}'", where="experiments/",
                         fix=(f"did you mean '{close[0]}'? " if close else "")
                         + f"known suites: {', '.join(known) or 'none'}; or write experiments/{name}/suite.yml")
    return found


def load_suite(name_or_path: str, *, named: bool = True) -> Suite:
    """Load and validate a suite by name or path; errors carry file:line and a hint. ``named``: a folder given by
    its path counts as named in this command (its roles/, profile.yml and report.py: paths.name_suite_folder);
    False for a path a results folder's manifest gave, which names nothing."""
    path = suite_path(name_or_path)
    data, located = yamlfile.load(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path.name}: the top level must be a mapping of keys", where=f"{path}:1",
                         fix="start the file with 'name: ...' and 'steps:'")
    data.setdefault("name", paths.suite_name_of(path))
    suite = yamlfile.validate(Suite, data, path, located)
    suite.source = str(path)
    if named and path.name == paths.SUITE_FILE and \
            path.parent.parent.resolve() not in paths.resource_dirs("experiments"):
        paths.name_suite_folder(path.parent)  # a folder named by its path: its roles/ and profile.yml count too
    suite._located = located
    outs = suite.outputs.items() if isinstance(suite.outputs, dict) else [(None, suite.outputs)]
    for key, globs in outs:
        for i, pattern in enumerate(globs):
            problem = None if is_template(pattern) else output_pattern_problem(pattern)  # templates: per point
            if problem:
                loc: Loc = ("outputs", key, i) if key is not None else ("outputs", i)
                line = located.line(loc)
                raise UsageError(f"{path.name}: output pattern {pattern!r} cannot be collected: {problem}",
                                 where=f"{path}:{line}" if line else str(path),
                                 fix="write a glob relative to the run folder (out/*.csv), to the home folder "
                                     "(~/repo/log/**) or absolute (/tmp/app_*.log), starting with a fixed folder")
    return suite


DEMO_VALUED = frozenset({"-p", "--param", "--fault"})
"""The options of ``testbed run`` a suite's ``demo:`` runs may give, each with its value."""
DEMO_FLAGS = ("--no-faults",)


def is_template(text: str) -> bool:
    """Whether ``text`` holds a Jinja2 expression or statement (rendered per point)."""
    return "{{" in text or "{%" in text


def output_pattern_problem(pattern: str) -> str | None:
    """Why collect could not honour an output glob (None: it can).

    Accepted: relative to the run folder (``out/*.csv``), to the home folder (``~/repo/log/**``) or absolute
    (``/tmp/app_*.log``). Refused: empty, control characters, ``..``, another user's home (``~user``), shell
    expansions (``$VAR``, backquotes, braces) and globs so broad they would copy a whole disk or home folder.
    """
    if not isinstance(pattern, str) or not pattern.strip():
        return "it is empty"
    if any(ord(c) < 32 for c in pattern):
        return "it holds a control character (newline, tab, ...)"
    if any(c in pattern for c in "$`{}\\"):
        return "shell expansions ($VAR, `cmd`, {a,b}, backslashes) are not applied to output globs"
    if pattern.startswith("~") and not pattern.startswith("~/"):
        return "only your own home folder (~/...) can be named, not another user's"
    parts = [p for p in pattern.split("/") if p]
    if ".." in parts:
        return "'..' is not allowed (name the folder directly, absolute or under ~/)"
    if pattern.startswith(("/", "~/")):
        first = parts[1] if pattern.startswith("~/") and len(parts) > 1 else (parts[0] if parts else "")
        if not first or pattern.rstrip("/") in ("/", "~") or (pattern.startswith("/") and _is_glob(first)) \
                or first == "**":
            return "it is too broad (it would copy a whole disk or home folder)"
    return None


def _is_glob(part: str) -> bool:
    return any(c in part for c in "*?[")


def list_suites() -> dict[str, Path]:
    """Name -> YAML of every suite found (folders and single files; this folder's first)."""
    return paths.list_suite_files()


# --- parameters ------------------------------------------------------------------------------------------------
_KIND = {"int": "a whole number", "float": "a finite number", "bool": "true or false", "str": "a string"}
_KINDS = {"int": "whole numbers", "float": "finite numbers", "bool": "true or false values", "str": "strings"}


def _span(p: Param) -> str:
    """`` (1 to 4)``: the range a number parameter allows, or its choices; empty when neither is set."""
    if p.choices is not None and p.min is None and p.max is None:
        return f" (one of {', '.join(map(str, p.choices))})"
    if p.min is not None and p.max is not None:
        return f" ({p.min:g} to {p.max:g})"
    if p.min is not None or p.max is not None:
        return f" (at least {p.min:g})" if p.min is not None else f" (at most {p.max:g})"
    return ""


def _convert(p: Param, value: Any) -> Any:
    """``value`` as ``p``'s type; ValueError when it is not one (a float that is not finite is none)."""
    try:
        if p.type == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if p.type == "float":
            v = float(value)
            if not math.isfinite(v):
                raise ValueError
            return v
        if p.type == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return value if isinstance(value, str) else str(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf)
        raise ValueError(f"is not {_KIND[p.type]}") from None


def _allowed(p: Param, v: Any) -> str | None:
    """Why the typed value ``v`` is refused by ``p``'s range or choices (None: it is not)."""
    if p.type in ("int", "float") and ((p.min is not None and v < p.min) or (p.max is not None and v > p.max)):
        return "is out of range"
    if p.choices is not None and v not in p.choices:
        return "is not allowed"
    return None


def typed(p: Param, value: Any) -> Any:
    """``value`` as ``p``'s type, in its range and choices; ValueError says what is wrong (``is not ...``)."""
    v = _convert(p, value)
    why = _allowed(p, v)
    if why:
        raise ValueError(why)
    return v


def coerce(name: str, p: Param, value: Any) -> Any:
    """``value`` (a string from -p, or YAML) as the parameter's type, checked against its choices."""
    try:
        v = _convert(p, value)
    except ValueError:
        raise UsageError(f"parameter '{name}' must be {p.type}, got {value!r}", where=f"-p {name}=...",
                         fix=f"give a {p.type} value" + (" (a finite number)" if p.type == "float" else "")) from None
    why = _allowed(p, v)
    if why == "is out of range":
        raise UsageError(f"parameter '{name}' = {v!r} is out of range", where=f"-p {name}=...",
                         fix=f"give a value {_span(p)[2:-1]}")
    if why:
        raise UsageError(f"parameter '{name}' = {v!r} is not allowed", where=f"-p {name}=...",
                         fix=f"allowed values: {', '.join(map(str, p.choices or []))}")
    return v


def parse_assignments(items: list[str]) -> dict[str, str]:
    """``["a=1", "b=x y"]`` -> dict; a malformed item, or a name given twice, is a UsageError."""
    out: dict[str, str] = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not re.match(PARAM_RE, k.strip()):
            raise UsageError(f"'-p {it}' is not key=value", where="command line", fix="write -p name=value")
        if k.strip() in out:
            raise UsageError(f"parameter '{k.strip()}' is given twice ({out[k.strip()]!r} and {v!r})",
                             where=f"-p {k.strip()}=...", fix="give each parameter once (--matrix runs several values)")
        out[k.strip()] = v
    return out


def resolve_params(suite: Suite, given: dict[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with ``given`` (coerced); unknown and missing required names are refused."""
    import difflib

    for k in given:
        if k not in suite.parameters:
            close = difflib.get_close_matches(k, list(suite.parameters), n=1)
            raise UsageError(f"suite '{suite.name}' has no parameter '{k}'", where=f"-p {k}=...",
                             fix=(f"did you mean '{close[0]}'? " if close else "")
                             + f"parameters: {', '.join(suite.parameters) or 'none'}")
    out: dict[str, Any] = {}
    for k, p in suite.parameters.items():
        if given.get(k) is not None:
            out[k] = coerce(k, p, given[k])
        elif p.default is not None:
            out[k] = p.default
        elif p.required:
            raise UsageError(f"suite '{suite.name}' needs parameter '{k}'", where="command line",
                             fix=f"add -p {k}=<{p.type}>" + (f" ({p.help})" if p.help else ""))
        else:
            out[k] = "" if p.type == "str" else None
    return out


def expand_matrix(suite: Suite, given: dict[str, Any]) -> list[dict[str, Any]]:
    """Every matrix point as full parameters; points contradicting an explicit ``-p`` are dropped."""
    if not suite.matrix:
        raise UsageError(f"suite '{suite.name}' has no matrix", where=suite.source or suite.name,
                         fix="add 'matrix:' to the suite, or run without --matrix")
    try:  # counted again here: a suite built in code may have skipped the file's checks
        check_matrix_size(suite.matrix)
    except Invalid as e:
        raise UsageError(f"{suite.name}: matrix: {e}", where=suite.at("matrix", *e.loc), fix=e.fix) from None
    if isinstance(suite.matrix, dict):
        keys = list(suite.matrix)
        raw = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*suite.matrix.values())]
    else:
        raw = [dict(p) for p in suite.matrix]
    points: list[dict[str, Any]] = []
    fixed = {k: coerce(k, suite.parameters[k], v) for k, v in given.items() if k in suite.parameters}
    for pt in raw:
        typed = {k: coerce(k, suite.parameters[k], v) for k, v in pt.items()}
        if any(k in typed and typed[k] != v for k, v in fixed.items()):
            continue
        points.append(resolve_params(suite, {**given, **typed}))
    if not points:
        raise UsageError("no matrix point matches the -p values given", where="command line",
                         fix="drop or change the -p values that fix matrix parameters")
    return order_points(suite, points)


# --- templates -------------------------------------------------------------------------------------------------
class Raw(str):
    """A string rendered into a command as-is (built by the suite, not given by a user)."""

    __slots__ = ()


def shell_quote(value: Any) -> str:
    """One shell word for ``value``; a leading ``~/`` stays unquoted so the shell expands it."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, bool):
        value = "true" if value else "false"
    if value is None:
        return "''"
    if isinstance(value, list | tuple):
        return " ".join(shell_quote(v) for v in value)
    s = str(value)
    if s.startswith("~/") and len(s) > 2:
        return "~/" + shlex.quote(s[2:])
    return shlex.quote(s)


def path_word(path: str) -> str:
    """A host path as one shell word, ``~`` and ``~/`` expanded by the host's shell (``"$HOME"/rest``)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:]) if len(path) > 2 else '"$HOME"'
    return shlex.quote(path)


_ENVS: dict[bool, ImmutableSandboxedEnvironment] = {}


def _bounded_tree(tree: Any) -> Any:
    """Every ``{% for %}`` loops through :func:`testbed.templating.counted`, every piece of template text is
    written through ``environment.tb_text`` (so it is weighed, even in a loop that repeats it), and every ``~``
    concatenation is weighed through ``environment.tb_made`` (a loop doubling a string stops at the value bound)."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    class Weighed(NodeTransformer):
        def visit_Concat(self, node: Any) -> Any:
            self.generic_visit(node)
            return nodes.Call(nodes.EnvironmentAttribute("tb_made"), [node], [], None, None, lineno=node.lineno)

    tree = Weighed().visit(tree)

    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Call(nodes.EnvironmentAttribute("tb_counted"), [loop.iter], [], None, None,
                               lineno=loop.iter.lineno)
    for out in tree.find_all(nodes.Output):
        out.nodes = [nodes.Call(nodes.EnvironmentAttribute("tb_text"), [n], [], None, None, lineno=n.lineno)
                     if isinstance(n, nodes.TemplateData) else n for n in out.nodes]
    return tree


def _env(shell: bool) -> ImmutableSandboxedEnvironment:
    if shell not in _ENVS:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from jinja2.utils import _PassArg

        class Bounded(ImmutableSandboxedEnvironment):
            """Sandboxed, and bounded (testbed.templating): every loop iteration, call, filter and operator is a
            step of the render's budget, values too large to make are refused, all output is weighed."""

            intercepted_binops = frozenset(["**", "*", "%", "+", "-", "/", "//"])
            tb_counted = staticmethod(templating.counted)
            tb_text = staticmethod(Raw)
            tb_made = staticmethod(templating.made)

            def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
                return _bounded_tree(super()._parse(source, name, filename))

            def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
                b = templating.current()
                if b is None:
                    return super().call_binop(context, operator, left, right)
                b.step()
                templating.check_binop(operator, left, right)
                return b.make(super().call_binop(context, operator, left, right))

            def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
                b = templating.current()
                if b is None:
                    return super().call(__context, __obj, *args, **kwargs)
                b.step()
                templating.check_method(__obj, args, kwargs)
                return b.make(super().call(__context, __obj, *args, **kwargs))

        @jinja2.pass_context  # a finalize that needs the context runs at render time: no output is folded
        def finalize(_ctx: Any, value: Any) -> Any:
            out = shell_quote(value) if shell else value
            b = templating.current()
            if b is not None:
                b.make(out if isinstance(out, str) else str(out))
            return out

        # a suite is data: its templates may not reach Python on the controller (e.g. through
        # ''.__class__.__mro__ ...), even in --dry-run
        env = Bounded(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False,
                      finalize=finalize)
        env.filters["raw"] = lambda v: Raw(shell_quote(v) if isinstance(v, list | tuple) else str(v))
        env.filters["quote"] = lambda v: Raw(shell_quote(v))
        for table in (env.filters, env.tests):
            for fname, f in list(table.items()):
                table[fname] = templating.bounded_filter(fname, f, _PassArg.from_obj(f) is not None)
        _ENVS[shell] = env
    return _ENVS[shell]


def render(template: str, context: dict[str, Any], *, shell: bool = True, where: str = "template",
           at: str | None = None) -> str:
    """Render with StrictUndefined; ``shell=True`` quotes every ``{{ }}`` value. Any failure while the template is
    evaluated (a missing name, a division by zero, a wrong type) is one UsageError naming ``where`` (what) and
    ``at`` (``file:line``; default: ``where``)."""
    import jinja2

    known = f"known names: {', '.join(sorted(k for k in context if not k.startswith('_')))}"
    place = at or where
    try:
        return templating.bounded(lambda: _env(shell).from_string(template).render(**context)).strip()
    except templating.TooMuch as e:
        raise UsageError(f"{where}: the template is refused: {e}", where=place,
                         fix="a template builds a command, not data: loop and repeat less, or build large inputs "
                             "in a prepare step on the hosts") from None
    except jinja2.exceptions.SecurityError as e:
        raise UsageError(f"{where}: the template reaches for what a suite may not use ({e})", where=place,
                         fix="use the suite's parameters, vars and filters only (templates run sandboxed)") from None
    except jinja2.UndefinedError as e:
        raise UsageError(f"{where}: {e.message}", where=place, fix=known) from None
    except jinja2.TemplateError as e:
        raise UsageError(f"{where}: template error: {e}", where=place, fix="fix the Jinja2 syntax") from None
    except UsageError:
        raise
    except Exception as e:  # the expression itself failed: 1 / 0, 'a' + 1, int('x'), 9 ** (9 ** 9)
        what = str(e) or type(e).__name__
        raise UsageError(f"{where}: the template failed while it was evaluated: {what} ({type(e).__name__})",
                         where=place, fix="fix the expression at that line, or the values it uses (-p values, "
                                          "parameter defaults, vars)") from None
