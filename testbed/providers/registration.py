"""A provider registers itself in its own package's ``__init__.py`` (``PROVIDER = Registration(...)``): its kind,
where its provider class, settings and ``testbed check`` live, what it costs and keeps, and the extra it needs.
:mod:`testbed.providers` finds every package that does and derives its lists from them.

Pure data, standard library only: finding the providers imports no provider, no settings model and no SDK.
"""

from __future__ import annotations

from typing import NamedTuple


class Extra(NamedTuple):
    """The pip extra a provider needs: its name, the modules it brings, the distribution whose version is shown."""

    name: str
    modules: tuple[str, ...]
    dist: str


class Registration(NamedTuple):
    """One provider kind, as its package declares it (``package``: that package's ``__name__``)."""

    package: str
    kind: str
    provider: str  # its Provider class, in <package>.provider
    settings: str  # its settings model (the spec's ``provider:`` block), in <package>.settings
    order: int  # where lists show it (`testbed check`, completion): the free local one first
    costs_money: bool = False  # its resources bill while held (destroy asks first at a terminal)
    counts_hours: bool = False  # no money, but node-hours counted against an account (the ledger shows them)
    keeps_hosts: bool = False  # destroy leaves the hosts and their files (lab machines): never remade
    extra: Extra | None = None  # None: it needs nothing beyond testbed itself

    @property
    def provider_path(self) -> str:
        return f"{self.package}.provider:{self.provider}"

    @property
    def settings_path(self) -> str:
        return f"{self.package}.settings:{self.settings}"

    @property
    def check_path(self) -> str:
        """Its ``testbed check``: ``check(report, spec, quotas)`` in <package>.usable."""
        return f"{self.package}.usable:check"
