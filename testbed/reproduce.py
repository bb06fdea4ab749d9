"""``testbed reproduce results/<suite>/<run-id>``: run a recorded run again and compare the two, metric by metric.

The manifest says what ran: the suite (its file's sha256), the parameters, the faults, the sources at their
commits, the profile, the testbed and its hosts' hardware. :func:`prepare` compares that with what would run now
and lists every difference before any host is touched; a difference not named by ``--allow`` refuses the
replay. :func:`compare` then sets the replay's report beside the original's with the suite's tolerances.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.errors import UsageError
from testbed.report.verdicts import Verdict

if TYPE_CHECKING:
    from testbed.references import Reference
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
    manifest: dict[str, Any]
    suite: Suite
    testbed: str
    params: dict[str, Any]
    faults: list[str]
    sources: list[str] = field(default_factory=list)  # --source NAME=REPO@COMMIT pins
    differences: list[Difference] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.run_dir.name)


def prepare(run_dir: Path, on: str | None = None, allow: list[str] | None = None, *,
            store: Any = None) -> Replay:
    """Read the run's manifest and list what cannot be matched now; refuse (UsageError, exit 2) unless
    ``allow`` names every kind of difference. Touches no host."""
    from testbed.collect.manifest import load
    from testbed.run.runner import file_sha256
    from testbed.spec import DEFAULT_TESTBED
    from testbed.suite import load_suite

    allow = list(allow or [])
    for a in allow:
        if a not in KINDS:
            raise UsageError(f"--allow {a}: not a kind of difference", where="--allow",
                             fix=f"name one of: {', '.join(KINDS)}")
    run_dir = Path(run_dir)
    m = load(run_dir)
    if not m.get("suite") or not m.get("run_id"):
        raise UsageError(f"no run manifest in {run_dir}", where=str(run_dir / "manifest.json"),
                         fix="pass results/<suite>/<run-id> of a collected run (testbed collect RUN)")
    if m.get("rehearsal"):
        raise UsageError(f"run {m['run_id']} is a rehearsal on a local replica: there are no results to reproduce",
                         where=str(run_dir), fix="reproduce a real run")
    suite = load_suite(str(m["suite"]))
    diffs: list[Difference] = []
    rec: dict[str, Any] | None = m["suite_file"] if isinstance(m.get("suite_file"), dict) else None
    now = file_sha256(Path(suite.source)) if suite.source else None
    if rec is None or not rec.get("sha256"):
        diffs.append(Difference("suite", "the manifest records no suite hash (collected by an older testbed): the "
                                f"suite {suite.source} cannot be shown unchanged"))
    elif rec["sha256"] != now:
        diffs.append(Difference("suite", f"suite file {suite.source} changed since the run (sha256 "
                                f"{rec['sha256'][:12]} recorded, {str(now)[:12]} now)"))
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
    rep = Replay(run_dir, m, suite, testbed, dict(params), faults, pins, diffs)
    _refuse(rep, allow)  # what the files say first: a changed suite is named even where the testbed is gone
    diffs += _hardware(m, tb_rec, testbed, store)
    _refuse(rep, allow)
    return rep


def _refuse(rep: Replay, allow: list[str]) -> None:
    """One UsageError naming every difference ``allow`` does not name, and the --allow that would accept them."""
    refused = [d for d in rep.differences if d.kind not in allow]
    if refused:
        kinds = sorted({d.kind for d in refused}, key=KINDS.index)
        raise UsageError(f"run {rep.run_id} cannot be replayed as recorded: "
                         + "; ".join(f"{d.kind}: {d.what}" for d in refused),
                         where=str(rep.run_dir / "manifest.json"),
                         fix="undo the change, or replay anyway naming each difference: "
                             + " ".join(f"--allow {k}" for k in kinds))


def _sources(m: dict[str, Any], suite: Suite) -> tuple[list[str], list[Difference]]:
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


def _hardware(m: dict[str, Any], tb_rec: dict[str, Any], testbed: str, store: Any) -> list[Difference]:
    """Another testbed, fewer hosts, other core counts or GPUs than the run recorded (state only)."""
    from testbed.run.plan import testbed_info
    from testbed.textfmt import plural

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
    rec_gpus = sorted({str(g.get("name")) for h in hosts if isinstance(h.get("facts"), dict)
                       for g in h["facts"].get("gpus") or [] if isinstance(g, dict) and g.get("name")})
    accel = {h.facts.get("accelerator") for h in tb.hosts} - {None}
    if rec_gpus and accel and "gpu" not in accel:
        diffs.append(Difference("hardware", f"the run had GPUs ({', '.join(rec_gpus)}), {testbed}'s hosts have "
                                f"{', '.join(sorted(map(str, accel)))}"))
    return diffs


# --- comparing the two runs ------------------------------------------------------------------------------------
def compare(original: Path, replay: Path) -> list[Verdict]:
    """Each reference of the suite read from both runs' reports (both rebuilt): the original's value is the
    reference, the replay's is ours, within the reference's tolerance; a bound (at most, at least) is checked on
    the replay. A metric the original lacks is not measured."""
    from testbed.references import References
    from testbed.report.build import build_report
    from testbed.report.rundir import RunDir
    from testbed.report.verdicts import evaluate, suite_references

    a, b = build_report(original), build_report(replay)
    refs, why = suite_references(a.suite)
    if refs is None:
        raise UsageError(f"suite {a.suite} declares no references: the two runs have no metric to compare"
                         + (f" ({why})" if why else ""), where=f"experiments/{a.suite}.yml",
                         fix="add a references: section to the suite (see testbed.references)")
    first = {v.metric: v for v in a.verdicts}
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
