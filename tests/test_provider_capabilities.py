"""Providers declare what they can do; nothing outside providers/ decides by a provider's name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from localbed import invoke

from testbed.capabilities import OFFERS, Capability, CutsNetwork, KillsHosts, Repairs, RepairsFromImage
from testbed.errors import UsageError
from testbed.providers import COSTS_MONEY, KEEPS_HOSTS, PROVIDERS, provider_class
from testbed.providers.base import Provider

OPS = {Capability.EXTEND: "extend", Capability.KILL_HOST: "kill_host", Capability.CUT_NETWORK: "cut_network",
       Capability.REPAIR: "discard"}


def _refused(match: str, name: str, bases: tuple[type, ...], ns: dict[str, object]) -> None:
    """A class the provider base refuses when it is made. ``type`` registers it with its bases before the refusal,
    and, half made, it shares ``Provider``'s ABC cache: until it is collected, ``issubclass(LabProvider, KillsHosts)``
    could read that cache and say yes. It is collected at once."""
    import gc

    with pytest.raises(TypeError, match=match):
        type(name, bases, ns)
    gc.collect()
    assert all(c.__name__ != name for base in bases for c in base.__subclasses__())


def test_declared_capabilities_match_what_each_provider_implements() -> None:
    for kind in PROVIDERS:
        cls = provider_class(kind)  # no cloud SDK is imported for this
        assert cls.kind == kind
        for cap, meth in OPS.items():
            assert (cap in cls.capabilities) == hasattr(cls, meth) == issubclass(cls, OFFERS[cap]), (kind, cap)
    assert provider_class("chameleon").costs_money and provider_class("gcp-tpu").costs_money
    assert COSTS_MONEY == {k for k in PROVIDERS if provider_class(k).costs_money}  # the registry's copy
    assert KEEPS_HOSTS == {k for k in PROVIDERS if provider_class(k).keeps_hosts} == {"lab"}
    local = provider_class("local")
    assert not local.costs_money and local.offline_hosts and local.shares_controller_files
    assert not provider_class("lab").offline_hosts


def test_a_provider_is_its_package_registered_where_it_is_defined() -> None:
    """Every kind comes from its package's registration; the lists, the settings union a spec is validated
    against and each kind's `testbed check` are derived from it, and its class carries what it registered."""
    from typing import get_args

    from testbed.providers import COUNTS_HOURS, REGISTRY, settings_class
    from testbed.providers.kinds import ProviderSettings
    from testbed.providers.usable import KINDS

    assert list(REGISTRY) == list(KINDS) == list(PROVIDERS) == ["local", "lab", "chameleon", "gcp-tpu", "slurm"]
    union = set(get_args(get_args(ProviderSettings)[0]))
    assert union == {settings_class(k) for k in REGISTRY}  # the one hand-kept union (for the type checker)
    for kind, reg in REGISTRY.items():
        assert reg.package == f"testbed.providers.{reg.package.rsplit('.', 1)[1]}"
        assert settings_class(kind).model_fields["kind"].default == kind
        cls = provider_class(kind)
        assert (cls.costs_money, cls.counts_hours, cls.keeps_hosts) == (reg.costs_money, reg.counts_hours,
                                                                           reg.keeps_hosts)
        assert (Path(__file__).parents[1] / reg.package.replace(".", "/") / "usable.py").is_file()
    assert COUNTS_HOURS == {"slurm"}


def test_only_a_provider_whose_images_cost_nothing_bakes_by_itself() -> None:
    """A provider bakes an image at the first set-up by itself only where it keeps images and nothing bills for
    them; it repairs from one only where it repairs at all."""
    for kind in PROVIDERS:
        cls = provider_class(kind)
        if cls.bakes_by_itself:
            assert not cls.costs_money and cls.can(Capability.IMAGES), kind
        if cls.can(Capability.REPAIR_FROM_IMAGE):
            assert Capability.REPAIR in cls.capabilities and cls.can(Capability.IMAGES), kind
    assert provider_class("local").bakes_by_itself and provider_class("local").can("repair-from-image")
    assert not provider_class("chameleon").bakes_by_itself


def test_an_inconsistent_image_capability_is_refused_when_the_class_is_made() -> None:
    """Repair from an image needs images and repair; baking by itself needs images that cost nothing."""
    _refused("repair-from-image needs", "Half", (Provider, Repairs, RepairsFromImage),
             {"discard": lambda self, host: [host.name]})
    _refused("bakes them by itself", "Baker", (Provider,), {"bakes_by_itself": True})



def test_a_capability_is_the_one_signal_checked_against_the_methods_when_the_class_is_made() -> None:
    """A capability is an interface (testbed.capabilities), registered where it is defined: inheriting it offers
    the capability and means implementing its methods; implementing them means inheriting it."""
    _refused("offers kill-host but does not implement kill_host", "Boasts", (Provider, KillsHosts), {})
    _refused("offers cut-network but does not implement restore_network", "Half", (Provider, CutsNetwork),
             {"cut_network": lambda self, host: None})
    _refused("implements cut_network but does not offer cut-network", "Quiet", (Provider,),
             {"cut_network": lambda self, host: None})
    assert set(OFFERS) == set(Capability)  # every capability is an interface
    assert type("Able", (Provider, KillsHosts), {"kill_host": lambda self, host: None}).capabilities == {"kill-host"}
    for kind in PROVIDERS:
        cls = provider_class(kind)
        for cap, iface in OFFERS.items():
            assert cls.can(cap) == issubclass(cls, iface), (kind, cap)
            if methods := iface.__abstractmethods__:  # RepairsFromImage is a mark, with no methods of its own
                assert all(hasattr(cls, m) and not getattr(getattr(cls, m), "__isabstractmethod__", False)
                           for m in methods) == cls.can(cap), (kind, cap)


def test_capabilities_keep_the_words_of_state_and_suites() -> None:
    """A fault's action (``kill-host``) and what callers ask (``can("expire")``) are the enum's values."""
    assert {c.value for c in Capability} == {"extend", "repair", "expire", "kill-host", "cut-network", "images",
                                             "repair-from-image"}
    local = provider_class("local")
    assert local.can("kill-host") and local.can(Capability.CUT_NETWORK) and not local.can("extend")
    assert "kill-host" in local.capabilities  # a StrEnum member is its string


def test_every_capability_a_kind_lacks_comes_with_its_reason() -> None:
    for kind in PROVIDERS:
        cls = provider_class(kind)
        assert not set(cls.lacking) & cls.capabilities, kind  # a reason only for what it lacks
        for cap in Capability:
            why = cls.lacks(cap)
            assert (why is None) == (cap in cls.capabilities), (kind, cap)
            assert why is None or len(why) > 20, (kind, cap, why)
            assert cls.lacks(cap.value) == why
    assert provider_class("lab").lacks(Capability.EXPIRE) == "a lab's hosts are not ours to end: expiry is not offered"
    assert "time limit" in (provider_class("slurm").lacks(Capability.EXTEND) or "")


def test_extend_on_a_kind_without_a_reservation_says_why(tb_home: Path) -> None:
    """The refusal names the kind's own reason: one message, exit 2."""
    from testbed.handle import Testbed
    from testbed.state import Store

    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab1.yml").write_text("provider:\n  kind: lab\n  hosts:\n    - {name: a, address: "
                                                     "127.0.0.1}\n")
    Testbed.open("lab1", Store.open_default()).provider().record_testbed("up", {})
    _, _, exc = invoke("extend", "lab1", "--hours", "1")
    assert isinstance(exc, UsageError), exc  # the entry point shows it as one message and exits 2
    assert exc.what == ("testbed 'lab1' (lab) has no lease and no expiry to extend: a lab's machines are held by no "
                        "reservation of testbed's")


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


def test_an_operation_on_a_provider_without_its_interface_is_one_error_with_the_kinds_reason() -> None:
    """What a caller gets where it did not ask ``can`` first: the kind's own reason, never an AttributeError."""
    from types import SimpleNamespace

    from testbed import fault_kinds
    from testbed.errors import TestbedError

    lab = provider_class("lab")
    p = lab.__new__(lab)
    p.spec = SimpleNamespace(name="tb1")  # type: ignore[assignment]
    err = p.cannot(Capability.KILL_HOST)
    assert err.what == f"testbed 'tb1' (lab) cannot kill-host: {lab.lacks('kill-host')}" and err.fix

    class Fire:
        def provider(self) -> Provider:
            return p

    with pytest.raises(TestbedError, match="cannot kill-host"):
        fault_kinds.get("kill-host").fire(Fire(), SimpleNamespace(host="h1", name="f1"))  # type: ignore[arg-type]
    # Offer.of: the provider itself where it offers the operation, the same error where it does not
    local = provider_class("local")
    q = local.__new__(local)
    assert KillsHosts.of(q) is q and CutsNetwork.of(q) is q
    with pytest.raises(TestbedError) as e:
        KillsHosts.of(p)
    assert e.value.what == err.what
