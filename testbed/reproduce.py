"""``testbed reproduce results/<suite>/<run-id>``: run a recorded run again and compare the two, metric by metric.

The manifest says what ran: the suite (its file's sha256 and those of its ``files:``), the parameters, the
faults, the sources at their commits, the profile, the testbed and its hosts' hardware (cores, GPU models and
counts from nvidia-smi, else the testbed spec's ``hardware.gpu``). :func:`prepare` compares that with what would run now
and lists every difference before any host is touched; a difference not named by ``--allow`` refuses the
replay. :func:`compare` then sets the replay's report beside the original's with the suite's tolerances.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import collect
from testbed.collect import suite_copy
from testbed.collect.manifest import load
from testbed.collect.suite_copy import sha256
from testbed.errors import TestbedError, UsageError
from testbed.paths import MANIFEST
from testbed.records import Manifest
from testbed.references import References
from testbed.report.build import build_report
from testbed.report.rundir import RunDir
from testbed.report.verdicts import Verdict, evaluate
from testbed.run.plan import testbed_info
from testbed.run.runner import file_sha256
from testbed.setup.profiles import available_profiles
from testbed.spec import DEFAULT_TESTBED
from testbed.suite import SUITE_NAME_RE, load_suite
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.references import Reference
    from testbed.run.plan import HostInfo
    from testbed.state import Store
    from testbed.suite import Suite

KINDS = ("suite", "commit", "profile", "testbed", "hardware")
"""What ``--allow`` may name: a changed suite file, a source without its recorded commit, another profile,
another testbed, other hardware (host count, cores, GPUs)."""


@dataclass
class Difference:
    """One thing that cannot be matched: its kind (what ``--allow`` names) and what differs."""

    kind: str
    what: str


@dataclass
class Replay:
    """What a replay runs: the suite, the recorded parameters and faults, source pins, and what differs."""

    run_dir: Path
    manifest: Manifest
    suite: Suite
    testbed: str
    params: dict[str, Any]
    faults: list[str]
    sources: list[str] = field(default_factory=list)  # --source NAME=REPO@COMMIT pins
    differences: list[Difference] = field(default_factory=list)
    origin: str = ""  # which suite file is replayed, in words (the copy in the run folder, or --suite PATH)

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.run_dir.name)


def prepare(run_dir: Path, on: str | None = None, allow: list[str] | None = None, *,
            store: Store | None = None, suite_path: Path | None = None) -> Replay:
    """Read the run's manifest and list what cannot be matched now; refuse (UsageError, exit 2) unless
    ``allow`` names every kind of difference. The suite replayed is the copy inside the run folder, or
    ``suite_path`` when the user names one; never a path the manifest names outside the folder. Touches no host."""
    allow = list(allow or [])
    for a in allow:
        if a not in KINDS:
            raise UsageError(f"--allow {a}: not a kind of difference", where="--allow",
                             fix=f"name one of: {', '.join(KINDS)}")
    run_dir = Path(run_dir)
    m = load(run_dir)
    if not m.get("suite") or not m.get("run_id"):
        raise UsageError(f"no run manifest in {run_dir}", where=str(run_dir / MANIFEST),
                         fix="pass results/<suite>/<run-id> of a collected run (testbed collect RUN)")
    if m.get("rehearsal"):
        raise UsageError(f"run {m['run_id']} is a rehearsal on a local replica: there are no results to reproduce",
                         where=str(run_dir), fix="reproduce a real run")
    suite, origin, diffs = _replayed_suite(run_dir, m, suite_path)
    references(suite)  # a suite without references has nothing to compare: refused before the replay
    rec: dict[str, Any] | None = m["suite_file"] if isinstance(m.get("suite_file"), dict) else None
    now = file_sha256(Path(suite.source)) if suite.source else None
    older = f"run {m['run_id']} was recorded by testbed {m.get('testbed_version') or '(version not recorded)'}"
    if rec is None or not rec.get("sha256"):
        diffs.append(Difference("suite", f"{older}, before testbed recorded suite hashes: the suite "
                                f"{suite.source} cannot be shown to be the file that ran"))
    else:
        if rec["sha256"] != now:
            diffs.append(Difference("suite", f"suite file {suite.source} changed since the run (sha256 "
                                    f"{rec['sha256'][:12]} recorded, {str(now)[:12]} now)"))
        diffs += _suite_files(rec, suite, older)
    profile = m.get("profile")
    if "profile" in m and profile != suite.profile:
        diffs.append(Difference("profile", f"profile {profile!r} recorded, the suite now names {suite.profile!r}"))
    pins, diffs_src = _sources(m, suite)
    diffs += diffs_src
    params: dict[str, Any] = m["params"] if isinstance(m.get("params"), dict) else {}
    faults = [str(f) for f in m.get("faults") or [] if isinstance(f, str)] if "faults" in m else None
    if faults is None:
        faults = list(suite.default_faults)
        diffs.append(Difference("suite", "the manifest records no faults (an older testbed): the suite's default "
                                f"faults ({', '.join(faults) or 'none'}) are used"))
    tb_rec: dict[str, Any] = m["testbed"] if isinstance(m.get("testbed"), dict) else {}
    testbed = on or str(tb_rec.get("name") or suite.testbed or DEFAULT_TESTBED)
    rep = Replay(run_dir, m, suite, testbed, dict(params), faults, pins, diffs, origin)
    _refuse(rep, allow)  # what the files say first: a changed suite is named even where the testbed is gone
    diffs += _hardware(m, tb_rec, testbed, store)
    _refuse(rep, allow)
    return rep


def _replayed_suite(run_dir: Path, m: Manifest, named: Path | None) -> tuple[Suite, str, list[Difference]]:
    """The suite to replay, where it comes from (one line), and the differences known from the copy alone."""
    where = str(run_dir / MANIFEST)
    name = m["suite"]
    if not isinstance(name, str) or not re.match(SUITE_NAME_RE, name):
        raise UsageError(f"the manifest's suite ({name!r}) is not a suite name", where=f"{where}: suite",
                         fix="a run folder names its suite by name (lower-case letters, digits, '-'); collect the "
                             "run again")
    if named is not None:
        suite = load_suite(str(named))
        return suite, f"the suite you named, {suite.source}", []
    rec = m.get("suite_copy")
    if rec is None:
        raise UsageError(f"run {m['run_id']} holds no copy of its suite (collected by testbed "
                         f"{m.get('testbed_version') or 'of an older version'}, or its suite changed before "
                         "collect): reproduce never runs a suite file the manifest names outside the run folder",
                         where=f"{where}: suite_copy",
                         fix=f"name the suite to replay: testbed reproduce {run_dir} --suite {name} "
                             "(its name here, or the path of its folder or .yml file; it is checked against the "
                             "hashes the run recorded)")
    path, files = suite_copy.verified(run_dir, rec)
    suite = load_suite(str(path))
    if suite.name != name:
        raise UsageError(f"the suite copied into the run folder is named {suite.name!r}, the manifest says "
                         f"{name!r}", where=f"{where}: suite_copy.path",
                         fix="collect the run again, or name the suite with --suite PATH")
    for rel in suite.files:  # every file the copy ships is one the manifest hashed
        rel_path = f"{os.path.dirname(str(rec['path']))}/{os.path.normpath(rel)}"  # beside the copied YAML
        if rel_path not in files:
            raise UsageError(f"the copied suite ships {rel}, which suite_copy.files does not list",
                             where=f"{where}: suite_copy.files", fix="collect the run again, or use --suite PATH")
    return suite, f"the copy in the run folder, {path}", _profile_diff(rec)


def _profile_diff(rec: dict[str, Any]) -> list[Difference]:
    """The run's profile (copied at collect) against the profile file of that name now."""
    prof = rec.get("profile")
    if not isinstance(prof, dict):
        return []
    now = available_profiles().get(str(prof.get("name")))
    if now is None:
        return [Difference("profile", f"profile {prof.get('name')!r} of the run is gone from playbooks/profiles/")]
    if sha256(now) != prof.get("sha256"):
        return [Difference("profile", f"profile file {now} changed since the run was collected (the run's copy: "
                           f"{prof.get('path')})")]
    return []


def _refuse(rep: Replay, allow: list[str]) -> None:
    """One UsageError naming every difference ``allow`` does not name, and the --allow that would accept them."""
    refused = [d for d in rep.differences if d.kind not in allow]
    if refused:
        kinds = sorted({d.kind for d in refused}, key=KINDS.index)
        raise UsageError(f"run {rep.run_id} cannot be replayed as recorded: "
                         + "; ".join(f"{d.kind}: {d.what}" for d in refused),
                         where=str(rep.run_dir / MANIFEST),
                         fix="undo the change, or replay anyway naming each difference: "
                             + " ".join(f"--allow {k}" for k in kinds))


def _suite_files(rec: dict[str, Any], suite: Suite, older: str) -> list[Difference]:
    """The suite's ``files:`` (its workloads) against the hashes the run recorded: changed, gone, added, dropped."""
    files = rec.get("files")
    if not isinstance(files, dict):
        return [Difference("suite", f"{older}, before testbed recorded the hashes of a suite's files: "
                           f"{', '.join(suite.files)} cannot be shown unchanged")] if suite.files else []
    out = []
    for rel in sorted(set(files) | set(suite.files)):
        path = suite.dir / rel
        if rel not in suite.files:
            out.append(Difference("suite", f"file {rel} ran with the suite and is no longer in its files:"))
        elif rel not in files:
            out.append(Difference("suite", f"file {rel} is in the suite's files: now, not in the run's"))
        elif not path.is_file():
            out.append(Difference("suite", f"the suite's file {path} is gone"))
        elif (sha := file_sha256(path)) != files[rel]:
            out.append(Difference("suite", f"the suite's file {path} changed since the run (sha256 "
                                  f"{str(files[rel])[:12]} recorded, {sha[:12]} now)"))
    return out


def _sources(m: Manifest, suite: Suite) -> tuple[list[str], list[Difference]]:
    """``NAME=REPO@COMMIT`` pins for every recorded source, and the sources that cannot be pinned."""
    sw: dict[str, Any] = m["software"] if isinstance(m.get("software"), dict) else {}
    recorded: dict[str, Any] = sw["sources"] if isinstance(sw.get("sources"), dict) else {}
    pins, diffs = [], []
    for src in suite.sources:
        r = recorded.get(src.name) if isinstance(recorded.get(src.name), dict) else None
        commit = r.get("commit") if r else None
        if not commit:
            diffs.append(Difference("commit", f"source {src.name}: no commit recorded for the run"))
            continue
        if r and r.get("override"):
            diffs.append(Difference("commit", f"source {src.name} ran from an override ({r['override']}), "
                                    f"replayed from {src.repo} at {str(commit)[:12]}"))
        pins.append(f"{src.name}={src.repo}@{commit}")
    return pins, diffs


def _hardware(m: Manifest, tb_rec: dict[str, Any], testbed: str, store: Store | None) -> list[Difference]:
    """Another testbed, fewer hosts, other core counts or GPUs than the run recorded (state only)."""
    diffs = []
    if tb_rec.get("name") and testbed != tb_rec["name"]:
        diffs.append(Difference("testbed", f"recorded on {tb_rec['name']} ({tb_rec.get('provider')}), now on "
                                f"{testbed}"))
    hosts = [h for h in m.get("hosts") or [] if isinstance(h, dict)]
    tb = testbed_info(testbed, dry_run=False, min_hosts=max(1, len(hosts)), store=store)  # not provisioned: raises
    if len(tb.hosts) < len(hosts):
        diffs.append(Difference("hardware", f"the run used {plural(len(hosts), 'host')}, {testbed} has "
                                f"{len(tb.hosts)}"))
    rec_cpus = sorted({h["facts"]["cpus"] for h in hosts if isinstance(h.get("facts"), dict)
                       and isinstance(h["facts"].get("cpus"), int)})
    now_cpus = sorted({int(h.facts["cpus"]) for h in tb.hosts if isinstance(h.facts.get("cpus"), int)})
    if rec_cpus and now_cpus and rec_cpus != now_cpus:
        diffs.append(Difference("hardware", f"cores per host: {'/'.join(map(str, rec_cpus))} recorded, "
                                f"{'/'.join(map(str, now_cpus))} on {testbed}"))
    rec, now = recorded_gpus(m), testbed_gpus(tb.hosts, tb.context.get("hardware") or {})
    accel = {h.facts.get("accelerator") for h in tb.hosts} - {None}
    if rec is not None and now is not None:
        odd = [g for g in rec.models if not any(_same_gpu(g, n) for n in now.models)]
        odd += [n for n in now.models if not any(_same_gpu(g, n) for g in rec.models)]
        if odd:
            diffs.append(Difference("hardware", f"GPU model: {', '.join(rec.models)} recorded ({rec.source}), "
                                    f"{', '.join(now.models)} on {testbed} ({now.source})"))
        if rec.counts != now.counts:
            diffs.append(Difference("hardware", f"GPUs per host: {'/'.join(map(str, rec.counts))} recorded "
                                    f"({rec.source}), {'/'.join(map(str, now.counts))} on {testbed} ({now.source})"))
    elif rec is not None and accel and "gpu" not in accel:
        diffs.append(Difference("hardware", f"the run had GPUs ({', '.join(rec.models)}), {testbed}'s hosts have "
                                f"{', '.join(sorted(map(str, accel)))}"))
    return diffs


@dataclass
class Gpus:
    """The GPUs of a run's hosts or of a testbed: their models, the distinct counts per host, and who said so."""

    models: list[str]
    counts: list[int]
    source: str


def recorded_gpus(m: Manifest) -> Gpus | None:
    """What the manifest says the run had: the hosts' nvidia-smi, else its testbed spec's hardware.gpu."""
    per_host = [[str(g["name"]) for g in h["facts"].get("gpus") or [] if isinstance(g, dict) and g.get("name")]
                for h in m.get("hosts") or [] if isinstance(h, dict) and isinstance(h.get("facts"), dict)]
    if any(per_host):
        return Gpus(sorted({n for names in per_host for n in names}), sorted({len(n) for n in per_host}),
                    "nvidia-smi on the run's hosts")
    tb = m["testbed"] if isinstance(m.get("testbed"), dict) else {}
    hw = tb["hardware"] if isinstance(tb.get("hardware"), dict) else {}
    if hw.get("gpu_model"):
        return Gpus([str(hw["gpu_model"])], [int(hw.get("gpus") or 1)], "the testbed spec's hardware.gpu")
    return None


def testbed_gpus(hosts: list[HostInfo], hardware: dict[str, Any]) -> Gpus | None:
    """What a testbed has now: GPUs its hosts' recorded facts list, else its spec's hardware.gpu."""
    per_host = [[str(g["name"]) for g in h.facts.get("gpus") or [] if isinstance(g, dict) and g.get("name")]
                for h in hosts]
    if any(per_host):
        return Gpus(sorted({n for names in per_host for n in names}), sorted({len(n) for n in per_host}),
                    "its hosts' recorded facts")
    if hardware.get("gpu_model"):
        return Gpus([str(hardware["gpu_model"])], [int(hardware.get("gpus") or 1)], "its spec's hardware.gpu")
    return None


def _same_gpu(a: str, b: str) -> bool:
    """One GPU model named two ways: 'RTX 3070' in a spec is nvidia-smi's 'NVIDIA GeForce RTX 3070'."""
    a, b = " ".join(a.lower().split()), " ".join(b.lower().split())
    return a in b or b in a


# --- comparing the two runs ------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """How a replay ended: its run's status, the verdicts, and why the runs could not be compared (None: they
    were). ``code``: 0 every metric within tolerance, 1 otherwise (outside, or not compared)."""

    run_id: str
    status: str
    verdicts: list[Verdict] = field(default_factory=list)
    problem: str | None = None

    @property
    def code(self) -> int:
        return 0 if self.problem is None and all(v.within for v in self.verdicts) else 1


def references(suite: Suite) -> References:
    """The suite's references; refused (UsageError, exit 2, before a replay) when it declares none."""
    if suite.references is None:
        raise UsageError(f"suite {suite.name} declares no references: a replay would have no metric to compare",
                         where=suite.source or suite.name,
                         fix="add a references: section to the suite (see testbed.references)")
    return suite.references


def conclude(replay: Replay, run_id: str, status: str, reason: str | None = None) -> Outcome:
    """Collect the replay beside the original, then :func:`judge` it (never an exception: the replay ran)."""
    root = results_root(replay.run_dir)
    problem = collect.format_problems(collect.collect_runs([run_id], to=root))
    if problem is not None:
        return Outcome(run_id, status, problem=f"the replay could not be collected: {problem.what}")
    return judge(replay, root / replay.suite.name / run_id, status, reason)


def judge(replay: Replay, replay_dir: Path, status: str, reason: str | None = None) -> Outcome:
    """The collected replay at ``replay_dir`` compared with the original: a replay that did not succeed, or
    whose metrics could not all be compared, is an Outcome with its ``problem``."""
    out = Outcome(replay_dir.name, status)
    if status != "succeeded":
        out.problem = f"the replay {status}" + (f" ({reason})" if reason else "") + ": nothing to compare"
        return out
    try:
        out.verdicts = compare(replay.run_dir, replay_dir, references(replay.suite))
    except TestbedError as e:
        out.problem = f"the two runs could not be compared: {e.what}"
        return out
    missing = [v.metric for v in out.verdicts if v.within is None]
    if missing:
        out.problem = f"not compared: {', '.join(missing)} (measured in only one of the runs, or in neither)"
    return out


def compare(original: Path, replay: Path, refs: References) -> list[Verdict]:
    """Each of ``refs`` (the replayed suite's references) read from both runs' reports (both rebuilt): the
    original's value is the reference, the replay's is ours, within the reference's tolerance; a bound (at most,
    at least) is checked on the replay. A metric the original lacks is not measured."""
    a, b = build_report(original), build_report(replay)
    first = {v.metric: v for v in evaluate(refs, a.tables, RunDir.open(original).host_records())}
    pairs: list[Reference] = []
    for r in refs.metrics:
        orig = first.get(r.metric)
        if r.compare == "equal" and orig is not None and orig.ours is not None:
            r = r.model_copy(update={"value": orig.ours, "source": f"run {a.path.parent.parent.name}"})
        pairs.append(r)
    out = evaluate(References(hardware=refs.hardware, metrics=pairs), b.tables,
                   RunDir.open(replay).host_records())
    for v in out:
        orig = first.get(v.metric)
        if orig is None or orig.ours is None:
            v.within, v.difference, v.relative_pct = None, None, None
            v.note = "not measured in the original run"
    return out


def results_root(run_dir: Path) -> Path:
    """The results folder a run sits in (``results/`` of ``results/<suite>/<run-id>``)."""
    return Path(os.path.normpath(Path(run_dir).absolute())).parent.parent
