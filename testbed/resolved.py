"""The resolved testbed: its spec, its state record, its hosts, its files and its provider.

A command resolves the testbed it names once, where it starts (the CLI, a script, a notebook, the supervisor of a
run), and passes this record down to the stages; nothing below the edge looks the testbed up again or opens the
state store on its own. It imports no stage: the stages take it, and the Python API (:mod:`testbed.handle`)
extends it with the verbs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from testbed import paths
from testbed.errors import TestbedError, UsageError

if TYPE_CHECKING:
    from testbed.hosts import Host
    from testbed.providers.base import Progress, Provider
    from testbed.spec import TestbedSpec
    from testbed.state import Store, TestbedRow


@dataclass
class Resolved:
    """A testbed as this state home knows it; ``spec`` is None only for a recorded testbed whose spec is gone."""

    __test__ = False

    name: str
    store: Store
    spec: TestbedSpec | None
    record: TestbedRow | None  # the state row (None: never provisioned here)
    notes: list[str] = field(default_factory=list)  # what the resolution had to work around, for the user

    @classmethod
    def open(cls, name: str, store: Store | None = None, *, recorded_ok: bool = False,
             need_spec: bool = True) -> Self:
        """Resolve testbed ``name`` (or a spec path) against this state home.

        The spec is found by name, else read from the file it was provisioned from. ``recorded_ok``: when that
        spec no longer loads (edited, deleted, an unset variable), use the copy recorded at provision (destroy
        must work from state alone), saying so in ``notes``. ``need_spec=False``: a recorded testbed may have
        no spec at all (set-up and runs work from the recorded hosts).
        """
        # lazy: start-up (testbed status and exec load this module)
        from testbed.spec import TestbedSpec, load_testbed
        from testbed.state import Store

        st = store or Store.open_default()
        key = Path(name).stem if name.endswith((".yml", ".yaml")) else name
        rec = st.testbed(key)
        src = rec["spec_path"] if rec is not None else None
        try:  # by name (as every command finds it), else the file it was provisioned from (another directory)
            try:
                spec: TestbedSpec | None = load_testbed(name)
            except UsageError:
                if not (src and key == name and Path(src).is_file()):
                    raise
                spec = load_testbed(src)
        except TestbedError as e:
            copy = rec["info"].get("spec") if recorded_ok and rec is not None else None
            if copy:
                try:
                    spec = TestbedSpec.model_validate(copy)
                except ValueError:  # a copy this version cannot read: the spec's own error is the one to show
                    raise e from None
                spec.source = src
                return cls(spec.name, st, spec, rec, [f"the spec of '{key}' does not load ({e.what}); using the "
                                                      "copy recorded when it was provisioned"])
            if rec is None or need_spec or not isinstance(e, UsageError):
                raise
            spec = None
        if spec is not None:
            rec = _claim(st, spec) if spec.name != key else rec
            _check_claim(spec, rec)
        return cls(spec.name if spec else key, st, spec, rec)

    @property
    def kind(self) -> str:
        return str(self.record["provider"]) if self.record else self.spec.kind if self.spec else ""

    @property
    def hosts(self) -> list[Host]:
        return self.store.hosts(self.name)

    @property
    def info(self) -> dict[str, Any]:
        """What the provider recorded (bridge, subnet, zone, lease...)."""
        return dict(self.record["info"] or {}) if self.record is not None else {}

    @property
    def subnet(self) -> str | None:
        """The hosts' subnet: as recorded at provision, else as the spec plans it."""
        sub = self.info.get("subnet") or (self.spec.provider.planned_subnet() if self.spec else None)
        return str(sub) if sub else None

    @property
    def dir(self) -> Path:
        """Its files on this machine: key pair, known_hosts, ssh_config, inventory."""
        return paths.testbed_dir(self.name)

    def provider(self, progress: Progress | None = None) -> Provider:
        """Its provider (the cloud SDK is imported only when a method needs it)."""
        # lazy: start-up (testbed status and exec load this module)
        from testbed.providers import provider_class

        if self.spec is None:
            raise UsageError(f"testbed '{self.name}' has no spec to act on", where=f"inventories/{self.name}.yml",
                             fix=f"restore inventories/{self.name}.yml")
        if progress is None:
            return provider_class(self.spec.kind)(self.spec, self.store)
        return provider_class(self.spec.kind)(self.spec, self.store, progress)


def _claim(store: Store, spec: TestbedSpec) -> TestbedRow | None:
    """The record of the testbed a spec names when its ``name:`` is not its file's (``inventories/a.yml`` saying
    ``name: b``); refused when another spec file is testbed ``b``'s own."""
    own = paths.find_resource("inventories", f"{spec.name}.yml")
    if own is not None and spec.source and own.resolve() != Path(spec.source).resolve():
        raise UsageError(f"two spec files are testbed '{spec.name}': {spec.source} (by its name:) and {own}",
                         where=_name_at(spec), fix=f"remove 'name: {spec.name}' from {spec.source} (a spec is "
                                                           "the testbed its file is named after), or rename one")
    return store.testbed(spec.name)


def _check_claim(spec: TestbedSpec, rec: TestbedRow | None) -> None:
    """Refuse a spec that would take over the record of another testbed of its name: one of another provider, or
    one provisioned from another spec file that still exists (its lease, nodes and keys would be lost)."""
    if rec is None or not spec.source:
        return
    src = str(rec.get("spec_path") or "")
    other_file = bool(src) and Path(src).is_file() and Path(src).resolve() != Path(spec.source).resolve()
    renamed = Path(spec.source).stem != spec.name
    if rec.get("provider") != spec.kind or (other_file and renamed):
        raise UsageError(f"testbed '{spec.name}' is recorded as a {rec.get('provider')} testbed provisioned from "
                         f"{src or 'another spec'}; {spec.source} ({spec.kind}) would take over its record",
                         where=_name_at(spec), fix=f"give this spec its own name, or destroy '{spec.name}' "
                                                           f"first (testbed destroy {spec.name})")


def _name_at(spec: TestbedSpec) -> str:
    """``file:line`` of the spec's ``name:`` (of its provider when it has none)."""
    # lazy: start-up (testbed status and exec load this module)
    from testbed import yamlfile

    located = yamlfile.load(Path(str(spec.source)))[1]
    line = located.line(("name",)) if "name" in (located.root or {}) else located.line(("provider",))
    return f"{spec.source}:{line}" if line else str(spec.source)
