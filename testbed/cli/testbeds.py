"""CLI commands for testbeds: provision, status, destroy, setup, exec, ssh, extend, forget-host and
``list [testbeds|profiles|runs]``. They call the providers, set-up and state, and render what those return.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Annotated, Any

import typer

from testbed.cli import complete, hot
from testbed.cli.common import JsonOpt, console, existing_store, json_wanted, print_json, store
from testbed.cli.hot import _hosts_table, _known_testbed, _print_runs, _recent_runs, provider_for
from testbed.cli.output import Plain
from testbed.errors import TestbedError, UsageError
from testbed.textfmt import plural


# provision / status / destroy ---------------------------------------------------------------------
def provision(name: Annotated[str, typer.Argument(help="Testbed name (inventories/NAME.yml) or a .yml path.",
                                                  autocompletion=complete.testbeds)],
              repair: Annotated[str | None, typer.Option("--repair", metavar="HOST",
                                                         help="Bring this failed host back (restart, rebuild or "
                                                              "replace it; the others stay as they are) and set it up "
                                                              "again (other hosts too where it changed what they "
                                                              "hold, e.g. its keys in their SSH mesh).")
                                ] = None,
              no_setup: Annotated[bool, typer.Option("--no-setup", help="With --repair: do not set the host up "
                                                                      "again.")] = False,
              expire: Annotated[str | None, typer.Option("--expire", help="Release the testbed this long from now "
                                                         "(8h, 90m, 2d), even with no controller running.")] = None,
              json_out: JsonOpt = False) -> None:
    """Create (or repair) the testbed's hosts and record them in state. Idempotent.

    Example: testbed provision local --expire 8h  |  testbed provision chameleon --repair node-2
    """
    from testbed.spec import check_vars

    _check_duration(expire, "--expire")
    if repair is not None and not repair.strip():
        raise UsageError("--repair names no host", where="--repair", fix=f"testbed provision {name} --repair HOST")
    st = store()
    p = provider_for(name, st)
    p.expire = expire
    check_vars(p.spec)  # set-up variables are refused before any host is made
    if repair is not None:
        if expire is not None:
            raise UsageError("--expire goes with provisioning, not with --repair", where="--expire",
                             fix=f"testbed extend {name} --expire {expire} moves the expiry")
        return _repair(name, repair, not no_setup, json_out)
    if no_setup:
        raise UsageError("--no-setup goes with --repair", where="--no-setup",
                         fix=f"testbed provision {name} --repair HOST --no-setup")
    t0 = time.monotonic()
    from testbed.setup import images

    image = images.for_provision(p)  # a new testbed whose set-up has an image boots from it
    try:
        hosts = p.provision()
    except KeyboardInterrupt:
        raise TestbedError(f"provisioning of '{p.name}' was interrupted; every resource created so far is recorded",
                           where=f"testbed {p.name}", fix=f"run 'testbed destroy {p.name}' to release them, "
                           f"or 'testbed provision {p.name}' to finish") from None
    dt = time.monotonic() - t0
    from testbed import deadman, expiry

    e = deadman.recorded(st, p.name)
    release_at = expiry.iso(e.release_at()) if e is not None and e.active else None
    if json_out:
        print_json({"testbed": p.name, "provider": p.kind, "seconds": round(dt, 2),
                     "hosts": [h.to_dict() for h in hosts], "release_at": release_at,
                     "image": {k: image[k] for k in ("key", "id", "plan")} if image else None})
        return
    c = console()
    if image:
        c.print(f"booted from image {image['id']} ({image['plan']}, key {image['key'][:12]}): 'testbed setup "
                f"{p.name}' checks it and runs only the roles that depend on the other hosts")
    _hosts_table(Plain(), f"testbed {p.name} ({p.kind}): {plural(len(hosts), 'host')} up in {dt:.1f} s", hosts)
    if release_at:
        c.print(f"released at {release_at} by its dead-man's switch ({e.switch if e else ''}) unless extended "
                f"(testbed extend {p.name} --expire 8h)")
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
    c.print(f"{host}: repaired in {done.repair_seconds:.1f} s ({done.how or 'brought back'})"
            + (f"; set up again ({done.setup}) in {done.setup_seconds:.1f} s" if done.setup else ""))


def status(target: Annotated[str | None, typer.Argument(help="A testbed name or a run id; none: everything.",
                                                        autocompletion=complete.testbeds_or_runs)] = None,
           probe: Annotated[bool, typer.Option("--probe", help="Check every host over SSH.")] = False,
           orphans: Annotated[bool, typer.Option("--orphans", help="Also ask the clouds for resources state does "
                                                                   "not record (network, credentials).")] = False,
           json_out: JsonOpt = False) -> None:
    """What state knows, without touching the network (``--probe`` checks reachability). With no name: the ledger
    of every testbed (what it holds, since when, cost, expiry and the next release).

    Example: testbed status local --probe
    """
    hot.status(target, probe, json_out, orphans)


def destroy(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
            yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask (no prompt is shown anyway when "
                                                                  "stdin is not a terminal).")] = False) -> None:
    """Release every resource of the testbed (hosts, leases, IPs, namespaces). Safe to repeat.

    Example: testbed destroy local
    """
    st = existing_store(readonly=False)
    if not st.exists:  # no state here: an unknown name is refused before any is created to say so
        from testbed.handle import Testbed

        Testbed.open(name, st, recorded_ok=True)
        st = store()  # a known spec: destroy may still find what an interrupted provision made (by name)
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
          bake: Annotated[bool, typer.Option("--bake", help="Once the set-up passed, make an image of a host keyed by "
                                                            "its content address (new testbeds of this set-up, and "
                                                            "hosts repaired with a new disk, boot from it).")]
          = False,
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
    if limit is not None:  # the options first: a bad one is refused whatever state holds
        from testbed.remote import selection

        selection(limit, "--limit")
    extra = _extra_vars(var or [])
    if bake and (role or check):
        raise UsageError(f"--bake goes with a profile or a suite, not with {'--role' if role else '--check'}",
                         where="--bake", fix=f"testbed setup {name} --profile local-suites --bake")
    twice = next((r for i, r in enumerate(role or []) if r in (role or [])[:i]), None)
    if twice is not None:
        raise UsageError(f"--role {twice} is given twice", where="--role", fix="name each role once")
    _known_testbed(existing_store(readonly=False), name)
    if bake:  # a provider that cannot bake here is refused before the set-up runs (it takes hours on real nodes)
        from testbed.handle import Testbed
        from testbed.setup import images

        images.refuse_bake(Testbed.open(name, store()), profile=profile, suite=suite)
    builds = _setup_sources(name, profile, suite, source or [])
    if builds:
        extra["testbed_source_overrides"] = builds
    kw: dict[str, Any] = {"profile": profile, "suite": suite, "roles": role or None, "check": check, "verify": verify,
                          "limit": [limit] if limit is not None else None, "extra_vars": extra or None}
    from testbed import deadman

    deadman.touch(name)
    if json_out:
        result = setup_mod.apply(name, **kw)
    else:
        from testbed.cli import setup_view

        result = setup_view.apply_with_progress(name, console=console(), **kw)
    image = None
    if bake and result.ok and not result.error:
        from testbed.handle import Testbed
        from testbed.setup import images

        image = images.bake(Testbed.open(name, store()), profile=profile, suite=suite, extra_vars=extra or None)
    if json_out:
        sys.stdout.write(json.dumps({**result.to_dict(), **({"image": image} if bake else {})}, indent=2,
                                    default=str) + "\n")
    elif image is not None:
        from testbed.cli.images import baked_line

        console().print(baked_line(image))
    if result.error:
        raise TestbedError(result.error, where=result.artifact_dir or f"testbed {name}",
                           fix="read the Ansible output above; fix the role or the host, then run setup again")
    if not result.ok:
        raise typer.Exit(1)


def _extra_vars(items: list[str]) -> dict[str, Any]:
    """``--var key=value`` items as a mapping: a key that is no variable name, or one given twice, is refused."""
    from testbed.setup.profiles import VAR_RE

    extra: dict[str, Any] = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        k = k.strip()
        if not sep or not VAR_RE.fullmatch(k):
            raise UsageError(f"bad --var '{kv}'" + ("" if not sep else f": {k!r} is not a variable name"),
                             where="--var", fix="use --var key=value, the key made of letters, digits and _")
        if k in extra:
            raise UsageError(f"--var {k} is given twice ({extra[k]!r} and {v!r})", where="--var",
                             fix="give each variable once")
        extra[k] = v
    return extra


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

    if host is not None and not host.strip():
        raise UsageError("the host name is empty", where="command line",
                         fix=f"name a host (testbed ssh {name} HOST), or give none for the master")
    st = existing_store(readonly=False)
    _known_testbed(st, name)
    hosts = st.hosts(name)
    names = [h.name for h in hosts]
    host = host if host is not None else next((h.name for h in hosts if "master" in h.groups),
                                              names[0] if names else None)
    if host is None or host not in names:
        from testbed.setup.profiles import closest

        raise UsageError(f"no host '{host}' in testbed '{name}'", where="command line",
                         fix=f"{closest(host or '', names)}hosts: {', '.join(names) or 'none'}")
    from testbed import deadman

    deadman.touch(name)
    remote.interactive(name, host, " ".join(command) if command else None)


def extend(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
           hours: Annotated[float | None, typer.Option("--hours", help="Hours to add to the lease and to the "
                                                                     "expiry.")] = None,
           expire: Annotated[str | None, typer.Option("--expire", help="A new expiry, this long from now (8h); "
                                                                        "a Chameleon lease ending earlier is "
                                                                        "moved too.")] = None,
           off: Annotated[bool, typer.Option("--off", help="Turn the dead-man's switch off: no expiry, no idle "
                                                           "limit (a lease still ends at its end).")] = False) -> None:
    """Move the testbed's expiry (the dead-man's switch's deadline) and the end of its lease (Chameleon).

    Example: testbed extend chameleon --hours 4
    """
    from testbed import deadman, expiry
    from testbed.providers.base import Capability

    if off:
        st = existing_store(readonly=False)
        _known_testbed(st, name)
        p = provider_for(name, st, recorded_ok=True)
        p.disarm_switch()
        st.update_testbed_info(name, expiry=None)
        console().print(f"{name}: dead-man's switch off (no expiry, no idle limit); "
                        f"'testbed provision {name} --expire 8h' sets one again")
        return
    if hours is None and expire is None:
        raise UsageError("give --hours or --expire", where="command line", fix=f"testbed extend {name} --hours 4")
    if hours is not None and not (math.isfinite(hours) and 0 < hours <= expiry.MAX_SECONDS / 3600):
        raise UsageError(f"cannot extend by {hours} hours", where="--hours",
                         fix=f"give a positive number of hours, at most {expiry.MAX_SECONDS // 3600}")
    _check_duration(expire, "--expire")
    st = existing_store(readonly=False)
    _known_testbed(st, name)
    p = provider_for(name, st)
    e = deadman.recorded(st, name)
    new_at = None
    if e is not None and e.expire_at is not None:
        new_at = time.time() + expiry.parse_duration(expire) if expire else e.expire_at + (hours or 0) * 3600
    elif expire:
        raise UsageError(f"testbed '{name}' has no expiry to move", where="command line",
                         fix=f"set one with 'testbed provision {name} --expire {expire}'")
    c = console()
    lease_hours = hours
    if p.can(Capability.EXTEND) and expire and new_at is not None:
        lease_hours = p.hours_short_of(new_at)
    if lease_hours and p.can(Capability.EXTEND):
        c.print(f"lease of {name} now ends at {p.extend(lease_hours)}")
    elif hours and new_at is None:
        raise UsageError(f"testbed '{name}' ({p.kind}) has no lease and no expiry to extend: "
                         f"{p.lacks(Capability.EXTEND) or 'no lease is recorded'}", where="command line",
                         fix="extend applies to testbeds with a reservation or an expiry (provision --expire)")
    if e is not None and new_at is not None:
        e.expire_at = new_at
        missed = deadman.refresh(st, name, moved=e)
        c.print(f"{name} now expires at {expiry.iso(new_at)}"
                + (f" (not told: {', '.join(missed)}; their old deadline stands)" if missed else ""))


def _check_duration(value: str | None, option: str) -> None:
    if value is None:
        return
    from testbed.expiry import parse_duration

    try:
        parse_duration(value)
    except ValueError as err:
        raise UsageError(f"bad {option}: {err}", where=option, fix=f"e.g. {option} 8h (s, m, h or d)") from None


def forget_host(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
                host: Annotated[str, typer.Argument(help="Host whose pinned key to forget.",
                                                    autocompletion=complete.hosts)]) -> None:
    """Forget a host's pinned SSH key (after it was really rebuilt); the next connection pins the new one.

    Example: testbed forget-host tesla ecetesla3
    """
    from testbed import ssh

    st = existing_store(readonly=False)
    _known_testbed(st, name)
    names = [h.name for h in st.hosts(name)]
    if host not in names:
        from testbed.setup.profiles import closest

        raise UsageError(f"no host '{host}' in testbed '{name}'", where="command line",
                         fix=f"{closest(host, names)}hosts: {', '.join(names) or 'none'}")
    ssh.forget_host_keys(name, [host])
    console().print(f"forgot the pinned key of {host}; the next connection trusts and pins its current key")


def list_default(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Testbeds defined in inventories/ and their state (--json here applies to the list that follows)."""
    if ctx.invoked_subcommand is None:
        list_testbeds(ctx, json_out)


def list_testbeds(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Testbed specs found in inventories/ (cwd first, then the shipped ones). Example: testbed list testbeds"""
    from testbed import paths

    json_out = json_wanted(ctx, json_out)
    st = existing_store()
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
        t.add_column(col, no_wrap=col == "name")  # a name is never cut in two
    for r in rows:
        t.add_row(r["name"], r["status"], r["spec"])
    console().print(t)


def list_profiles(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Set-up profiles (playbooks/profiles/) with their roles. Example: testbed list profiles"""
    from testbed import setup as setup_mod

    json_out = json_wanted(ctx, json_out)
    rows: list[dict[str, Any]] = []
    for name in setup_mod.available_profiles():
        plan = setup_mod.load_profile(name)
        rows.append({"name": name, "roles": plan.roles})
    if json_out:
        print_json({"profiles": rows, "roles": setup_mod.available_roles()})
        return
    from rich.table import Table

    t = Table(title="profiles", title_justify="left")
    t.add_column("profile", no_wrap=True)
    t.add_column("roles, in order")
    for r in rows:
        t.add_row(r["name"], ", ".join(r["roles"]))
    c = console()
    c.print(t)
    c.print("roles: " + ", ".join(setup_mod.available_roles()))


def list_runs(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Recent runs recorded in state. Example: testbed list runs"""
    json_out = json_wanted(ctx, json_out)
    runs = _recent_runs(existing_store(), limit=100)
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
