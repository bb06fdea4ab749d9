"""Providers declare what they can do; nothing outside providers/ decides by a provider's name."""

from __future__ import annotations

import re
from pathlib import Path

from testbed.providers import COSTS_MONEY, KEEPS_HOSTS, PROVIDERS, provider_class
from testbed.providers.base import Provider

OPS = {"extend": "extend", "kill-host": "kill_host", "cut-network": "cut_network", "repair": "discard"}


def test_declared_capabilities_match_what_each_provider_implements() -> None:
    for kind in PROVIDERS:
        cls = provider_class(kind)  # no cloud SDK is imported for this
        assert cls.kind == kind
        for cap, meth in OPS.items():
            assert (cap in cls.capabilities) == (getattr(cls, meth) is not getattr(Provider, meth)), (kind, cap)
    assert provider_class("chameleon").costs_money and provider_class("gcp-tpu").costs_money
    assert COSTS_MONEY == {k for k in PROVIDERS if provider_class(k).costs_money}  # the registry's copy
    assert KEEPS_HOSTS == {k for k in PROVIDERS if provider_class(k).keeps_hosts} == {"lab"}
    local = provider_class("local")
    assert not local.costs_money and local.offline_hosts and local.shares_controller_files
    assert not provider_class("lab").offline_hosts


def test_no_module_outside_providers_tests_a_provider_kind() -> None:
    pkg = Path(__file__).resolve().parents[1] / "testbed"
    kinds = "|".join(re.escape(k) for k in PROVIDERS)
    pat = re.compile(rf"""(?:kind|provider)\w*\s*(?:==|!=|in)\s*\(?[^)\n]*["'](?:{kinds})["']""")
    found = [f"{p.relative_to(pkg)}:{i}: {ln.strip()}" for p in pkg.rglob("*.py") if "providers" not in p.parts
             for i, ln in enumerate(p.read_text().splitlines(), 1) if pat.search(ln)]
    assert not found, "\n".join(found)


def test_no_module_outside_providers_names_a_provider_kind() -> None:
    """Not even as a string: kinds, their settings and their facts live in providers/ (the default testbed's
    *name* is one constant)."""
    pkg = Path(__file__).resolve().parents[1] / "testbed"
    kinds = "|".join(re.escape(k) for k in PROVIDERS)
    pat = re.compile(rf"""["'](?:{kinds})["']""")
    found = [f"{p.relative_to(pkg)}:{i}: {ln.strip()}" for p in pkg.rglob("*.py") if "providers" not in p.parts
             for i, ln in enumerate(p.read_text().splitlines(), 1)
             if pat.search(ln) and not ln.startswith("DEFAULT_TESTBED = ")]
    assert not found, "\n".join(found)
