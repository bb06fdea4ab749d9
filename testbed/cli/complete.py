"""Shell completion of names: testbeds, suites, profiles, runs and hosts, from the shipped and working-directory
files and from state. Each runs on every TAB: only paths and SQLite are imported, and a failure completes
nothing rather than printing an error into the user's prompt."""

from __future__ import annotations

from typing import Any


def _safe(fn: Any) -> Any:
    """``fn`` with its signature (Typer passes ``ctx``/``incomplete`` by name), returning [] on any error."""
    import functools

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> list[str]:
        try:
            return list(fn(*args, **kwargs))
        except Exception:  # a broken spec or state must never break the user's shell
            return []

    return wrapped


def _starting(names: Any, incomplete: str) -> list[str]:
    return sorted(n for n in set(names) if n.startswith(incomplete))


def _state() -> Any:
    """This state home's store, read-only, when it exists (completing never creates or migrates one)."""
    # lazy: testbed --help and completion load every command module
    from testbed.state import Store

    st = Store.open_existing()
    return st if st.exists else None


@_safe
def testbeds(incomplete: str) -> list[str]:
    """Testbeds with a spec here or in the package, and those in state."""
    # lazy: testbed --help and completion load every command module
    from testbed import paths

    names = set(paths.list_resources("inventories"))
    st = _state()
    if st is not None:
        names |= {t["name"] for t in st.testbeds()}
    return _starting(names, incomplete)


@_safe
def suites(incomplete: str) -> list[str]:
    # lazy: testbed --help and completion load every command module
    from testbed import paths

    return _starting(paths.list_suite_files(), incomplete)


@_safe
def profiles(incomplete: str) -> list[str]:
    # lazy: testbed --help and completion load every command module
    from testbed import paths

    return _starting(paths.list_resources("playbooks", "profiles/*.yml"), incomplete)


@_safe
def runs(incomplete: str) -> list[str]:
    st = _state()
    return _starting(st.run_ids(), incomplete) if st is not None else []


@_safe
def testbeds_or_runs(incomplete: str) -> list[str]:
    return sorted({*testbeds(incomplete), *runs(incomplete)})


@_safe
def hosts(ctx: Any, incomplete: str) -> list[str]:
    """Hosts of the testbed named earlier on the command line (as state records them)."""
    name = (ctx.params or {}).get("name")
    st = _state()
    if not name or st is None:
        return []
    return _starting((h.name for h in st.hosts(name)), incomplete)


@_safe
def providers_or_testbeds(incomplete: str) -> list[str]:
    """Provider kinds (``testbed check``) and testbed names."""
    # lazy: testbed --help and completion load every command module
    from testbed.providers import PROVIDERS

    return sorted({*_starting(PROVIDERS, incomplete), *testbeds(incomplete)})


@_safe
def faults(ctx: Any, incomplete: str) -> list[str]:
    """The faults of the suite named earlier on the command line (``run SUITE --fault ...``): its ``faults:`` keys,
    read from the file as it is (a suite that needs an unset variable still completes)."""
    from ruamel.yaml import YAML

    # lazy: testbed --help and completion load every command module
    from testbed.suite import suite_path

    # while an option's value is being completed, Click leaves the positional arguments unparsed in ctx.args
    name = (ctx.params or {}).get("suite") or next((a for a in ctx.args or () if not a.startswith("-")), None)
    if not name or str(name).startswith("git+"):  # completing never fetches from the network
        return []
    data = YAML(typ="safe").load(suite_path(str(name)).read_text(encoding="utf-8"))
    declared = data.get("faults") if isinstance(data, dict) else None
    given = set((ctx.params or {}).get("fault") or ())  # each fault is named once
    return _starting((str(k) for k in declared or {} if str(k) not in given), incomplete)
