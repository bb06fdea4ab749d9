"""Typed plans and run records: what a run will do (``RunPlan``) and what state holds about it (``RunRecord``, ...).

A plan file (``plan.json`` in the run's home) is ``RunPlan.to_json()``: the same shape earlier versions wrote as a
plain dict, so their plan files load unchanged. The records mirror rows of the state store's ``runs``,
``run_hosts``, ``events`` and ``campaigns`` tables; their JSON columns (``info``, ``detail``, ``points``) become
fields. Pure data: no I/O here (the state store reads and writes the rows, ``testbed.run.bookkeeping`` the plan files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_serializer,
    model_serializer,
)

from testbed.errors import TestbedError
from testbed.exitcodes import Exit
from testbed.fault_kinds import FaultAction

ACTIVE = ("pending", "running")
"""Statuses of a run (and of a rank) that has not ended."""
OUTCOMES = {"succeeded": Exit.OK, "failed": Exit.FAILED, "stopped": Exit.STOPPED, "timed-out": Exit.TIMED_OUT}
"""Every way a run ends: its status and the exit code of ``testbed run`` (and ``wait``) for it."""
ENDED = tuple(OUTCOMES)

# --- a collected run on disk (its folder: testbed.paths.run_folder): the contract between collect, report, reproduce
class ManifestHost(TypedDict, total=False):
    """One host of a collected run: its facts (nvidia-smi, kernel, ...), and its ranks' statuses."""

    name: str
    address: str
    facts: dict[str, Any]
    exit_code: int | None
    status: str | None
    ranks: list[dict[str, Any]]  # {rank, status, exit_code, reason}


class Manifest(TypedDict, total=False):
    """``manifest.json`` as collect writes it (schema 1); readers get it from a file they do not trust, so every key
    may be missing (``total=False``) and every value is checked where it is used."""

    schema: int
    run_id: str
    suite: str
    params: dict[str, Any]
    campaign: str | None
    status: str
    reason: str | None
    testbed: dict[str, Any]  # {name, provider, hardware?}
    hosts: list[ManifestHost]
    software: dict[str, Any]  # {python: {version, executable}, pip_freeze: [...], sources: {name: {repo, ref, commit}}}
    testbed_version: str
    started: str | None  # ISO 8601 UTC
    ended: str | None
    events: list[dict[str, Any]]  # {ts, kind, host, detail}
    files: list[dict[str, Any]]  # {host, path, from, sha256, size}
    suite_file: dict[str, Any] | None  # {path, sha256, files?, git?: {url, commit, path}}: what reproduce runs again
    profile: str | None
    faults: list[str]
    reproduces: str
    rehearsal: dict[str, Any]  # a rehearsal on a local replica: never a result
    suite_copy: dict[str, Any] | None  # {name, path, sha256, files?, profile?}: the suite as it ran, copied beside

class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)


def _drop_empty(out: dict[str, Any], key: str) -> dict[str, Any]:
    if not out.get(key):
        out.pop(key, None)
    return out


@dataclass
class Override:
    """A resolved source override (``--source NAME=PATH|URL[@REF]``, or a testbed spec's ``sources:``): what
    :mod:`testbed.sources` checked on the controller, and what a plan carries to its checkouts and set-up."""

    name: str
    given: str  # as the user wrote it (for messages and the manifest)
    kind: str  # "path" (bundled here) or "url" (cloned by the hosts)
    location: str  # absolute path or URL
    ref: str | None = None
    commit: str | None = None  # path kind: the commit in the bundle
    bundle: str | None = None  # path kind: the bundle on the controller
    dirty: bool = False  # path kind: uncommitted changes were included

    def to_dict(self) -> dict[str, Any]:
        """Its set fields (a plan file's shape)."""
        return {k: v for k, v in self.__dict__.items() if v not in (None, False)}


# --- plans ------------------------------------------------------------------------------------------------------
class PlanHost(_Model):
    """A host of the run, at the address the other hosts reach it by."""

    name: str
    address: str


class Rank(_Model):
    """One process of the launch step (or of a relaunch): where it runs and what."""

    rank: int
    host: str
    address: str
    attempt: int = 0
    command: str
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    environment: str | None = None  # venv or conda prefix entered first
    needs: list[str] = Field(default_factory=list)  # beyond a CPU host (gpu, tpu, cuda, ...): a rehearsal probes it

    @model_serializer(mode="wrap")
    def _absent_needs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _drop_empty(handler(self), "needs")  # plan files keep the shape earlier versions wrote


class RunStep(_Model):
    """A synchronous step: one rendered command per host, run in the run folder; the next waits for it."""

    name: str
    kind: Literal["run"] = "run"
    hosts: list[str]
    timeout: float | None = None
    cwd: str | None = None
    commands: dict[str, str]
    environments: dict[str, str | None] | None = None  # per host; absent (None) for source checkouts
    needs: list[str] = Field(default_factory=list)  # beyond a CPU host: a rehearsal skips it where they are lacking

    @model_serializer(mode="wrap")
    def _absent_environments(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if self.environments is None:  # a source step never had the key
            out.pop("environments", None)
        return _drop_empty(out, "needs")


class RelaunchStep(_Model):
    """A recovery step that starts the ranks again (attempt + 1)."""

    name: str
    kind: Literal["relaunch"] = "relaunch"
    ranks: list[Rank]


class RepairStep(_Model):
    """A recovery step that repairs every host of the run that does not answer (at most ``attempts`` in a run),
    sets it up again (``setup``) and uploads the run folder to it; within ``timeout`` seconds each."""

    name: str
    kind: Literal["repair"] = "repair"
    setup: bool = True
    attempts: int = 2
    timeout: float | None = None


PlanStep = Annotated[RunStep | RelaunchStep | RepairStep, Field(discriminator="kind")]
Recovery = dict[str, list[PlanStep]]
"""Recovery steps per attempt ("1", "2", ...): the n-th recovery of a run runs ``recovery[str(n)]``."""


class FaultPlan(_Model):
    """One chosen fault, rendered: its target, its trigger (``at`` seconds or ``when`` a log line) and recovery."""

    name: str
    description: str = ""
    action: FaultAction
    signal: str = "SIGKILL"
    rank: int | None = None
    host: str
    at: float | None = None
    watch_rank: int = 0
    when: str | None = None
    watch_host: str
    command: str | None = None
    restore: str | None = None
    recovery: Recovery = Field(default_factory=dict)
    order: int = 0
    needs: list[str] = Field(default_factory=list)  # the suite's: what firing it needs on its host

    @model_serializer(mode="wrap")
    def _absent_needs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _drop_empty(handler(self), "needs")  # plan files keep the shape earlier versions wrote

    def recovery_steps(self, attempt: int) -> list[RunStep | RelaunchStep | RepairStep]:
        """The steps of recovery number ``attempt`` (the last one given when there are fewer)."""
        return recovery_steps(self.recovery, attempt)


def recovery_steps(recovery: Recovery, attempt: int) -> list[RunStep | RelaunchStep | RepairStep]:
    """The steps of recovery number ``attempt`` (the last one given when there are fewer)."""
    return recovery.get(str(attempt)) or recovery.get(str(len(recovery))) or []


class CheckpointPlan(_Model):
    """The suite's ``checkpoint``, its hosts resolved."""

    file: str
    hosts: list[str]
    rank: int = 0
    saved: str | None = None
    progress: str | None = None


class Check(_Model):
    """After the post steps: ``file`` must exist on ``hosts`` (and hold a line matching ``contains``)."""

    name: str
    file: str
    contains: str | None = None
    hosts: list[str]


class PlanTimeouts(_Model):
    """The suite's timeouts, in seconds (``testbed.suite.Timeouts`` as the run uses them)."""

    prepare: float
    run: float
    post: float
    grace: float
    unreachable: float  # the bound over which a host must be found lost (testbed.run.liveness)
    poll: float
    probes: int = 3  # the lost probes in a row that judge a host lost

    @model_serializer(mode="wrap")
    def _default_probes(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("probes") == 3:  # plan files keep the shape earlier versions wrote
            out.pop("probes")
        return out


class RunPlan(_Model):
    """Every command of one run, rendered per host and rank, in order: what the supervisor executes."""

    run_id: str
    suite: str
    testbed: str
    provider: str
    params: dict[str, Any]  # the suite's parameters: any JSON value
    profile: str | None = None
    setup_roles: list[str] | None = None  # the profile's roles this point needs (suite's setup_roles); None: all
    placeholder_hosts: bool = False
    run_dir: str
    hosts: list[PlanHost]
    master: str
    files: dict[str, str] = Field(default_factory=dict)  # name in the run folder -> path on the controller
    generated: dict[str, str] = Field(default_factory=dict)  # name -> content (the hostfile)
    env: list[str] = Field(default_factory=list)  # export lines
    sources: list[RunStep] = Field(default_factory=list)
    source_info: dict[str, dict[str, Any]] = Field(default_factory=dict)  # name -> repo, ref, path[, override...]
    prepare: list[RunStep] = Field(default_factory=list)
    ranks: list[Rank]
    source_overrides: dict[str, Override] = Field(default_factory=dict)  # resolved --source (and spec mirrors)
    faults: list[FaultPlan] = Field(default_factory=list)
    recovery: Recovery = Field(default_factory=dict)  # after a host is lost with no fault fired (a real failure)
    checkpoint: CheckpointPlan | None = None
    post: list[RunStep] = Field(default_factory=list)
    checks: list[Check] = Field(default_factory=list)
    outputs: dict[str, list[str]] = Field(default_factory=dict)  # host -> globs
    timeouts: PlanTimeouts
    rehearsal: dict[str, Any] | None = None  # testbed rehearse: the real testbed, steps skipped, ranks probed
    progress: str | None = None  # regex of the log lines shown while the run goes on (suite's, or the checkpoint's)
    refused: list[dict[str, str | None]] = Field(default_factory=list)  # a dry run: why the real run would be
    # refused on this testbed (what, where, fix of each refusal)
    suite_file: str | None = None  # the suite's YAML and its sha256: what `testbed reproduce` runs again
    suite_sha256: str | None = None
    suite_files: dict[str, str] = Field(default_factory=dict)  # its files: (relative to it) -> sha256
    report_sha256: str | None = None  # the report.py beside it: the one testbed report runs for a run of it
    suite_git: dict[str, str] | None = None  # a suite fetched from git: {url, commit, path} (testbed.suite_fetch)
    hardware: dict[str, Any] = Field(default_factory=dict)  # the testbed spec's hardware.gpu: gpu_model, gpus
    shared_home: bool = False  # the testbed's hosts share one home (hardware.shared_home): one run folder for all

    @field_serializer("source_overrides")
    def _compact_overrides(self, value: dict[str, Override]) -> dict[str, dict[str, Any]]:
        return {k: o.to_dict() for k, o in value.items()}  # unset fields left out, as earlier versions wrote

    @model_serializer(mode="wrap")
    def _absent_when_unused(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        # plan files without them keep the earlier shape
        for key in ("recovery", "checkpoint", "rehearsal", "progress", "refused", "suite_file", "suite_sha256",
                    "suite_files", "report_sha256", "suite_git", "hardware", "shared_home"):
            if not out.get(key):
                out.pop(key, None)
        return out

    @property
    def host_names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def rank(self, k: int) -> Rank:
        return next(r for r in self.ranks if r.rank == k)

    def to_json(self) -> dict[str, Any]:
        """The plan file's content (``json.dumps`` of this); ``setup_roles`` only where a point names its roles."""
        out = self.model_dump(mode="json")
        if out.get("setup_roles") is None:
            out.pop("setup_roles", None)
        return out

    @classmethod
    def load(cls, path: Path) -> RunPlan:
        """Read a plan file; one TestbedError naming it when it is no plan (hand-edited, truncated)."""
        try:
            return cls.model_validate_json(path.read_bytes())
        except ValidationError as e:
            raise TestbedError(f"the plan file is unreadable: {_first_error(e)}", where=str(path),
                               fix="it was changed by hand or cut short; start the run again") from None


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return f"{loc}: {err['msg']}" if loc else str(err["msg"])


# --- records in the state store ---------------------------------------------------------------------------------
class SupervisorInfo(_Model):
    pid: int | None = None
    started: float = 0.0


class RunInfo(_Model):
    """The ``info`` column of a run: what later commands need without the plan, and the supervisor's progress.

    Stored as the keys that were set (``to_json``); an update merges its keys into the stored ones.
    """

    model_config = ConfigDict(extra="allow")  # keys a later version adds are kept, not dropped

    outputs: dict[str, list[str]] = Field(default_factory=dict)
    run_dir: str | None = None
    hosts: list[str] = Field(default_factory=list)
    faults: list[str] = Field(default_factory=list)
    world_size: int = 0
    plan: str | None = None  # path of the plan file
    attempt: int = 0
    fired: list[str] = Field(default_factory=list)
    recovered: list[str] = Field(default_factory=list)
    repaired: list[str] = Field(default_factory=list)  # hosts the run repaired (each counts against the limit)
    sources: dict[str, dict[str, Any]] = Field(default_factory=dict)
    python: str | None = None  # the run's interpreter (the manifest's pip freeze)
    supervisor: SupervisorInfo | None = None
    launched_at: float | None = None
    ranks: list[Rank] | None = None  # the ranks of the current attempt
    rehearsal: dict[str, Any] | None = None  # a rehearsal on a replica (testbed rehearse): never a result
    suite_file: str | None = None  # the suite's YAML (path) and its sha256 when the run was planned
    suite_sha256: str | None = None
    suite_files: dict[str, str] | None = None  # the suite's files: (relative to it) -> sha256; None: not recorded
    report_sha256: str | None = None  # the report.py beside the suite file when the run was planned
    suite_git: dict[str, str] | None = None  # a suite fetched from git: {url, commit, path}
    hardware: dict[str, Any] | None = None  # the testbed spec's hardware.gpu when the run was planned
    shared_home: bool | None = None  # its hosts share one home: a run folder there is one folder on every host
    profile: str | None = None  # the suite's set-up profile
    reproduces: str | None = None  # the run this one replays (testbed reproduce)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


class RunRecord(_Model):
    """A row of ``runs``."""

    id: str
    suite: str
    testbed: str
    params: dict[str, Any] = Field(default_factory=dict)
    status: str
    campaign: str | None = None
    created: float
    started: float | None = None
    ended: float | None = None
    reason: str | None = None
    info: RunInfo = Field(default_factory=RunInfo)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    def to_json(self) -> dict[str, Any]:
        """Every column, ``info`` as stored."""
        return {**self.model_dump(mode="json", exclude={"info"}), "info": self.info.to_json()}


class RankRecord(_Model):
    """A row of ``run_hosts``: one rank's status."""

    run_id: str
    host: str
    rank: int
    status: str
    exit_code: int | None = None
    reason: str | None = None
    started: float | None = None
    ended: float | None = None


class RunEvent(_Model):
    """A row of ``events``: something that happened to a run (``detail`` is free-form per kind)."""

    seq: int
    run_id: str
    ts: float
    kind: str
    host: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class CampaignPoint(_Model):
    """One point of a campaign's matrix: its parameters, and its run once started."""

    params: dict[str, Any]
    run_id: str | None = None
    status: str = "todo"


class CampaignInfo(_Model):
    faults: list[str] | None = None
    sources: dict[str, str] = Field(default_factory=dict)
    budget: dict[str, Any] | None = None  # --budget of the last session: amount, unit, given (testbed.estimate)
    stopped: dict[str, Any] | None = None  # why launching stopped short (the budget): spent, limit, points left
    suite_file: str | None = None  # the suite's file, where its name does not find it (a folder named by its path)


class CampaignRecord(_Model):
    """A row of ``campaigns``."""

    id: str
    suite: str
    testbed: str
    points: list[CampaignPoint]
    status: str
    created: float
    info: CampaignInfo = Field(default_factory=CampaignInfo)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
