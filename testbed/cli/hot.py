"""The bodies of the hot commands (``status``, ``exec``) and the helpers the testbed commands share.

Importable without Typer: the Typer commands in ``testbed.cli.testbeds`` call them, and they import what they
need (state, remote) only when they run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.cli.output import Plain, console, escape, existing_store, print_json, store
from testbed.errors import TestbedError, UsageError
from testbed.textfmt import iso, plural

if TYPE_CHECKING:
    from collections.abc import Callable

    from testbed.hosts import Host
    from testbed.providers.base import Provider
    from testbed.resolved import Resolved
    from testbed.state import Store, TestbedRow


def resolve(name: str, st: Store | None = None, *, recorded_ok: bool = False) -> Resolved:
    """Testbed ``name`` resolved against this state home (its spec validated before anything is touched), what
    the resolution had to work around printed as notes. ``recorded_ok``: when the spec no longer loads (edited,
    deleted, an unset variable), use the copy recorded at provision (destroy must work from state alone)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed.resolved import Resolved

    tb = Resolved.open(name, st or store(), recorded_ok=recorded_ok)
    for note in tb.notes:
        console(stderr=True).print(f"[yellow]note:[/yellow] {escape(note)}")
    return tb


def provider_for(name: str, st: Store | None = None, progress: Callable[[str], None] | None = None, *,
                 recorded_ok: bool = False) -> Provider:
    """The provider of testbed ``name`` (:func:`resolve`), printing its progress."""
    return resolve(name, st, recorded_ok=recorded_ok).provider(progress or progress_printer())


def progress_printer() -> Callable[[str], None]:
    """A provider's progress lines, dimmed on stderr."""
    err = console(stderr=True)

    def show(line: str) -> None:
        err.print(f"[dim]…[/dim] {line}")

    return show


def _hosts_table(out: Plain, title: str, hosts: list[Host]) -> None:
    out.table(title, ("host", "address", "port", "user", "groups", "state"),
              [[h.name, h.address, str(h.port), h.user, ",".join(h.groups), h.state] for h in hosts],
              whole=("host", "address"))


def _gone(target: str, hosts: list[Host], gone: dict[str, str]) -> dict[str, str]:
    """Never "up" of a host this machine can see is gone (no network: /proc on a local testbed): each such host
    marked, and the warning that says how to bring them back."""
    for h in hosts:
        h.state = gone.get(h.name, h.state)
    if not gone:
        return {}
    return {"warning": f"{plural(len(gone), 'host')} gone ({', '.join(sorted(gone))}): its namespace is not running "
                       f"on this machine; 'testbed provision {target}' brings {'it' if len(gone) == 1 else 'them'} "
                       "back (disks kept)"}


def _known_testbed(st: Store, name: str) -> TestbedRow:
    tb = st.testbed(name)
    if tb is None:
        # lazy: start-up (testbed status and exec load this module)
        from testbed.spec import load_testbed

        hint = _elsewhere_hint(st, name)
        if not hint:
            load_testbed(name)  # an unknown name gets the 'no testbed named' message with a hint
        where = "state" if st.exists else f"state (none in this folder: {st.home})"
        raise TestbedError(f"testbed '{name}' is not provisioned here", where=where,
                           fix=f"testbed provision {name}" + hint)
    return tb


def _elsewhere_hint(st: Store, name: str) -> str:
    """Where else (other folders' state, from the index) a testbed of that name is recorded, as a hint."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import homes, ledger
    from testbed.state import Store

    found = []
    here = os.path.realpath(st.home)
    for h in homes.read()[0]:
        db = Path(h) / "state.db"
        if h == here or not db.is_file():
            continue
        try:
            other = Store(db, readonly=True)
            try:
                if other.testbed(name) is not None:
                    found.append(ledger.folder_of(h))
            finally:
                other.close()
        except Exception:  # noqa: S112 - a hint only: an unreadable home is named by 'testbed status'
            continue
    return f"; or cd to {' or '.join(found)}, where it is provisioned" if found else ""


def status(target: str | None, probe: bool, json_out: bool, orphans: bool = False) -> None:
    """``testbed status``: what state knows, without touching the network (``probe`` checks reachability); no
    target: the ledger of every testbed, this folder's and (from the per-user index) those of every other folder
    (``orphans``: also what the clouds hold that state does not record). Creates no state: a folder without
    one reads as empty."""
    if target is None:
        # lazy: start-up (testbed status and exec load this module)
        from testbed import homes, ledger
        from testbed.cli import ledger_view

        st = existing_store()
        data = ledger.ledger(st, st.home)
        data["runs"] = _recent_runs(st)
        other = ledger.elsewhere(st.home)
        if data["testbeds"]:  # state from before the index: listed from now on
            note = homes.register(st.home)
            if note:
                other["notes"].append(note)
        data["elsewhere"] = other
        if orphans:
            found = ledger.orphans(st)
            data["orphans"], data["orphans_asked"] = found["orphans"], found["asked"]
        if json_out:
            print_json(data)
            return
        ledger_view.render(Plain(), data)
        if data["runs"]:
            _print_runs(data["runs"])
        return
    st = existing_store(readonly=not probe)  # --probe records the hosts' state it finds
    if st.testbed(target) is None and st.run(target) is not None:
        return _run_status(target, json_out)
    tb = _known_testbed(st, target)
    hosts = st.hosts(target)
    extra: dict[str, Any] = {}
    # lazy: start-up (testbed status and exec load this module)
    from testbed import deadman, expiry

    e = deadman.recorded(st, target)
    if e is not None and e.active:  # the dead-man's switch: when it releases the testbed if nothing happens
        extra["expiry"] = expiry.iso(e.expire_at) or f"idle after {int(e.idle_after or 0)} s"
        extra["next_release"] = f"{expiry.iso(e.release_at())} ({e.switch or 'not armed'})"
    try:  # a spec that no longer loads still lets status show what state knows
        p = provider_for(target, st)
        extra = {**p.describe(), **extra}
        if probe:
            hosts = p.refresh()
        else:
            extra.update(_gone(target, hosts, p.machine_states()))
    except TestbedError:
        pass
    if probe:
        # lazy: start-up (testbed status and exec load this module)
        from testbed import remote

        up = [h for h in hosts if h.state not in ("down", "preempted", "gone")]
        res = {r.host: r for r in remote.run(target, [h.name for h in up], "true", timeout=20)}
        for h in hosts:
            r = res.get(h.name)
            h.state = "up" if r and r.ok else ("unreachable" if r else h.state)
            st.set_host_state(target, h.name, h.state)
        if e is not None and e.switch == "agent" and e.armed:  # what each host's agent says
            agents = deadman.agent_status(target, [n for n in e.armed if res.get(n) and res[n].ok])
            extra["agents"] = {n: (f"alive, releases at {expiry.iso((a.get('status') or {}).get('release_at'))}"
                                   if a.get("alive") else "released" if a.get("released") else
                                   a.get("error") or "not running") for n, a in agents.items()}
    if json_out:
        print_json({"testbed": target, "provider": tb["provider"], "status": tb["status"], **extra,
                     "hosts": [{"name": h.name, "address": h.address, "port": h.port, "user": h.user,
                                "groups": h.groups, "state": h.state} for h in hosts]})
        return
    out = Plain()
    _hosts_table(out, f"testbed {target} ({tb['provider']}, {tb['status']})", hosts)
    for k, v in extra.items():
        out.write(f"{out.paint('warning:', 'yellow')} {v}" if k == "warning" else f"{k}: {v}")


def exec_(name: str, command: list[str], hosts: str | None, timeout: float | None, json_out: bool) -> int:
    """``testbed exec``: run ``command`` on the selected hosts in parallel; the exit code (1: a host failed)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import remote

    cmd = " ".join(command)  # the options first: a bad one is refused whatever state holds
    if not cmd.strip():
        raise UsageError("no command given", where="command line", fix="testbed exec local -- hostname")
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"--timeout {timeout} is not a number of seconds", where="--timeout",
                         fix="give a positive, finite number of seconds (e.g. --timeout 30), or leave it out")
    if hosts is not None:
        remote.selection(hosts)
    st = existing_store(readonly=False)  # a testbed not provisioned here: no state is created to say so
    _known_testbed(st, name)
    # lazy: start-up (testbed status and exec load this module)
    from testbed import services

    results = services.exec_(st, name, cmd, hosts, timeout=timeout)
    failed = [r for r in results if not r.ok]
    if json_out:
        print_json([{"host": r.host, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr,
                      **({"error": r.error} if r.error else {})} for r in results])
    else:
        out = Plain()
        for r in results:
            out.rule((r.host, None), ("ok", "green") if r.ok else (r.error or f"exit {r.exit_code}", "red"),
                     (f"{r.seconds:.2f} s", None))
            if r.stdout:
                out.write(r.stdout.rstrip("\n"))
            if r.stderr and not r.error:
                out.write(out.paint(r.stderr.rstrip(), "dim"))
        out.write(f"{len(results) - len(failed)}/{plural(len(results), 'host')} ok"
                  + (f"; failed: {', '.join(r.host for r in failed)}" if failed else ""))
    return 1 if failed else 0


def _recent_runs(st: Store, limit: int = 10) -> list[dict[str, Any]]:
    """The newest runs as JSON rows (their columns, without params and info)."""
    return [{k: r[k] for k in ("id", "suite", "testbed", "status", "created", "started", "ended", "reason")}
            for r in st.run_rows(limit)]


def _print_runs(runs: list[dict[str, Any]]) -> None:
    Plain().table("runs", ("id", "suite", "testbed", "status", "started", "reason"),
                  [[r["id"], r["suite"], r["testbed"], r["status"], iso(r.get("started")) or "", r.get("reason") or ""]
                   for r in runs], whole=("id", "testbed", "started"))  # moments never cut in two


def _run_status(run_id: str, json_out: bool) -> None:
    # lazy: start-up (testbed status and exec load this module)
    from testbed.cli.runs import show_run_status

    show_run_status(run_id, json_out)
