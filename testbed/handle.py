"""One resolved testbed: its spec, its state record, its hosts, its files and its provider; and the Python API.

A command resolves the testbed it names once, where it starts (the CLI, a script, a notebook), and passes this
handle down to the stages; nothing below the edge looks the testbed up again or opens the state store on its
own. The same object is what ``testbed.open("my-lab")`` gives a script or a notebook: the CLI's verbs as methods
of the same names (``provision``, ``setup``, ``exec``, ``put``/``get``, ``run_suite``, ``collect``, ``report``,
``destroy``), each host as a Fabric ``Connection`` with the testbed's pinned host keys, and the CLI's errors as
exceptions (``TestbedError``, printing what, where and fix). As in Fabric and Invoke, a verb that fails on a host
raises (``HostsFailed``, with every host's result; a run that does not succeed: ``RunFailed``) unless called with
``warn=True``, which returns the results instead. docs/api.md describes it.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import estimate, remote, services, ssh
from testbed.collect import format_problems
from testbed.errors import HostsFailed, RunFailed, UsageError
from testbed.paths import MANIFEST, RESULTS
from testbed.records import ENDED, OUTCOMES
from testbed.report.build import build_report
from testbed.resolved import Resolved
from testbed.run import bookkeeping as state
from testbed.run import runner
from testbed.textfmt import plural

if TYPE_CHECKING:
    from fabric import Connection, ThreadingGroup

    from testbed.collect import CollectResult
    from testbed.providers.base import Progress
    from testbed.records import CampaignRecord, RunEvent, RunRecord
    from testbed.remote import HostResult
    from testbed.report.build import ReportResult
    from testbed.report.folders import IndexResult
    from testbed.run.runner import LogLine
    from testbed.services import Extended
    from testbed.setup.events import SetupResult
    from testbed.setup.repair import Repair
    from testbed.state import Store


@dataclass(repr=False)
class Testbed(Resolved):
    """A resolved testbed with the CLI's verbs as methods, for scripts and notebooks (docs/api.md)."""

    __test__ = False

    # the verbs, for scripts and notebooks -------------------------------------------------------------------
    def provision(self, progress: Progress | None = None, *, expire: str | None = None) -> Testbed:
        """Create (or find) the hosts and record them (idempotent, as ``testbed provision``); this testbed.
        ``expire`` (8h, 2d): its dead-man's switch releases it then."""
        services.provision(self, expire=expire, progress=progress)
        return self

    def repair(self, host: str, *, setup: bool = True, profile: str | None = None,
               progress: Progress | None = None) -> Repair:
        """Bring one failed host back without touching the others (as ``testbed provision NAME --repair HOST``),
        then set it up again (:func:`testbed.services.repair`). Raises TestbedError when it cannot."""
        return services.repair(self, host, setup=setup, profile=profile, progress=progress)

    def destroy(self, progress: Progress | None = None) -> None:
        """Release every resource and forget the testbed (as ``testbed destroy``; it does not ask)."""
        services.destroy(self, progress)

    def extend(self, hours: float | None = None, *, expire: str | None = None) -> Extended:
        """Move the expiry by ``hours`` or to ``expire`` from now (8h), and a Chameleon lease with it (as
        ``testbed extend``); what moved."""
        return services.extend(self, hours=hours, expire=expire)

    def _names(self, hosts: str | Sequence[str] | None) -> list[str]:
        """Host names from a pattern (names, groups, globs: ``"workers"``, ``"node[12]"``) or a list; all by
        default. An unknown name is refused."""
        return services.select(self.name, self.hosts, hosts)

    def exec(self, command: str, hosts: str | Sequence[str] | None = None, *, timeout: float | None = None,
             warn: bool = False) -> HostResults:
        """Run a shell command on the hosts in parallel (OpenSSH over multiplexed connections, as ``testbed
        exec``); host -> result (``ok``, ``exit_code``, ``stdout``, ``stderr``, ``error``). A host where it fails
        (a non-zero exit, no answer, a timeout) raises :class:`HostsFailed` with every host's result, unless
        ``warn`` (then look at the results' ``ok``/``failed``), as Fabric's ``run`` and ``Group.run`` do."""
        out = HostResults((r.host, r) for r in services.exec_(self.store, self.name, command, hosts, timeout=timeout))
        if not out.ok and not warn:
            raise self._failed(f"exec {command!r}", out, "each host's exit_code, stdout and stderr are in the "
                                                           "exception's results")
        return out

    def put(self, local: str | Path, remote_path: str, hosts: str | Sequence[str] | None = None, *,
            timeout: float = 300, warn: bool = False) -> HostResults:
        """Copy a local file to ``remote_path`` on each host (sftp, in parallel); host -> result. A host that fails
        raises :class:`HostsFailed` unless ``warn``."""
        src = Path(local)
        if not src.is_file():
            raise UsageError(f"no file {src}", where="put", fix="give the path of a local file")
        names = self._names(hosts)
        done = remote.each(lambda h: remote.put(self.name, h, [(src, remote_path)], idle=timeout), names)
        out = HostResults(zip(names, done, strict=True))
        if not out.ok and not warn:
            raise self._failed(f"put {src} -> {remote_path}", out,
                               f"check that the folder of {remote_path} exists and is writable there "
                               f"(tb.exec('ls -ld {shlex.quote(str(Path(remote_path).parent))}'))")
        return out

    def get(self, remote_path: str, local_dir: str | Path, hosts: str | Sequence[str] | None = None, *,
            timeout: float = 300, warn: bool = False) -> Fetched:
        """Copy ``remote_path`` from each host to ``local_dir/<host>/<its name>`` (sftp, in parallel); host -> the
        local file. A host that fails raises :class:`HostsFailed` unless ``warn`` (then it is left out of the
        mapping and its result is in ``failed``)."""
        names = self._names(hosts)
        files = {h: Path(local_dir) / h / Path(remote_path).name for h in names}
        for p in files.values():
            p.parent.mkdir(parents=True, exist_ok=True)
        done = remote.each(lambda h: remote.get(self.name, h, [(remote_path, files[h])], idle=timeout), names)
        results = HostResults(zip(names, done, strict=True))
        if not results.ok and not warn:
            raise self._failed(f"get {remote_path}", results,
                               f"check the path on those hosts (tb.exec('ls -l {shlex.quote(remote_path)}'))")
        return Fetched({h: p for h, p in files.items() if results[h].ok}, results)

    def _failed(self, verb: str, results: HostResults, fix: str) -> HostsFailed:
        """The error for a verb that failed on some hosts: each one named with why (at most 10 lines)."""
        bad = results.failed
        lines = [f"{h}: {_why(r)}" for h, r in list(bad.items())[:10]]
        if len(bad) > 10:
            lines.append(f"... and {len(bad) - 10} more")
        head = f"{verb} failed on {len(bad)} of {len(results)} host{'s' if len(results) != 1 else ''}"
        what = f"{head}: {lines[0]}" if len(lines) == 1 else head + ":\n  " + "\n  ".join(lines)
        return HostsFailed(what, results=results, failed=bad, where=f"testbed {self.name}",
                           fix=f"{fix}; warn=True returns the results instead of raising")

    def setup(self, profile: str | None = None, *, suite: str | None = None, roles: list[str] | None = None,
              check: bool = False, limit: list[str] | None = None, extra_vars: dict[str, Any] | None = None,
              verify: bool = False, warn: bool = False, bake: bool | None = None) -> SetupResult:
        """Apply a profile (the spec's by default), a suite's profile or single roles (as ``testbed setup``):
        hosts whose recorded set-up matches are skipped unless ``verify``. A host that fails or does not answer
        raises :class:`HostsFailed` (its ``results`` is the set-up's result) unless ``warn``. ``bake`` as
        ``--bake``/``--no-bake`` (None: a testbed whose images cost nothing bakes one by itself)."""
        res = services.setup(self, profile=profile, suite=suite, roles=roles, check=check, limit=limit,
                             extra_vars=extra_vars, verify=verify, bake=bake).result
        if not res.ok and not warn:
            raise services.setup_failed(self.name, res, "warn=True returns the result instead of raising")
        return res

    def run_suite(self, suite: str, params: dict[str, Any] | None = None, *, faults: list[str] | None = None,
                  setup: bool = True, sources: dict[str, str] | None = None, detach: bool = False,
                  timeout: float = 3600, warn: bool = False) -> Run:
        """Run a suite on this testbed (as ``testbed run SUITE --on NAME``): its profile applied first unless
        ``setup=False``, then the run, detached on the hosts, waited for (``detach=True``: returned once started,
        to ``wait`` on). A run that does not succeed raises :class:`RunFailed` unless ``warn``. ``faults``: None
        for the suite's default faults, [] for none. ``sources``: name -> path or URL[@ref] (``--source``)."""
        run = self._start(suite, params, faults=faults, setup=setup, sources=sources)
        return run if detach else run.wait(timeout, warn=warn)

    def run_matrix(self, suite: str, params: dict[str, Any] | None = None, *, faults: list[str] | None = None,
                   budget: str | None = None, setup: bool = True, sources: dict[str, str] | None = None,
                   detach: bool = False, warn: bool = False) -> CampaignRecord:
        """Run every point of the suite's matrix as one campaign (as ``testbed run SUITE --on NAME --matrix``):
        ``params`` filter the points; ``budget`` (``"40h"``, ``"500 SU"``, ``"$120"``) starts no point whose
        estimate would pass it, leaving the campaign ``paused`` (the same call resumes it, nothing repeated). A
        point that does not succeed raises :class:`RunFailed` (its ``run``) unless ``warn``; ``detach=True``
        returns once it is started, driven by a process of its own. The campaign's record either way."""
        bud = None
        if budget is not None:
            try:
                bud = estimate.parse_budget(budget)
            except ValueError as e:
                raise UsageError(str(e), where="budget", fix=f"write {estimate.BUDGET_RULE}") from None
        started = services.start_campaign(self, suite, params, faults=faults, sources=sources, budget=bud,
                                          with_setup=setup)
        if detach:
            services.detach_campaign(started.campaign_id)
            row = self.store.campaign(started.campaign_id)
        else:
            row = services.drive_campaign(started.campaign_id, store=self.store)
        assert row is not None  # recorded by start_campaign
        bad = [p for p in row.points if p.status in ENDED and p.status != "succeeded"]
        if bad and not warn:
            first = bad[0]
            raise RunFailed(f"campaign {row.id}: {plural(len(bad), 'point')} did not succeed (first: "
                            f"{first.run_id or '-'} {first.status})",
                            run=Run(first.run_id, self.store) if first.run_id else None, where=f"campaign {row.id}",
                            fix="e.run.logs() shows the first one's logs; warn=True returns the record instead")
        return row

    def _start(self, suite: str, params: dict[str, Any] | None, *, faults: list[str] | None, setup: bool,
               sources: dict[str, str] | None) -> Run:
        started = services.start(self, suite, params, faults=faults, with_setup=setup, sources=sources)
        return Run(started.run_id, self.store)

    def collect(self, runs: Run | str | Sequence[Run | str] | None = None, to: str | Path = RESULTS, *,
                warn: bool = False) -> list[CollectResult]:
        """Fetch runs' outputs into ``to/<suite>/<run id>/`` with checksums and a manifest (as ``testbed
        collect``): the runs given, else every ended run of this testbed. A host or run that could not be
        collected raises :class:`HostsFailed` (its ``results``: every run's result) unless ``warn``."""
        if runs is None:
            ids = [r["id"] for r in self.store.run_rows(-1, testbed=self.name) if r["status"] in ENDED][::-1]
            if not ids:
                raise UsageError(f"testbed '{self.name}' has no ended run to collect", where="state",
                                 fix="run a suite first: tb.run_suite('my-suite')")
        else:
            ids = [r.id if isinstance(r, Run) else r for r in ([runs] if isinstance(runs, Run | str) else runs)]
        out = services.collect(ids, to, store=self.store)
        if not warn:
            _raise_collect(out)
        return out

    def report(self, target: Run | str | Path = RESULTS, fmt: str = "md", *, to: str | Path = RESULTS,
               campaign: str | None = None) -> ReportResult | IndexResult:
        """Write reports (as ``testbed report``): of a run (a :class:`Run` or a run id: its folder under ``to``,
        collected first when it is not), else of a results path: a run folder, a suite folder or ``results/``
        (an index of everything). Failed checks are in the result's ``checks``/``passed``, as the CLI shows them."""
        if isinstance(target, Run) or (isinstance(target, str) and self.store.run(target) is not None):
            return (target if isinstance(target, Run) else Run(target, self.store)).report(to, fmt)
        return services.report(target, fmt, campaign=campaign)

    # the names before 0.2 (one release, with a DeprecationWarning) ------------------------------------------
    def run(self, command: str, hosts: str | Sequence[str] | None = None, *,
            timeout: float | None = None) -> HostResults:
        """Deprecated: :meth:`exec` (the CLI's name). Returns failures without raising, as it always did."""
        _deprecated("Testbed.run(command)", "Testbed.exec(command) (it raises on failure; warn=True does not)")
        return self.exec(command, hosts, timeout=timeout, warn=True)

    def start(self, suite: str, params: dict[str, Any] | None = None, *, faults: list[str] | None = None,
              setup: bool = True, sources: dict[str, str] | None = None) -> Run:
        """Deprecated: :meth:`run_suite` with ``detach=True``. Its run's ``wait`` does not raise, as it never did."""
        _deprecated("Testbed.start(suite)", "Testbed.run_suite(suite) (it waits and raises when the run fails; "
                                            "detach=True returns at once)")
        run = self._start(suite, params, faults=faults, setup=setup, sources=sources)
        run.warn = True
        return run

    def connection(self, host: str) -> Connection:
        """A Fabric ``Connection`` to ``host``: address, port, user and key from the testbed's ssh_config, and
        only the host key pinned for it accepted (an unknown or changed key is refused, never added)."""
        from fabric import Config, Connection
        from paramiko import RejectPolicy
        from paramiko.hostkeys import HostKeyEntry

        names = [h.name for h in self.hosts]
        if host not in names:
            raise UsageError(f"no host '{host}' in testbed '{self.name}'", where="connection",
                             fix=f"hosts: {', '.join(names) or 'none (provision it first)'}")
        name = host
        cfg = Config(runtime_ssh_path=str(ssh.ssh_config_path(self.name)))
        c = Connection(name, config=cfg)
        c.client.set_missing_host_key_policy(RejectPolicy())
        kh = ssh.known_hosts_path(self.name)
        seen = f"[{c.host}]:{c.port}" if c.port != 22 else c.host  # how paramiko looks the server up
        for line in (kh.read_text().splitlines() if kh.exists() else []):
            parts = line.split()
            if len(parts) >= 3 and parts[0] == name:
                entry = HostKeyEntry.from_line(f"{seen} {parts[1]} {parts[2]}")
                if entry is not None and entry.key is not None:
                    c.client.get_host_keys().add(seen, entry.key.get_name(), entry.key)
        return c  # a ProxyJump in the ssh_config is honoured by Fabric itself

    def group(self, hosts: str | Sequence[str] | None = None) -> ThreadingGroup:
        """A Fabric ``ThreadingGroup`` of :meth:`connection` for the hosts (all by default)."""
        from fabric import ThreadingGroup

        return ThreadingGroup.from_connections([self.connection(n) for n in self._names(hosts)])

    def __repr__(self) -> str:
        status = self.record["status"] if self.record is not None else "not provisioned"
        return f"<Testbed {self.name} ({self.kind}, {status}, {plural(len(self.hosts), 'host')})>"

    def _repr_html_(self) -> str:
        """A notebook's view: the testbed and a table of its hosts."""
        status = self.record["status"] if self.record is not None else "not provisioned"
        rows = "".join(
            f"<tr><td>{html.escape(h.name)}</td><td>{html.escape(h.user)}@{html.escape(h.address)}:{h.port}</td>"
            f"<td>{html.escape(', '.join(h.groups))}</td><td>{html.escape(h.state)}</td></tr>" for h in self.hosts)
        return (f"<b>testbed {html.escape(self.name)}</b> ({html.escape(self.kind)}, {html.escape(str(status))})"
                "<table><tr><th>host</th><th>ssh</th><th>groups</th><th>state</th></tr>" + rows + "</table>")


@dataclass
class Run:
    """A run started by :meth:`Testbed.run_suite` (or found by id with ``Run(id, store)``). ``warn``: the
    default of ``wait``'s and ``collect``'s ``warn``."""

    id: str
    store: Store
    warn: bool = False

    @property
    def record(self) -> RunRecord:
        return state.require(self.store, self.id)

    @property
    def status(self) -> str:
        return self.record.status

    def wait(self, timeout: float = 3600, *, warn: bool | None = None) -> Run:
        """Block until the run ends; a run that does not succeed raises :class:`RunFailed` unless ``warn`` (then
        look at ``status`` and ``record.reason``)."""
        rec = services.wait(self.id, timeout, store=self.store)
        if rec.status != "succeeded" and not (self.warn if warn is None else warn):
            raise RunFailed(f"run {self.id} {rec.status}: {rec.reason or 'no reason recorded'}", run=self,
                            where=f"run {self.id} on {rec.testbed}",
                            fix=f"see run.logs() or `testbed logs {self.id}`, and run.collect() for its outputs; "
                                "warn=True returns the run instead of raising",
                            code=OUTCOMES.get(rec.status, 1))
        return self

    def events(self) -> Iterator[RunEvent]:
        """Its events as they are recorded, until it ends."""
        return runner.watch(self.id, store=self.store)

    def logs(self, host: str | None = None) -> list[LogLine]:
        """Each rank's output lines so far."""
        return list(runner.logs(self.id, host=host, store=self.store))

    def stop(self) -> Run:
        """Stop it (every rank's process group TERM, then KILL), as ``testbed stop``."""
        services.stop(self.id, store=self.store)
        return self

    def collect(self, to: str | Path = RESULTS, *, warn: bool | None = None) -> CollectResult:
        """Fetch its outputs into ``to/<suite>/<run id>/`` with checksums and a manifest (as ``testbed
        collect``); a host that could not be collected raises :class:`HostsFailed` unless ``warn`` (then it is in
        the result's ``problems()``)."""
        out = services.collect([self.id], to, store=self.store)
        if not (self.warn if warn is None else warn):
            _raise_collect(out)
        return out[0]

    def report(self, to: str | Path = RESULTS, fmt: str = "md") -> ReportResult:
        """Write its report into the collected folder (collected first if it is not)."""
        folder = Path(to) / self.record.suite / self.id
        if not (folder / MANIFEST).exists():
            self.collect(to)
        return build_report(folder, fmt)

    def __repr__(self) -> str:
        r = self.record
        return f"<Run {self.id} ({r.suite} on {r.testbed}, {r.status})>"

    def _repr_html_(self) -> str:
        r = self.record
        return (f"<b>run {html.escape(self.id)}</b>: {html.escape(r.suite)} on {html.escape(r.testbed)}, "
                f"<b>{html.escape(r.status)}</b>" + (f" ({html.escape(r.reason)})" if r.reason else ""))


class HostResults(dict[str, "HostResult"]):
    """host -> what a call did there (``ok``, ``exit_code``, ``stdout``, ``stderr``, ``error``), in host order;
    like Fabric's ``GroupResult``, with ``ok``, ``succeeded`` and ``failed``."""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.values())

    @property
    def succeeded(self) -> dict[str, HostResult]:
        return {h: r for h, r in self.items() if r.ok}

    @property
    def failed(self) -> dict[str, HostResult]:
        return {h: r for h, r in self.items() if not r.ok}


class Fetched(dict[str, Path]):
    """host -> the local copy :meth:`Testbed.get` made, for each host that sent it; ``results``: what every host
    did, ``failed`` those that did not send it (only with ``warn=True``: it raises otherwise)."""

    def __init__(self, files: dict[str, Path], results: HostResults):
        super().__init__(files)
        self.results = results

    @property
    def ok(self) -> bool:
        return self.results.ok

    @property
    def failed(self) -> dict[str, HostResult]:
        return self.results.failed


def _why(r: HostResult) -> str:
    """One host's failure in a few words: the transport's error, else the exit code and stderr's last line."""
    if r.error:
        return r.error
    last = next((ln.strip() for ln in reversed(r.stderr.splitlines()) if ln.strip()), "")
    return f"exit {r.exit_code}" + (f": {last[:200]}" if last else "")


def _raise_collect(results: list[CollectResult]) -> None:
    """The collect's problems (a host that failed, a run that could not be read) as :class:`HostsFailed`."""
    problem = format_problems(results)
    if problem is not None:
        failed = {f"{r.run_id} on {h.host}": h for r in results for h in r.hosts if h.error}
        raise HostsFailed(problem.what, results=results, failed=failed, where=problem.where,
                          fix=f"{problem.fix}; warn=True returns the results instead of raising")


def _deprecated(old: str, new: str) -> None:
    import warnings

    warnings.warn(f"{old} is deprecated and goes in the next release: use {new}", DeprecationWarning, stacklevel=3)
