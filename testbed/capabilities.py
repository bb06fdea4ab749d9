"""The optional operations a provider may offer, each one interface: a provider class that inherits it offers
its capability (``Provider.capabilities`` is derived from them, never written by hand), and the type checker
lets a caller use its methods only on a provider narrowed to it (:meth:`Offer.of`).

Pure interfaces, no provider code: core modules (fault kinds, the spec) and the providers' floor both read them.
The lifecycle every provider implements (create, wait, query, release) is ``testbed.providers.base.Lifecycle``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

if TYPE_CHECKING:
    from testbed.expiry import Expiry
    from testbed.hosts import Host


class Capability(StrEnum):
    """An optional operation a provider may offer; the values are the words that state, suites (a fault's
    ``action``) and the command line use."""

    EXTEND = "extend"  # move the end of the testbed's reservation (``extend``)
    REPAIR = "repair"  # bring one failed host back: ``discard`` it, then ``create`` makes it again
    EXPIRE = "expire"  # a dead-man's switch releases the testbed at its expiry (testbed.deadman)
    KILL_HOST = "kill-host"  # power a host off abruptly (a fault: ``kill_host``)
    CUT_NETWORK = "cut-network"  # take a host off the network and back (a fault: ``cut_network``)
    IMAGES = "images"  # bake an image of a host's set-up and boot new hosts from it (``bake_image``)
    REPAIR_FROM_IMAGE = "repair-from-image"  # ``repair`` brings a host back on a new disk from such an image


CANNOT = {
    Capability.EXTEND: "it holds no reservation whose end could move",
    Capability.REPAIR: "it has no way to bring one host back",
    Capability.EXPIRE: "testbed cannot release its hosts at a deadline",
    Capability.KILL_HOST: "it cannot power a host off",
    Capability.CUT_NETWORK: "it cannot take a host off the network",
    Capability.IMAGES: "this provider cannot bake images of a set-up",
    Capability.REPAIR_FROM_IMAGE: "it brings a lost host back as it was, not on a new disk from an image",
}
"""Why a provider lacks a capability when its class gives no reason of its own (``Provider.lacking``)."""


class Refuses(Protocol):
    """What :meth:`Offer.of` needs of a provider: the error for a capability it lacks (``Provider.cannot``)."""

    def cannot(self, capability: Capability) -> Exception: ...


class Offer(ABC):
    """An optional operation's interface; ``capability`` names it."""

    capability: ClassVar[Capability]

    @classmethod
    def of(cls: type[OfferT], p: Refuses) -> OfferT:
        """``p`` narrowed to this interface, to call its operation (``KillsHosts.of(p).kill_host(h)``); else
        ``p``'s error saying it lacks the capability (the last word: callers ask ``can`` first, where a user would
        see a refusal)."""
        if isinstance(p, cls):
            return p
        raise p.cannot(cls.capability)


OFFERS: dict[Capability, type[Offer]] = {}
"""Each capability's interface, registered where it is defined."""

OfferT = TypeVar("OfferT", bound=Offer)


def offer(cls: type[OfferT]) -> type[OfferT]:
    """Register an interface as its capability's one signal."""
    OFFERS[cls.capability] = cls
    return cls




@offer
class Extends(Offer):
    capability = Capability.EXTEND

    @abstractmethod
    def extend(self, hours: float) -> str:
        """Move the end of the testbed's reservation ``hours`` later; the new end (ISO UTC)."""


@offer
class Repairs(Offer):
    capability = Capability.REPAIR

    @abstractmethod
    def discard(self, host: Host) -> list[str]:
        """Take away what serves a failed ``host`` so that ``create`` makes it anew; the hosts that go with it (a
        TPU slice's workers). Nothing to take away where the host comes back by itself (a reboot)."""


@offer
class KillsHosts(Offer):
    capability = Capability.KILL_HOST

    @abstractmethod
    def kill_host(self, host: str) -> None:
        """Power ``host`` off abruptly (a fault)."""


@offer
class CutsNetwork(Offer):
    capability = Capability.CUT_NETWORK

    @abstractmethod
    def cut_network(self, host: str) -> None:
        """Take ``host`` off the network (a fault); ``restore_network`` undoes it."""

    @abstractmethod
    def restore_network(self, host: str) -> None:
        """Undo ``cut_network``."""


@offer
class BakesImages(Offer):
    capability = Capability.IMAGES

    @abstractmethod
    def bake_image(self, host: str, key: str, record: str,
                   note: Callable[[str, str], None] | None = None) -> dict[str, Any]:
        """Capture what set-up changed on ``host`` as an image holding ``record`` (the image's own record); its
        ``id``, ``location``, ``size`` (bytes) and provider ``info``. ``note(id, location)`` records a cloud's
        image the moment its id comes back, before waiting on it."""

    @abstractmethod
    def delete_image(self, image: Mapping[str, Any]) -> None:
        """Delete one recorded image (a row of state's images) where it lives."""


@offer
class RepairsFromImage(Offer):
    """``repair`` brings a host back on a new disk from an image of its set-up (needs Repairs and BakesImages)."""

    capability = Capability.REPAIR_FROM_IMAGE


@offer
class Expires(Offer):
    """A dead-man's switch releases the testbed at its expiry, with no controller running (testbed.deadman)."""

    capability = Capability.EXPIRE

    def check_switch(self, expiry: Expiry) -> None:
        """Refuse (before anything is made) an expiry this provider's switch cannot enforce as asked."""
        return None

    @abstractmethod
    def arm_switch(self, hosts: list[Host], expiry: Expiry) -> Expiry:
        """Put the switch in place for ``expiry``; the expiry as armed."""

    @abstractmethod
    def disarm_switch(self) -> None:
        """Before a destroy: stop the switch (best effort; the hosts may be gone already)."""
