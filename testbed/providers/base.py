"""The provider protocol, and the work every provider shares.

A provider does only its cloud's work, the lifecycle (SkyPilot's ``sky/provision`` names in brackets): ``create``
makes (or finds) the resources and returns the hosts [run_instances]; ``ready`` and ``still_starting`` wait for them
[wait_instances]; ``reported_states`` says what the cloud reports of each [query_instances]; ``release`` gives them
back [terminate_instances]. What it may do besides is an interface of ``testbed.capabilities`` it inherits (repair,
faults, images, the dead-man's switch, a reservation's end). The base class does the rest, the same way for every
kind (SkyPilot's split between its provisioner and each cloud's ``instance.py`` is the model): the testbed's key
pair, the state record before anything is made, the ssh_config, reaching every host over SSH with host keys pinned
by one policy, the hosts and the one inventory in state, and the clean-up once nothing is left in the cloud.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from testbed import deadman, homes, paths, remote, ssh
from testbed.capabilities import CANNOT, OFFERS, Capability, Expires, Repairs
from testbed.errors import TestbedError, UsageError
from testbed.exitcodes import Exit
from testbed.hosts import Host
from testbed.providers import REGISTRY
from testbed.textfmt import plural

if TYPE_CHECKING:
    from testbed.expiry import Expiry
    from testbed.spec import TestbedSpec
    from testbed.state import Store


Progress = Callable[[str], None]
"""A provider reports progress as short human lines (``"lease tb-lease: PENDING (30 s)"``)."""
T = TypeVar("T")


def _quiet(_: str) -> None:
    return None


@dataclass
class Made:
    """What ``create`` made or found: the hosts, with addresses known but SSH not yet reached."""

    hosts: list[Host]
    renewed: set[str] = field(default_factory=set)  # hosts testbed (re)made in this call: their old pins go
    host_keys: dict[str, list[str]] = field(default_factory=dict)  # keys the provider knows without asking
    login_as: str | None = None  # the first login's user when the spec's user does not exist yet


@dataclass
class Repaired:
    """What ``repair`` did: the hosts brought back (a slice's workers come back together), those testbed made
    anew (new disk, new host keys), and how long it took (``made_seconds``: until the provider had it)."""

    host: str
    hosts: list[str]
    replaced: list[str]
    seconds: float
    made_seconds: float
    how: str = ""
    image: str | None = None  # the id of the image of the set-up the hosts came back from (a new disk over it)


class Pacer:
    """The pauses of one bounded wait on a cloud: ``first`` seconds, ``multiplier`` times longer each time up to
    ``cap``, each jittered by +-``jitter`` (many testbeds polling one service do not fall into step), never past
    ``deadline`` (monotonic). Every loop that polls a service sleeps through one; a change calls ``reset``."""

    def __init__(self, first: float, deadline: float, *, cap: float, multiplier: float = 1.5, jitter: float = 0.2):
        self.first, self.deadline, self.cap = first, deadline, cap
        self.multiplier, self.jitter = multiplier, jitter
        self.delay = first

    def reset(self) -> None:
        """Something changed: poll briskly again."""
        self.delay = self.first

    def next(self) -> float:
        """The next pause in seconds (and grow the one after it)."""
        d = self.delay * (1 + random.uniform(-self.jitter, self.jitter))
        self.delay = min(self.cap, self.delay * self.multiplier)
        return max(0.0, min(d, self.deadline - time.monotonic()))

    def sleep(self) -> float:
        d = self.next()
        time.sleep(d)
        return d


def each(fn: Callable[[Host], T], hosts: list[Host], width: int = 16) -> list[T]:
    """``fn`` on every host, up to ``width`` at once (a v4-256 slice has 32 workers); the first error wins.

    Daemon threads, joined in short steps: Ctrl-C reaches the caller at once and never waits for a host's
    SSH timeout.
    """
    if len(hosts) <= 1:
        return [fn(h) for h in hosts]
    results: list[Any] = [None] * len(hosts)
    errors: list[BaseException | None] = [None] * len(hosts)
    gate = threading.Semaphore(width)

    def work(i: int, h: Host) -> None:
        with gate:
            try:
                results[i] = fn(h)
            except BaseException as e:
                errors[i] = e

    threads = [threading.Thread(target=work, args=(i, h), daemon=True, name=f"tb-{h.name}")
               for i, h in enumerate(hosts)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        time.sleep(0.05)
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


class AgentSwitch(Expires):
    """The dead-man's switch as an agent on every host (testbed.deadman) that, at the deadline, sends the requests
    ``switch_release`` gives, with the narrowest credential the cloud offers."""

    @abstractmethod
    def switch_release(self, expiry: Expiry) -> dict[str, Any]:
        """What the hosts' agent does at the deadline: ``{"auth": {...}, "requests": [[METHOD, URL], ...]}``, with
        the narrowest credential the cloud offers (made here, recorded as a resource)."""

    def arm_switch(self, hosts: list[Host], expiry: Expiry) -> Expiry:
        """The agent on every host; the expiry as armed."""
        assert isinstance(self, Provider)
        expiry.armed = deadman.install_agent(self, hosts, expiry, self.switch_release(expiry))
        expiry.switch = "agent"
        return expiry

    def disarm_switch(self) -> None:
        """Stop the agents (best effort; the hosts may be gone already)."""
        assert isinstance(self, Provider)
        e = deadman.recorded(self.store, self.name)
        if e is not None and e.switch == "agent" and e.armed:
            deadman.disarm_agents(self.name, e.armed)


class Lifecycle(ABC):
    """The lifecycle every provider implements, in SkyPilot's ``sky/provision`` manner (its names in brackets):
    ``preflight`` (``bootstrap_instances``: refuse a bad setting before anything is made), ``create``
    (``run_instances``), ``still_starting`` and ``ready`` (``wait_instances``: the base waits for SSH itself),
    ``reported_states`` (``query_instances``) and ``release`` (``terminate_instances``; a lab's or a Slurm
    cluster's hosts are given back, not terminated, hence the name).
    The optional operations are the interfaces of ``testbed.capabilities``."""

    def preflight(self) -> None:
        """Refuse what would fail (missing tools, credentials, a bad setting) before anything is made."""
        return None

    @abstractmethod
    def create(self, public_key: str | None) -> Made:
        """Make or find every resource, each id recorded as it comes back; the hosts, not yet reached."""

    @abstractmethod
    def release(self) -> None:
        """Release every resource recorded for this testbed; raise (rows kept) while anything is left."""

    def still_starting(self, h: Host) -> None:
        """Raise when ``h`` can never answer (checked while waiting for it); default: keep waiting."""
        return None

    def ready(self, made: Made) -> None:
        """Work after every host answers SSH and before the hosts are recorded (users, facts)."""
        return None

    def reported_states(self) -> dict[str, str] | None:
        """Each host's state as the provider itself reports it now (network allowed): evidence when a run judges
        a host lost (testbed.run.liveness.GONE_STATES); None when this provider cannot tell (the default)."""
        return None

    def machine_states(self) -> dict[str, str]:
        """host -> what this machine alone can tell of it without the network (``gone``: its machine is not there
        any more), for ``testbed status``; nothing by default (a cloud's hosts are asked with --probe)."""
        return {}

    def state_notes(self) -> dict[str, str]:
        """host -> what the provider said of its machine at the last :meth:`reported_states` (the node and its
        state in the provider's own words), for the evidence when a run judges it lost; none by default."""
        return {}


class Provider(Lifecycle):
    """Provision and destroy the hosts of one testbed.

    A provider implements ``create`` and ``release`` (and may refine the hooks below), and offers an optional
    operation by inheriting its interface (``testbed.capabilities``: ``capabilities`` is derived from them); the
    rules it keeps:
    - every cloud resource id is written to state (``store.add_resource``) the moment the API returns it;
    - ``create`` is idempotent: it reuses what exists and says which hosts it (re)made;
    - ``release`` is safe to run again after a partial failure; it raises while anything is left, and the rows
      of what is left stay in state;
    - SDKs are imported inside methods, never at module import.
    """

    kind: ClassVar[str]
    # What the provider can do; callers test these, never a provider's name. costs_money, counts_hours and
    # keeps_hosts come from its registration (testbed.providers.registration), set when the class is defined.
    costs_money: ClassVar[bool] = False
    counts_hours: ClassVar[bool] = False
    offline_hosts: ClassVar[bool] = False  # hosts have no route out (set-up installs from the controller)
    shares_controller_files: ClassVar[bool] = False  # hosts see the controller's files (its Python env)
    keeps_hosts: ClassVar[bool] = False
    root_on_hosts: ClassVar[bool] = True  # set-up may become root there (False: a Slurm cluster's nodes)
    capabilities: ClassVar[frozenset[Capability]] = frozenset()  # the optional operations it implements
    lacking: ClassVar[dict[Capability, str]] = {}  # why it lacks one, in its own words (else ``CANNOT``'s)
    accelerator: ClassVar[str | None] = None  # what every host of the kind has built in (a TPU), beyond the spec
    repair_how: ClassVar[str] = "brought back"  # what ``repair`` does to a failed host, in a few words
    expire: str | None = None  # --expire of this command (a duration from now), over the spec's expire
    # images of a set-up (testbed.setup.images): Capability.IMAGES, and REPAIR_FROM_IMAGE where a repaired host comes
    # back on a new disk from one (``repair(image=...)``); each one way, as every optional operation
    image: Mapping[str, Any] | None = None  # the image (a row of state's images) a new testbed boots from
    # keeping an image costs nothing (no storage bill): the first set-up bakes one by itself, so that a lost host
    # is repaired from it; elsewhere ``setup --bake`` stays explicit and the set-up's summary says what it would do
    bakes_by_itself: ClassVar[bool] = False
    repair_image: Mapping[str, Any] | None = None  # the image ``repair`` brings a host back from (None: as it was)


    def __init_subclass__(cls, **kwargs: Any) -> None:
        """What the kind registered (``costs_money``, ``counts_hours``, ``keeps_hosts``) becomes the class's; its
        capabilities are the interfaces it inherits (``testbed.capabilities``), each checked against its methods."""
        super().__init_subclass__(**kwargs)
        reg = REGISTRY.get(getattr(cls, "kind", ""))
        if reg is not None:
            cls.costs_money, cls.counts_hours, cls.keeps_hosts = reg.costs_money, reg.counts_hours, reg.keeps_hosts
        cls.capabilities = frozenset(cap for cap, iface in OFFERS.items() if issubclass(cls, iface))
        if Capability.REPAIR_FROM_IMAGE in cls.capabilities and not {Capability.IMAGES, Capability.REPAIR} \
                <= cls.capabilities:
            raise TypeError(f"{cls.__name__}: repair-from-image needs the images and repair capabilities")
        if cls.bakes_by_itself and (cls.costs_money or Capability.IMAGES not in cls.capabilities):
            raise TypeError(f"{cls.__name__}: only a provider whose images cost nothing bakes them by itself")
        for cap, iface in OFFERS.items():
            methods = sorted(getattr(iface, "__abstractmethods__", ()))
            if cap in cls.capabilities:
                missing = [m for m in methods if getattr(getattr(cls, m), "__isabstractmethod__", False)]
                if missing:
                    raise TypeError(f"{cls.__name__} offers {cap} but does not implement {', '.join(missing)}")
            elif own := [m for m in methods if hasattr(cls, m)]:
                raise TypeError(f"{cls.__name__} implements {', '.join(own)} but does not offer {cap} (inherit "
                                f"testbed.capabilities.{iface.__name__}, or say why it lacks it in lacking)")

    def __init__(self, spec: TestbedSpec, store: Store, progress: Progress = _quiet):
        self.spec = spec
        self.store = store
        self.progress = progress

    @property
    def name(self) -> str:
        return self.spec.name

    # what a provider implements -------------------------------------------------------------------------
    def wants_key(self) -> bool:
        """Whether the hosts log in with the testbed's own key pair (made on first use)."""
        return True

    def inventory_vars(self) -> dict[str, Any]:
        """The inventory's variables: the spec's ``vars`` and what the real machines are like."""
        return {**self.spec.vars, "testbed_hardware": self.spec.hardware.context()}

    def info(self) -> dict[str, Any]:
        """What to record with the testbed (zone, lease name, bridge...), merged into its state row."""
        return {}

    def interrupted(self) -> TestbedError:
        """The message for Ctrl-C during provision."""
        return TestbedError(f"provision of '{self.name}' interrupted; recorded so far: {self.recorded()}",
                            where=f"testbed {self.name}",
                            fix=f"'testbed destroy {self.name}' releases it, or 'testbed provision {self.name}' "
                                "resumes", code=Exit.INTERRUPTED)

    def unreachable(self, hosts: list[Host]) -> TestbedError:
        """The message when hosts were recorded but did not answer."""
        return TestbedError(f"{plural(len(hosts), 'host')} of '{self.name}' did not answer: "
                            + ", ".join(h.name for h in hosts), where=f"testbed {self.name}",
                            fix=f"'testbed provision {self.name}' tries again")

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """Held around provision and destroy (a provider whose resources are on this machine locks them)."""
        return contextlib.nullcontext()

    # reaching hosts: the defaults suit a cloud VM or bare-metal server ---------------------------------
    @property
    def ssh_poll(self) -> float:
        """Seconds between SSH handshake attempts."""
        return 2.0

    @property
    def connect_timeout(self) -> int:
        """ssh_config's ConnectTimeout."""
        return 10

    @property
    def ssh_timeout(self) -> float:
        """How long every host together may take to answer SSH."""
        return float(getattr(self.spec.provider, "ssh_timeout", 60))

    def host_label(self, h: Host) -> str:
        return h.name

    def ssh_fix(self, h: Host) -> str:
        """What to do when ``h`` never answers SSH."""
        return (f"check that {h.address}:{h.port} is reachable from here (security group, firewall), raise "
                f"provider.ssh_timeout, then 'testbed provision {self.name}' again; 'testbed destroy {self.name}' "
                "releases everything")

    def login_fix(self, h: Host) -> str:
        """What to do when ``h`` answers SSH but refuses the testbed key."""
        return (f"check the provider user ({self.spec.user}) and that the testbed key is installed, then provision "
                f"again; 'testbed destroy {self.name}' releases everything")

    # images ------------------------------------------------------------------------------------------
    @classmethod
    def base_image(cls, spec: TestbedSpec) -> str:
        """What this spec's hosts boot from when no image of a set-up is used, as text that changes when it does
        (part of an image's key: an image baked over one base is never used over another)."""
        return cls.kind

    def bake_refusal(self, profile: str | None = None) -> TestbedError | None:
        """Why an image of this testbed's hosts cannot be made (``profile``: the set-up it would hold), decided
        from the spec alone, before any host or API is asked; None when it can."""
        why = self.lacks(Capability.IMAGES)
        if why is None:
            return None
        return TestbedError(f"the {self.kind} provider keeps no images: {why}",
                            where=f"testbed {self.name}", fix=f"testbed setup {self.name}")

    def booted_image(self) -> Mapping[str, Any] | None:
        """The image this testbed's hosts boot from: the one recorded at its provision, else ``image``."""
        recorded = self.store.testbed_info(self.name).get("image")
        return recorded if isinstance(recorded, dict) else self.image

    # the common work -----------------------------------------------------------------------------------
    def provision(self) -> list[Host]:
        """Create (or find) the hosts, reach them over SSH, record them in state, return them; idempotent."""
        with self.lock():
            expiry = deadman.planned(self.spec, self.expire, deadman.recorded(self.store, self.name))
            deadman.check(self, expiry)
            self.preflight()
            public_key = ssh.ensure_keypair(self.name)[1] if self.wants_key() else None
            self.record_testbed("provisioning", self.info())
            if self.image is not None and not self.store.testbed_info(self.name).get("image"):
                self.store.update_testbed_info(self.name, image={k: self.image[k] for k in ("key", "id", "location")})
            try:
                made = self.create(public_key)
                self.reach(made)
                self.ready(made)
            except KeyboardInterrupt:
                self.store.set_testbed_status(self.name, "interrupted")
                raise self.interrupted() from None
            except TestbedError:
                self.store.set_testbed_status(self.name, "failed")
                raise
            hosts = made.hosts
            self.store.set_hosts(self.name, hosts)
            ssh.write_inventory(self.name, hosts, self.inventory_vars())
            down = [h for h in hosts if h.state == "unreachable"]
            self.record_testbed("degraded" if down else "up", self.info())
            if expiry is not None and len(down) < len(hosts):  # the hosts that answer hold the switch
                deadman.arm(self, [h for h in hosts if h.state != "unreachable"], expiry)
        if down:
            raise self.unreachable(down)
        return hosts

    def repair(self, host: str, image: Mapping[str, Any] | None = None) -> Repaired:
        """Bring one failed host back without touching the others: ``discard`` what serves it, ``create`` again
        (which reuses everything else), reach the new host (its new keys pinned: testbed rebuilt it) and record
        it. ``image`` (a row of state's images, where it can repair from an image): the host comes back on a new disk
        from it, recorded in the testbed's ``repair_image``. Raises when the provider cannot repair, or the host
        does not come back."""
        t0 = time.monotonic()
        self.repair_image = image if self.can(Capability.REPAIR_FROM_IMAGE) else None
        with self.lock():
            recorded = self.store.hosts(self.name)  # a name that is no host is refused before any credentials
            h = next((x for x in recorded if x.name == host), None)
            if h is None:
                import difflib

                names = [x.name for x in recorded]
                close = difflib.get_close_matches(host, names, n=1, cutoff=0.5)
                raise UsageError(f"testbed '{self.name}' has no host '{host}'", where="--repair",
                                 fix=(f"did you mean '{close[0]}'? " if close else "")
                                 + f"hosts: {', '.join(names) or 'none (provision first)'}")
            self.preflight()
            why = self.lacks(Capability.REPAIR)
            if why:
                raise TestbedError(f"the {self.kind} provider cannot repair a host: {why}",
                                   where=f"testbed {self.name}", fix=self.repair_fix(h))
            public_key = ssh.ensure_keypair(self.name)[1] if self.wants_key() else None
            try:
                self.progress(f"{host}: repairing" + (f" from image {self.repair_image['id']}"
                                                      if self.repair_image else ""))
                if self.repair_image:  # recorded first: destroy releases what the host boots from
                    self.store.update_testbed_info(self.name, repair_image={k: self.repair_image[k]
                                                                            for k in ("key", "id", "location")})
                gone = set(Repairs.of(self).discard(h))
                made = self.create(public_key)
                t_made = time.monotonic()
                back = Made([x for x in made.hosts if x.name in gone or x.name in made.renewed],
                            renewed=made.renewed & gone, host_keys={k: v for k, v in made.host_keys.items()
                                                                    if k in gone or k in made.renewed},
                            login_as=made.login_as)
                self.reach(back, everyone=made.hosts)
                self.ready(back)
            except KeyboardInterrupt:
                self.store.set_testbed_status(self.name, "interrupted")
                raise self.interrupted() from None
            except TestbedError as e:
                self.store.set_testbed_status(self.name, "degraded")
                raise TestbedError(f"could not repair {host}: {e.what}", where=e.where,
                                   fix=e.fix or self.repair_fix(h), code=e.code) from None
            # the others stay as recorded (their facts, their state): only the hosts brought back change
            mine = {x.name: x for x in back.hosts}
            kept = {x.name: x for x in recorded}
            hosts = [mine.get(x.name) or kept.get(x.name) or x for x in made.hosts]
            self.store.set_hosts(self.name, hosts)
            ssh.write_inventory(self.name, hosts, self.inventory_vars())
            self.record_testbed("up", self.info())
            expiry = deadman.recorded(self.store, self.name)
            if expiry is not None and expiry.active and expiry.switch == "agent":
                # a new server or node has no agent, and the switch's credential names the old one: armed again
                deadman.arm(self, [x for x in hosts if x.state != "unreachable"], expiry)
        return Repaired(host=host, hosts=[x.name for x in back.hosts], replaced=sorted(back.renewed),
                        seconds=round(time.monotonic() - t0, 2), made_seconds=round(t_made - t0, 2),
                        how=f"brought back on a new disk from image {self.repair_image['id']}" if self.repair_image
                        else self.repair_how, image=str(self.repair_image["id"]) if self.repair_image else None)

    def repair_fix(self, h: Host) -> str:
        """What the user can do when ``h`` cannot be repaired by testbed."""
        return (f"bring {h.name} ({h.address}) back by hand, then 'testbed provision {self.name}'; or "
                f"'testbed destroy {self.name}' and provision a new testbed")

    def destroy(self) -> None:
        """Release every resource recorded for this testbed, then forget it; safe to repeat."""
        with self.lock():
            try:
                if isinstance(self, Expires):
                    self.disarm_switch()
            except TestbedError as e:  # the billing resources go first; release reports what it cannot undo
                self.progress(f"dead-man's switch: {e.what} (releasing anyway)")
            self.release()
        self.forget()

    def forget(self) -> None:
        """This machine's side of a testbed once nothing is left in the cloud: SSH masters, state, files."""
        import shutil

        remote.close_connections(self.name, [h.name for h in self.store.hosts(self.name)], remove=True)
        self.store.delete_testbed(self.name)
        shutil.rmtree(paths.testbed_dir(self.name), ignore_errors=True)

    def recorded(self) -> str:
        """What state holds for this testbed, counted by kind ("1 lease, 3 servers")."""
        counts: dict[str, int] = {}
        for r in self.store.resources(self.name):
            counts[r["kind"]] = counts.get(r["kind"], 0) + 1
        return ", ".join(f"{n} {k}{'s' if n > 1 else ''}" for k, n in counts.items()) or "nothing"

    def reach(self, made: Made, everyone: list[Host] | None = None) -> None:
        """SSH on every host made: stale masters closed, the ssh_config written (for ``everyone``, default the
        hosts made), a real handshake, the host keys pinned by ``pin``, then a login with the testbed key (a
        cloud's agent may install it after sshd starts)."""
        hosts = made.hosts
        before = {h.name: h.address for h in self.store.hosts(self.name)}
        stale = [h.name for h in hosts if h.name in made.renewed or before.get(h.name, h.address) != h.address]
        remote.close_connections(self.name, stale)
        ssh.write_ssh_config(self.name, everyone or hosts, connect_timeout=self.connect_timeout)
        if made.host_keys:
            ssh.pin_many(self.name, made.host_keys)  # known before any handshake: pinned in one write
        deadline = time.monotonic() + self.ssh_timeout

        def one(h: Host) -> None:
            keys = self._handshake(h, deadline)
            self.pin(h.name, keys, renewed=h.name in made.renewed or before.get(h.name, h.address) != h.address)
            self._login(h, deadline, made.login_as)

        each(one, hosts)
        self.progress(f"{plural(len(hosts), 'host')} answering SSH")

    def pin(self, host: str, keys: list[str], *, renewed: bool) -> None:
        """The host-key policy: pin a new host's keys; replace the pin only of a host testbed itself (re)made;
        otherwise refuse keys that differ from the pin (someone else's machine may sit at that address now)."""
        pinned = ssh.pinned_keys(self.name, host)
        if pinned and pinned == {" ".join(k.split()[:2]) for k in keys}:
            return  # pinned already, as it is
        if not pinned or renewed:
            ssh.pin_host_keys(self.name, host, keys)
            return
        if not {" ".join(k.split()[:2]) for k in keys} & pinned:
            raise TestbedError(f"the host key of {host} changed since it was pinned, and testbed did not rebuild it",
                               where=f"testbed {self.name}: {host}",
                               fix=f"if the host was really rebuilt, run 'testbed forget-host {self.name} {host}' and "
                                   "provision again; otherwise do not connect (another machine may answer)")

    def _handshake(self, h: Host, deadline: float) -> list[str]:
        """Wait until ``h`` completes an SSH handshake (not just a TCP connect); its public keys."""
        start = last = time.monotonic()
        while True:
            self.still_starting(h)
            keys = remote.scan_host_keys(h.address, h.port, timeout=min(5, max(1, deadline - time.monotonic())))
            if keys:
                return keys
            now = time.monotonic()
            if now >= deadline:
                raise TestbedError(f"{self.host_label(h)} at {h.address}:{h.port} did not answer SSH within "
                                   f"{int(self.ssh_timeout)} s", where=f"{h.address}:{h.port}", fix=self.ssh_fix(h))
            if now - last > 10:
                self.progress(f"{self.host_label(h)}: waiting for SSH on {h.address}:{h.port} ({int(now - start)} s)")
                last = now
            time.sleep(min(self.ssh_poll, max(0.0, deadline - now)))

    def _login(self, h: Host, deadline: float, user: str | None) -> None:
        """Log in with the testbed key until it works, the host key is refused, or the deadline passes."""
        while True:
            r = remote.run(self.name, [h.name], "true", timeout=30, mux="none", user=user)[0]
            if r.ok:
                return
            why = r.error or ssh.describe_ssh_failure(r.stderr, h.name, self.name)
            if "host key" in why or time.monotonic() >= deadline:
                raise TestbedError(f"cannot log in to {self.host_label(h)} ({h.address}): {why}",
                                   where=f"{user or h.user}@{h.address}:{h.port}", fix=self.login_fix(h))
            time.sleep(self.ssh_poll)

    def record_testbed(self, status: str, info: dict[str, Any] | None = None) -> None:
        """Record the testbed with a copy of its validated spec, so destroy works from state alone even when the
        spec file is later edited, deleted or needs an unset variable."""
        # what destroy needs (provider settings, user, groups); not vars or sources, which may carry tokens
        spec = self.spec.model_dump(mode="json", exclude={"source", "vars", "sources"})
        # listed in the user's index before anything is made, so that `testbed status` anywhere shows it
        problem = homes.register(self.store.home)
        if problem:
            self.progress(f"note: {problem}")
        self.store.upsert_testbed(self.name, self.kind, self.spec.source, status, {**(info or {}), "spec": spec})

    @classmethod
    def lacks(cls, capability: Capability | str) -> str | None:
        """Why this provider cannot do ``capability`` (a sentence to put after "cannot ..."); None when it can."""
        cap = Capability(capability)
        if cap in cls.capabilities:
            return None
        return cls.lacking.get(cap) or CANNOT[cap]

    def cannot(self, capability: Capability) -> TestbedError:
        """The error for an optional operation this testbed's provider does not offer (a caller checks ``can``
        first, so this is the last word, not the refusal a user normally sees)."""
        return TestbedError(f"testbed '{self.name}' ({self.kind}) cannot {capability.value}: {self.lacks(capability)}",
                            where=f"testbed {self.name}", fix="use a testbed whose provider offers it (testbed check "
                                                              "lists what each kind can do)")

    @classmethod
    def can(cls, capability: Capability | str) -> bool:
        """Whether this provider implements an optional operation (see ``capabilities``)."""
        return cls.lacks(capability) is None

    # the ledger ----------------------------------------------------------------------------------------
    def hours_short_of(self, at: float) -> float:
        """Hours the reservation must grow to last until ``at`` (epoch); 0 when it already does or has no end."""
        return 0.0

    def cost(self, prices: dict[str, Any]) -> dict[str, Any] | None:
        """What the held resources cost per hour from state (no network): ``{"per_hour", "unit", "basis"}``; None
        when they cost nothing."""
        return None

    def planned_cost(self, prices: dict[str, Any], hosts: int) -> dict[str, Any] | None:
        """What holding the testbed with ``hosts`` hosts costs per hour, held or not yet (no network):
        ``{"per_hour", "unit", "basis"}`` (``per_hour`` None: no price found); None when it costs nothing. By
        default the price table's section of this kind, ``{"per_node_hour": X, "unit": "SU"|"USD"}`` (a lab with a
        chargeback, or a test, prices its hosts so); none: free."""
        row = prices.get(self.kind)
        if not isinstance(row, dict) or row.get("per_node_hour") is None:
            return None
        unit = row.get("unit")
        if unit not in ("SU", "USD"):
            raise UsageError(f"the price table's '{self.kind}' section has unit {unit!r}",
                             where=str(prices.get("_override_path") or "prices.json"),
                             fix='give "unit": "SU" or "USD"')
        per = float(row["per_node_hour"])
        return {"per_hour": round(per * hosts, 6), "unit": str(unit),
                "basis": f"{plural(hosts, 'host')} x {per:g} {unit}/host-hour (price table)"}

    def lease_left(self, now: float) -> tuple[float | None, str]:
        """Seconds until the provider itself takes the hosts back (a lease's end), and what says so; for a testbed
        not provisioned yet, the length a provision would ask for. None: no such end (the default)."""
        return None, "no lease end"

    def orphans(self) -> list[dict[str, Any]]:
        """Resources of this testbed at the provider that state does not record (network), each with ``kind``,
        ``id`` and ``release`` (the command that releases it)."""
        return []

    def describe(self) -> dict[str, Any]:
        """Provider-specific status from state only (no network): lease end, slice type, ..."""
        return {}

    def refresh(self) -> list[Host]:
        """Ask the provider for the hosts' real state (network allowed); default: state as recorded."""
        return self.store.hosts(self.name)

    def rank_launcher(self, host: Host) -> list[str]:
        """The command words a run's rank wrapper starts under on ``host`` (testbed/scripts/launch.sh): none by
        default (a detached process of the login); a batch scheduler's provider makes it a step of the job that
        holds the host, so the scheduler tracks the rank and ends it with the job."""
        return []
