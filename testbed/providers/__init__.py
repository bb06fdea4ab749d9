"""Provider registry, derived from the providers themselves: every package here whose ``__init__.py`` declares
``PROVIDER = Registration(...)`` (:mod:`testbed.providers.registration`) is a provider kind. Finding them imports
only those declarations; a provider's module is imported when it is used, so cloud SDKs never load for other
commands. A new provider is a package here: nothing else names it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from testbed.providers.registration import Registration

if TYPE_CHECKING:
    from testbed.providers.base import Provider


def _registered() -> dict[str, Registration]:
    found = []
    for m in pkgutil.iter_modules(__path__):
        if m.ispkg:
            reg = getattr(importlib.import_module(f"{__name__}.{m.name}"), "PROVIDER", None)
            if isinstance(reg, Registration):
                found.append(reg)
    return {r.kind: r for r in sorted(found, key=lambda r: (r.order, r.kind))}


REGISTRY: dict[str, Registration] = _registered()
"""kind -> its registration, in the order lists show them."""

PROVIDERS: dict[str, str] = {k: r.provider_path for k, r in REGISTRY.items()}
"""kind -> ``module:Class`` of its provider."""

COSTS_MONEY = frozenset(k for k, r in REGISTRY.items() if r.costs_money)
"""The providers whose resources bill while held: what the ledger asks for a cost without importing a provider."""

COUNTS_HOURS = frozenset(k for k, r in REGISTRY.items() if r.counts_hours)
"""The providers whose resources cost no money but are counted (a Slurm allocation's node-hours, charged to an
account's fair share): the ledger shows their ``cost`` too."""

KEEPS_HOSTS = frozenset(k for k, r in REGISTRY.items() if r.keeps_hosts)
"""The providers whose destroy leaves the hosts, and the files on them, as they were: for every other one, a
testbed destroyed and provisioned again has new hosts, so the files of its earlier runs are gone (what collect
tells a user)."""


def _load(path: str) -> object:
    mod_name, name = path.split(":")
    return getattr(importlib.import_module(mod_name), name)


def provider_class(kind: str) -> type[Provider]:
    """The Provider class for ``kind`` (imports only that provider's module)."""
    return _load(REGISTRY[kind].provider_path)  # type: ignore[return-value]


def settings_class(kind: str) -> type:
    """The settings model of ``kind`` (its spec's ``provider:`` block; pure data)."""
    return _load(REGISTRY[kind].settings_path)  # type: ignore[return-value]
