"""CLI commands for testbeds: provision, status, destroy, setup, exec, ssh, extend, forget-host and
``list [testbeds|profiles|runs]``. They call the providers, set-up and state, and render what those return.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from testbed.cli import complete, hot
from testbed.cli.common import JsonOpt, console, existing_store, json_wanted, print_json, store
from testbed.cli.hot import _hosts_table, _known_testbed, _print_runs, _recent_runs, progress_printer, resolve
from testbed.cli.output import Plain, escape
from testbed.errors import TestbedError, UsageError
from testbed.exitcodes import Exit
from testbed.resolved import Resolved
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
              for_suite: Annotated[str | None, typer.Option("--for", metavar="SUITE",
                                                            help="Refuse, before anything is rented, when this "
                                                                 "suite cannot run on the testbed (its providers).")
                                   ] = None,
              json_out: JsonOpt = False) -> None:
    """Create (or repair) the testbed's hosts and record them in state. Idempotent.

    Example: testbed provision local --expire 8h  |  testbed provision my-cloud --for my-suite
    """
    # lazy: testbed --help and completion load every command module
    from testbed import expiry, services

    if expire is not None:
        services.check_duration(expire, "--expire")
    if repair is not None and not repair.strip():
        raise UsageError("--repair names no host", where="--repair", fix=f"testbed provision {name} --repair HOST")
    if repair is not None and expire is not None:
        raise UsageError("--expire goes with provisioning, not with --repair", where="--expire",
                         fix=f"testbed extend {name} --expire {expire} moves the expiry")
    if repair is None and no_setup:
        raise UsageError("--no-setup goes with --repair", where="--no-setup",
                         fix=f"testbed provision {name} --repair HOST --no-setup")
    tb = resolve(name, store())
    if repair is not None:
        return _repair(tb, repair, not no_setup, json_out)
    done = services.provision(tb, expire=expire, progress=progress_printer(), for_suite=for_suite)
    release_at = expiry.iso(done.release_at) if done.release_at else None
    image = done.image
    if json_out:
        print_json({"testbed": tb.name, "provider": tb.kind, "seconds": done.seconds,
                     "hosts": [h.to_dict() for h in done.hosts], "release_at": release_at,
                     "image": {k: image[k] for k in ("key", "id", "plan")} if image else None})
        return
    c = console()
    if image:
        c.print(f"booted from image {image['id']} ({image['plan']}, key {image['key'][:12]}): 'testbed setup "
                f"{tb.name}' checks it and runs only the roles that depend on the other hosts")
    _hosts_table(Plain(), f"testbed {tb.name} ({tb.kind}): {plural(len(done.hosts), 'host')} up in "
                          f"{done.seconds:.1f} s", done.hosts)
    if release_at:
        c.print(f"released at {release_at} by its dead-man's switch ({done.switch}) unless extended "
                f"(testbed extend {tb.name} --expire 8h)")
    from shlex import quote

    # lazy: testbed --help and completion load every command module
    from testbed import ssh
    from testbed.cli.output import escape

    c.print(escape(f"ssh:     ssh -F {quote(str(ssh.ssh_config_path(tb.name)))} {done.hosts[0].name}")
            if done.hosts else "")
    c.print(escape(f"ansible: ansible -i {quote(str(ssh.inventory_path(tb.name)))} all -m ping"))


def _repair(tb: Resolved, host: str, setup: bool, json_out: bool) -> None:
    # lazy: testbed --help and completion load every command module
    from testbed import services

    c = console()
    done = services.repair(tb, host, setup=setup, progress=None if json_out else (lambda m: c.print(f"  {m}")))
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
    # lazy: testbed --help and completion load every command module
    from testbed import services

    st = existing_store(readonly=False)
    if not st.exists:  # no state here: an unknown name is refused before any is created to say so
        Resolved.open(name, st, recorded_ok=True)
        st = store()  # a known spec: destroy may still find what an interrupted provision made (by name)
    tb = resolve(name, st, recorded_ok=True)
    recorded = tb.record is not None or bool(st.resources(tb.name))
    if not yes and sys.stdin.isatty() and tb.provider().costs_money and recorded:  # nothing to lose: no question
        typer.confirm(f"destroy every cloud resource of testbed '{name}'?", abort=True)
    # lazy: testbed --help and completion load every command module
    from testbed.cli.output import waiting

    with waiting(f"destroying testbed {name}"):
        seconds = services.destroy(tb, progress_printer())
    if recorded:
        console().print(f"testbed {name} destroyed in {seconds:.1f} s")
    else:  # never "destroyed" of what did not exist
        console().print(f"testbed {name}: nothing to destroy (state records no host or resource of it here)")


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
          bake: Annotated[bool | None, typer.Option("--bake/--no-bake", help="Once the set-up passed, make an image "
                                                    "of a host keyed by its content address (new testbeds of this "
                                                    "set-up, and hosts repaired, boot from it). By default a testbed "
                                                    "whose images cost nothing (local) bakes one by itself.",
                                                    show_default=False)] = None,
          json_out: JsonOpt = False) -> None:
    """Apply Ansible roles to the testbed: a profile, a suite's profile, or single roles.

    Without options the testbed's default profile (its spec's `profile:`) is applied. Hosts whose recorded
    set-up matches what would be applied are skipped; --verify runs Ansible on them too and reports drift.
    Example: testbed setup local --profile local-suites
    """
    # lazy: testbed --help and completion load every command module
    from testbed import services

    given = [x for x in (profile, suite, role) if x]
    if len(given) > 1:
        raise UsageError("give only one of --profile, --suite, --role", where="command line",
                         fix="testbed setup local --profile local-suites")
    if limit is not None:  # the options first: a bad one is refused whatever state holds
        # lazy: testbed --help and completion load every command module
        from testbed.remote import selection

        selection(limit, "--limit")
    extra = _extra_vars(var or [])
    twice = next((r for i, r in enumerate(role or []) if r in (role or [])[:i]), None)
    if twice is not None:
        raise UsageError(f"--role {twice} is given twice", where="--role", fix="name each role once")
    if bake and (role or check):
        raise UsageError(f"--bake goes with a profile or a suite, not with {'--role' if role else '--check'}",
                         where="--bake", fix=f"testbed setup {name} --profile local-suites --bake")
    _known_testbed(existing_store(readonly=False), name)
    tb = Resolved.open(name, store(), need_spec=False)
    kw: dict[str, Any] = {"profile": profile, "suite": suite, "roles": role or None, "check": check, "verify": verify,
                          "limit": [limit] if limit is not None else None, "extra_vars": extra or None,
                          "sources": source or None, "bake": bake}
    if json_out:
        done = services.setup(tb, **kw)
    else:
        # lazy: testbed --help and completion load every command module
        from testbed.cli import setup_view

        with setup_view.live([h.name for h in tb.hosts], f"setup {name}", console()) as on_event:
            done = services.setup(tb, on_event=on_event, progress=lambda m: console().print(m, markup=False), **kw)
        console().print(setup_view.render_summary(done.result))
    result = done.result
    if json_out:
        sys.stdout.write(json.dumps({**result.to_dict(), **({"image": done.image} if bake or done.image else {}),
                                     **({"note": done.note} if done.note else {})}, indent=2, default=str) + "\n")
    else:
        # lazy: testbed --help and completion load every command module
        from testbed.cli.images import baked_line

        if done.image is not None:
            console().print(baked_line(done.image))
        if done.note:
            console().print(f"note: {done.note}", markup=False, highlight=False)
    if result.error:
        raise TestbedError(result.error, where=result.artifact_dir or f"testbed {name}",
                           fix="read the Ansible output above; fix the role or the host, then run setup again")
    if not result.ok:
        raise typer.Exit(Exit.FAILED)


def _extra_vars(items: list[str]) -> dict[str, Any]:
    """``--var key=value`` items as a mapping: a key that is no variable name, or one given twice, is refused."""
    # lazy: testbed --help and completion load every command module
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
    # lazy: testbed --help and completion load every command module
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
        # lazy: testbed --help and completion load every command module
        from testbed.setup.profiles import closest

        raise UsageError(f"no host '{host}' in testbed '{name}'", where="command line",
                         fix=f"{closest(host or '', names)}hosts: {', '.join(names) or 'none'}")
    # lazy: testbed --help and completion load every command module
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
    # lazy: testbed --help and completion load every command module
    from testbed import expiry, services

    if off:
        _known_testbed(existing_store(readonly=False), name)
        services.disarm(resolve(name, store(), recorded_ok=True))
        console().print(f"{name}: dead-man's switch off (no expiry, no idle limit); "
                        f"'testbed provision {name} --expire 8h' sets one again")
        return
    if hours is not None and not math.isfinite(hours):
        raise UsageError(f"cannot extend by {hours} hours", where="--hours",
                         fix=f"give a positive number of hours, at most {expiry.MAX_SECONDS // 3600}")
    if hours is None and expire is None:
        raise UsageError("give --hours or --expire", where="command line", fix=f"testbed extend {name} --hours 4")
    if expire is not None:
        services.check_duration(expire, "--expire")
    _known_testbed(existing_store(readonly=False), name)
    done = services.extend(resolve(name, store()), hours=hours, expire=expire)
    c = console()
    if done.lease_end:
        c.print(f"lease of {name} now ends at {done.lease_end}")
    if done.expire_at is not None:
        c.print(f"{name} now expires at {expiry.iso(done.expire_at)}"
                + (f" (not told: {', '.join(done.missed)}; their old deadline stands)" if done.missed else ""))


def forget_host(name: Annotated[str, typer.Argument(help="Testbed name.", autocompletion=complete.testbeds)],
                host: Annotated[str, typer.Argument(help="Host whose pinned key to forget.",
                                                    autocompletion=complete.hosts)]) -> None:
    """Forget a host's pinned SSH key (after it was really rebuilt); the next connection pins the new one.

    Example: testbed forget-host my-lab node3
    """
    # lazy: testbed --help and completion load every command module
    from testbed import ssh

    st = existing_store(readonly=False)
    _known_testbed(st, name)
    names = [h.name for h in st.hosts(name)]
    if host not in names:
        # lazy: testbed --help and completion load every command module
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
    # lazy: testbed --help and completion load every command module
    from testbed import paths

    json_out = json_wanted(ctx, json_out)
    st = existing_store()
    rows = []
    for name, p in paths.list_resources("inventories").items():
        tb = st.testbed(name)
        row = {"name": name, "spec": str(p), "status": tb["status"] if tb else "not provisioned"}
        problem = _spec_problem(p)
        if problem is not None:  # a spec that cannot be provisioned as it stands: never just 'not provisioned'
            import re

            unset = re.match(r"environment variable (\S+) is not set", problem)
            what = f"needs ${unset.group(1)}" if unset else "broken spec"
            row["status"] = what if tb is None else f"{row['status']}; {what}"
            row["problem"] = problem
        rows.append(row)
    if json_out:
        print_json(rows)
        return
    from rich.table import Table

    t = Table(title="testbeds", title_justify="left")
    for col in ("name", "status", "spec"):
        t.add_column(col, no_wrap=col == "name")  # a name is never cut in two
    for r in rows:
        t.add_row(r["name"], r["status"] if "problem" not in r else f"[red]{escape(r['status'])}[/red]", r["spec"])
    c = console()
    c.print(t)
    for r in rows:
        if "problem" in r:
            c.print(f"[red]{escape(r['name'])}[/red]: {escape(r['problem'])}")


def _spec_problem(path: Path) -> str | None:
    """Why the spec at ``path`` would be refused (its first problem, with file:line), or None when it loads."""
    # lazy: testbed --help and completion load every command module
    from testbed.spec import load_testbed

    try:
        load_testbed(str(path))
    except TestbedError as e:
        return e.what + (f" ({e.where})" if e.where and e.where not in e.what else "")
    return None


def list_profiles(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Set-up profiles (playbooks/profiles/) with their roles. Example: testbed list profiles"""
    # lazy: testbed --help and completion load every command module
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
