"""CLI commands for testbeds: provision, status, destroy, setup, exec, ssh, extend, forget-host and
``list [testbeds|profiles|runs]``. They call the providers, set-up and state, and render what those return.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from testbed.cli import complete, hot
from testbed.cli.common import JsonOpt, console, print_json, store
from testbed.cli.hot import _hosts_table, _known_testbed, _print_runs, _recent_runs, provider_for
from testbed.errors import TestbedError, UsageError


# provision / status / destroy ---------------------------------------------------------------------
def provision(name: Annotated[str, typer.Argument(help="Testbed name (inventories/NAME.yml) or a .yml path.",
                                                  autocompletion=complete.testbeds)],
              json_out: JsonOpt = False) -> None:
    """Create (or repair) the testbed's hosts and record them in state. Idempotent.

    Example: testbed provision local
    """
    from testbed.spec import check_vars

    st = store()
    p = provider_for(name, st)
    check_vars(p.spec)  # set-up variables are refused before any host is made
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


def status(target: Annotated[str | None, typer.Argument(help="A testbed name or a run id; none: everything.",
                                                        autocompletion=complete.testbeds_or_runs)] = None,
           probe: Annotated[bool, typer.Option("--probe", help="Check every host over SSH.")] = False,
           json_out: JsonOpt = False) -> None:
    """What state knows, without touching the network (``--probe`` checks reachability).

    Example: testbed status local --probe
    """
    hot.status(target, probe, json_out)


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
          limit: Annotated[str | None, typer.Option("--limit", "-l", help="Only these hosts (comma-separated).")]
          = None,
          var: Annotated[list[str] | None, typer.Option("--var", "-e", help="Extra variable key=value (repeatable).")]
          = None,
          source: Annotated[list[str] | None, typer.Option("--source", help="NAME=PATH|URL[@REF]: build a profile's "
                                                                            "source from a local checkout, fork or "
                                                                            "mirror (repeatable).")] = None,
          json_out: JsonOpt = False) -> None:
    """Apply Ansible roles to the testbed: a profile, a suite's profile, or single roles.

    Without options the testbed's default profile (its spec's `profile:`) is applied.
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
    kw: dict[str, Any] = {"profile": profile, "suite": suite, "roles": role or None, "check": check,
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
    rc = hot.exec_(name, command, hosts, timeout, json_out)
    if rc:
        raise typer.Exit(rc)


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
