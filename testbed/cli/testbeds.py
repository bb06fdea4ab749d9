"""CLI commands for testbeds: provision, status, destroy, setup, exec, ssh, extend, forget-host and
``list [testbeds|profiles|runs]``. They call the providers, set-up and state, and render what those return.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from testbed.errors import TestbedError, UsageError

if TYPE_CHECKING:

    from testbed.providers.base import Provider
    from testbed.state import Store

from testbed.cli import complete
from testbed.cli.common import JsonOpt, console, escape, print_json, store


def provider_for(name: str, st: Store | None = None, progress: Any = None, *,
                 recorded_ok: bool = False) -> Provider:
    """The provider of testbed ``name`` from its spec (validated before anything is touched).

    ``recorded_ok``: when the spec no longer loads (edited, deleted, an unset variable), use the copy recorded at
    provision instead (destroy must work from state alone), saying so.
    """
    from testbed.handle import Testbed

    tb = Testbed.open(name, st or store(), recorded_ok=recorded_ok)
    for note in tb.notes:
        console(stderr=True).print(f"[yellow]note:[/yellow] {escape(note)}")
    return tb.provider(progress or _progress_printer())


def _progress_printer() -> Any:
    err = console(stderr=True)

    def show(line: str) -> None:
        err.print(f"[dim]…[/dim] {line}")

    return show


def _hosts_table(title: str, hosts: list[Any]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("host", "address", "port", "user", "groups", "state"):
        t.add_column(col)
    for h in hosts:
        t.add_row(h.name, h.address, str(h.port), h.user, ",".join(h.groups), h.state)
    return t


def _known_testbed(st: Store, name: str) -> dict[str, Any]:
    tb = st.testbed(name)
    if tb is None:
        from testbed.spec import load_testbed

        load_testbed(name)  # an unknown name gets the 'no testbed named' message with a hint
        raise TestbedError(f"testbed '{name}' is not provisioned", where="state", fix=f"testbed provision {name}")
    return tb


# provision / status / destroy ---------------------------------------------------------------------
def provision(name: Annotated[str, typer.Argument(help="Testbed name (inventories/NAME.yml) or a .yml path.",
                                                  autocompletion=complete.testbeds)],
              repair: Annotated[str | None, typer.Option("--repair", metavar="HOST",
                                                         help="Bring this failed host back (restart, rebuild or "
                                                              "replace it) and set it up again; others untouched.")
                                ] = None,
              no_setup: Annotated[bool, typer.Option("--no-setup", help="With --repair: do not set the host up "
                                                                      "again.")] = False,
              json_out: JsonOpt = False) -> None:
    """Create (or repair) the testbed's hosts and record them in state. Idempotent.

    Example: testbed provision local  |  testbed provision chameleon --repair node-2
    """
    from testbed.spec import check_vars

    st = store()
    p = provider_for(name, st)
    check_vars(p.spec)  # set-up variables are refused before any host is made
    if repair is not None:
        return _repair(name, repair, not no_setup, json_out)
    if no_setup:
        raise UsageError("--no-setup goes with --repair", where="--no-setup",
                         fix=f"testbed provision {name} --repair HOST --no-setup")
    t0 = time.monotonic()
    try:
        hosts = p.provision()
    except KeyboardInterrupt:
        raise TestbedError(f"provisioning of '{p.name}' was interrupted; every resource created so far is recorded",
                           where=f"testbed {p.name}", fix=f"run 'testbed destroy {p.name}' to release them, "
                           f"or 'testbed provision {p.name}' to finish") from None
    dt = time.monotonic() - t0
    if json_out:
        print_json({"testbed": p.name, "provider": p.kind, "seconds": round(dt, 2),
                     "hosts": [h.to_dict() for h in hosts]})
        return
    c = console()
    c.print(_hosts_table(f"testbed {p.name} ({p.kind}): {len(hosts)} hosts up in {dt:.1f} s", hosts))
    from testbed import ssh

    c.print(f"ssh:     ssh -F {ssh.ssh_config_path(p.name)} {hosts[0].name}" if hosts else "")
    c.print(f"ansible: ansible -i {ssh.inventory_path(p.name)} all -m ping")


def _repair(name: str, host: str, setup: bool, json_out: bool) -> None:
    from testbed.handle import Testbed

    tb = Testbed.open(name, store())
    if tb.record is None:
        raise UsageError(f"testbed '{tb.name}' is not provisioned: there is no host to repair", where="state",
                           fix=f"testbed provision {tb.name}")
    c = console()
    done = tb.repair(host, setup=setup, progress=None if json_out else (lambda m: c.print(f"  {m}")))
    if json_out:
        print_json(done.to_json())
        return
    made = f"made anew: {', '.join(done.replaced)}" if done.replaced else "came back (same machine)"
    c.print(f"{host}: repaired in {done.repair_seconds:.1f} s ({made})"
            + (f"; set up again ({done.setup}) in {done.setup_seconds:.1f} s" if done.setup else ""))


def status(target: Annotated[str | None, typer.Argument(help="A testbed name or a run id; none: everything.",
                                                        autocompletion=complete.testbeds_or_runs)] = None,
           probe: Annotated[bool, typer.Option("--probe", help="Check every host over SSH.")] = False,
           json_out: JsonOpt = False) -> None:
    """What state knows, without touching the network (``--probe`` checks reachability).

    Example: testbed status local --probe
    """
    st = store()
    if target is None:
        tbs = st.testbeds()
        runs = _recent_runs(st)
        if json_out:
            print_json({"testbeds": [{**t, "hosts": len(st.hosts(t["name"]))} for t in tbs], "runs": runs})
            return
        from rich.table import Table

        t = Table(title="testbeds", title_justify="left")
        for col in ("name", "provider", "status", "hosts", "updated"):
            t.add_column(col)
        for tb in tbs:
            t.add_row(tb["name"], tb["provider"], tb["status"], str(len(st.hosts(tb["name"]))),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(tb["updated"])))
        console().print(t if tbs else "no testbed provisioned (try: testbed provision local)")
        if runs:
            _print_runs(runs)
        return
    if st.testbed(target) is None and st.run(target) is not None:
        return _run_status(target, json_out)
    tb = _known_testbed(st, target)
    hosts = st.hosts(target)
    extra: dict[str, Any] = {}
    try:  # a spec that no longer loads still lets status show what state knows
        p = provider_for(target, st)
        extra = p.describe()
        if probe:
            hosts = p.refresh()
    except TestbedError:
        pass
    if probe:
        from testbed import remote

        up = [h for h in hosts if h.state not in ("down", "preempted", "gone")]
        res = {r.host: r for r in remote.run(target, [h.name for h in up], "true", timeout=20)}
        for h in hosts:
            r = res.get(h.name)
            h.state = "up" if r and r.ok else ("unreachable" if r else h.state)
            st.set_host_state(target, h.name, h.state)
    if json_out:
        print_json({"testbed": target, "provider": tb["provider"], "status": tb["status"], **extra,
                     "hosts": [{"name": h.name, "address": h.address, "port": h.port, "user": h.user,
                                "groups": h.groups, "state": h.state} for h in hosts]})
        return
    c = console()
    c.print(_hosts_table(f"testbed {target} ({tb['provider']}, {tb['status']})", hosts))
    for k, v in extra.items():
        if k == "warning":
            c.print(f"[yellow]warning:[/yellow] {v}")
        else:
            c.print(f"{k}: {v}")


def destroy(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
            yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask (no prompt is shown anyway when "
                                                                  "stdin is not a terminal).")] = False) -> None:
    """Release every resource of the testbed (hosts, leases, IPs, namespaces). Safe to repeat.

    Example: testbed destroy local
    """
    st = store()
    p = provider_for(name, st, recorded_ok=True)
    if not yes and sys.stdin.isatty() and p.costs_money:
        typer.confirm(f"destroy every cloud resource of testbed '{name}'?", abort=True)
    t0 = time.monotonic()
    try:
        p.destroy()
    except KeyboardInterrupt:
        raise TestbedError(f"destroy of '{name}' was interrupted; what is left is still recorded",
                           where=f"testbed {name}", fix=f"run 'testbed destroy {name}' again") from None
    console().print(f"testbed {name} destroyed in {time.monotonic() - t0:.1f} s")


def setup(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
          profile: Annotated[str | None, typer.Option("--profile", "-P", help="Profile to apply.",
                                                                   autocompletion=complete.profiles)] = None,
          suite: Annotated[str | None, typer.Option("--suite", "-s", help="Apply the profile this suite needs.",
                                                                 autocompletion=complete.suites)]
          = None,
          role: Annotated[list[str] | None, typer.Option("--role", "-r", help="Apply single roles (repeatable).")]
          = None,
          check: Annotated[bool, typer.Option("--check", help="Show what would change; change nothing.")] = False,
          verify: Annotated[bool, typer.Option("--verify", help="Run Ansible on every host even where the recorded "
                                                                "set-up matches; report drift.")] = False,
          limit: Annotated[str | None, typer.Option("--limit", "-l", help="Only these hosts (comma-separated).")]
          = None,
          var: Annotated[list[str] | None, typer.Option("--var", "-e", help="Extra variable key=value (repeatable).")]
          = None,
          source: Annotated[list[str] | None, typer.Option("--source", help="NAME=PATH|URL[@REF]: build a profile's "
                                                                            "source from a local checkout, fork or "
                                                                            "mirror (repeatable).")] = None,
          json_out: JsonOpt = False) -> None:
    """Apply Ansible roles to the testbed: a profile, a suite's profile, or single roles.

    Without options the testbed's default profile (its spec's `profile:`) is applied. Hosts whose recorded
    set-up matches what would be applied are skipped; --verify runs Ansible on them too and reports drift.
    Example: testbed setup local --profile local-suites
    """
    from testbed import setup as setup_mod

    given = [x for x in (profile, suite, role) if x]
    if len(given) > 1:
        raise UsageError("give only one of --profile, --suite, --role", where="command line",
                         fix="testbed setup local --profile local-suites")
    _known_testbed(store(), name)
    extra: dict[str, Any] = {}
    for kv in var or []:
        if "=" not in kv:
            raise UsageError(f"bad --var '{kv}'", where="command line", fix="use --var key=value")
        k, v = kv.split("=", 1)
        extra[k.strip()] = v
    builds = _setup_sources(name, profile, suite, source or [])
    if builds:
        extra["testbed_source_overrides"] = builds
    kw: dict[str, Any] = {"profile": profile, "suite": suite, "roles": role or None, "check": check, "verify": verify,
                          "limit": [x.strip() for x in limit.split(",") if x.strip()] if limit else None,
                          "extra_vars": extra or None}
    if json_out:
        result = setup_mod.apply(name, **kw)
        sys.stdout.write(result.to_json() + "\n")
    else:
        from testbed.cli import setup_view

        result = setup_view.apply_with_progress(name, console=console(), **kw)
    if result.error:
        raise TestbedError(result.error, where=result.artifact_dir or f"testbed {name}",
                           fix="read the Ansible output above; fix the role or the host, then run setup again")
    if not result.ok:
        raise typer.Exit(1)


def _setup_sources(name: str, profile: str | None, suite: str | None, given: list[str]) -> dict[str, Any]:
    """--source and the testbed spec's ``sources:`` as the source_build role's overrides (checked here)."""
    from testbed import sources
    from testbed.spec import load_testbed

    suite_sources: dict[str, str] = {}
    if suite:
        from testbed.suite import load_suite

        s = load_suite(suite)
        profile, suite_sources = s.profile, {x.name: x.repo for x in s.sources}
    builds = sources.profile_builds(profile or load_testbed(name).profile)
    resolved = sources.overrides_for(sources.spec_sources(name), sources.parse(given), suite_sources, builds)
    return sources.for_setup(resolved, suite_sources, builds) if resolved else {}


# exec / ssh ------------------------------------------------------------------------------------------
def exec_(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
          command: Annotated[list[str], typer.Argument(help="The command, after '--'; run by each host's shell.")],
          hosts: Annotated[str | None, typer.Option("--hosts", "-H", help="Names, groups or globs, comma-separated.")]
          = None,
          timeout: Annotated[float | None, typer.Option(help="Seconds before a host's command is killed.")] = None,
          json_out: JsonOpt = False) -> None:
    """Run a command on every host in parallel; output grouped per host; exit 1 if any host failed.

    Example: testbed exec local --hosts workers -- 'nproc; uname -r'
    """
    from testbed import remote

    st = store()
    _known_testbed(st, name)
    selected = remote.select_hosts(st.hosts(name), hosts)
    cmd = " ".join(command)
    if not cmd.strip():
        raise UsageError("no command given", where="command line", fix="testbed exec local -- hostname")
    results = remote.run(name, [h.name for h in selected], cmd, timeout=timeout)
    failed = [r for r in results if not r.ok]
    if json_out:
        print_json([{"host": r.host, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr,
                      **({"error": r.error} if r.error else {})} for r in results])
    else:
        from rich.markup import escape
        from rich.rule import Rule

        c = console()
        for r in results:
            mark = "[green]ok[/green]" if r.ok else f"[red]{escape(r.error or f'exit {r.exit_code}')}[/red]"
            c.print(Rule(f"{r.host}  {mark}  {r.seconds:.2f} s", align="left"))
            if r.stdout:
                c.out(r.stdout.rstrip("\n"), highlight=False)
            if r.stderr and not r.error:
                c.print(f"[dim]{escape(r.stderr.rstrip())}[/dim]")
        c.print(f"{len(results) - len(failed)}/{len(results)} hosts ok"
                + (f"; failed: {', '.join(r.host for r in failed)}" if failed else ""))
    if failed:
        raise typer.Exit(1)


def ssh_(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
         host: Annotated[str | None, typer.Argument(help="Host name (default: the master).",
                                                    autocompletion=complete.hosts)] = None,
         command: Annotated[list[str] | None, typer.Argument(help="Optional command after '--'.")] = None) -> None:
    """Open an SSH session to a host with the testbed's key and pinned host keys.

    Example: testbed ssh local node1
    """
    from testbed import remote

    st = store()
    _known_testbed(st, name)
    hosts = st.hosts(name)
    names = [h.name for h in hosts]
    host = host or next((h.name for h in hosts if "master" in h.groups), names[0] if names else None)
    if host is None or host not in names:
        raise UsageError(f"no host '{host}' in testbed '{name}'", where="command line",
                         fix=f"hosts: {', '.join(names)}")
    remote.interactive(name, host, " ".join(command) if command else None)


def extend(name: Annotated[str, typer.Argument(help="Testbed name (a Chameleon testbed).",
                                               autocompletion=complete.testbeds)],
           hours: Annotated[float, typer.Option("--hours", help="Hours to add to the lease.")]) -> None:
    """Move the end of the testbed's lease later (Chameleon).

    Example: testbed extend chameleon --hours 4
    """
    st = store()
    _known_testbed(st, name)
    p = provider_for(name, st)
    if not p.can("extend"):
        raise UsageError(f"testbed '{name}' ({p.kind}) has no lease to extend", where="command line",
                         fix="extend applies to testbeds with a reservation (Chameleon leases)")
    new_end = p.extend(hours)
    console().print(f"lease of {name} now ends at {new_end}")


def forget_host(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
                host: Annotated[str, typer.Argument(help="Host whose pinned key to forget.",
                                                    autocompletion=complete.hosts)]) -> None:
    """Forget a host's pinned SSH key (after it was really rebuilt); the next connection pins the new one.

    Example: testbed forget-host tesla ecetesla3
    """
    from testbed import ssh

    _known_testbed(store(), name)
    ssh.forget_host_keys(name, [host])
    console().print(f"forgot the pinned key of {host}; the next connection trusts and pins its current key")


def list_default(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Testbeds defined in inventories/ and their state."""
    if ctx.invoked_subcommand is None:
        list_testbeds(json_out)


def list_testbeds(json_out: JsonOpt = False) -> None:
    """Testbed specs found in inventories/ (cwd first, then the shipped ones). Example: testbed list testbeds"""
    from testbed import paths

    st = store()
    rows = []
    for name, p in paths.list_resources("inventories").items():
        tb = st.testbed(name)
        rows.append({"name": name, "spec": str(p), "status": tb["status"] if tb else "not provisioned"})
    if json_out:
        print_json(rows)
        return
    from rich.table import Table

    t = Table(title="testbeds", title_justify="left")
    for col in ("name", "status", "spec"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["status"], r["spec"])
    console().print(t)


def list_profiles(json_out: JsonOpt = False) -> None:
    """Set-up profiles (playbooks/profiles/) with their roles. Example: testbed list profiles"""
    from testbed import setup as setup_mod

    rows: list[dict[str, Any]] = []
    for name in setup_mod.available_profiles():
        plan = setup_mod.load_profile(name)
        rows.append({"name": name, "roles": plan.roles})
    if json_out:
        print_json({"profiles": rows, "roles": setup_mod.available_roles()})
        return
    from rich.table import Table

    t = Table(title="profiles", title_justify="left")
    t.add_column("profile")
    t.add_column("roles, in order")
    for r in rows:
        t.add_row(r["name"], ", ".join(r["roles"]))
    c = console()
    c.print(t)
    c.print("roles: " + ", ".join(setup_mod.available_roles()))


def list_runs(json_out: JsonOpt = False) -> None:
    """Recent runs recorded in state. Example: testbed list runs"""
    runs = _recent_runs(store(), limit=100)
    if json_out:
        print_json(runs)
    else:
        _print_runs(runs)


def _recent_runs(st: Store, limit: int = 10) -> list[dict[str, Any]]:
    """The newest runs as JSON rows (their columns, without params and info)."""
    return [r.model_dump(mode="json", include={"id", "suite", "testbed", "status", "created", "started", "ended",
                                               "reason"}) for r in st.runs(limit)]


def _print_runs(runs: list[dict[str, Any]]) -> None:
    from rich.table import Table

    t = Table(title="runs", title_justify="left")
    for col in ("id", "suite", "testbed", "status", "started", "reason"):
        t.add_column(col)
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["started"])) if r.get("started") else ""
        t.add_row(r["id"], r["suite"], r["testbed"], r["status"], started, r.get("reason") or "")
    console().print(t)


def _run_status(run_id: str, json_out: bool) -> None:
    from testbed.cli.runs import show_run_status

    show_run_status(run_id, json_out)


def register(app: typer.Typer, list_app: typer.Typer) -> None:
    """Add the testbed commands to ``app`` (and ``list_app``)."""
    app.command()(provision)
    app.command()(status)
    app.command()(destroy)
    app.command()(setup)
    app.command(name="exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})(exec_)
    app.command(name="ssh")(ssh_)
    app.command()(extend)
    app.command(name="forget-host")(forget_host)
    list_app.callback(invoke_without_command=True)(list_default)
    list_app.command("testbeds")(list_testbeds)
    list_app.command("profiles")(list_profiles)
    list_app.command("runs")(list_runs)
