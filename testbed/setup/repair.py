"""Repair: bring one failed host back (the provider's part) and set it up again (this stage's part)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from testbed import remote
from testbed.errors import TestbedError, by_door
from testbed.setup import apply, images

if TYPE_CHECKING:
    from testbed.providers.base import Progress
    from testbed.resolved import Resolved


@dataclass
class Repair:
    """What repairing a host did, and how long each part took (seconds)."""

    host: str
    hosts: list[str]  # brought back (a TPU slice's workers come back together)
    replaced: list[str]  # made anew: new disk, new host keys (pinned, the old pins replaced)
    repair_seconds: float
    how: str = ""  # what the provider did (restarted, replaced by a new server, ...)
    setup_seconds: float = 0.0
    setup: str | None = None  # the profile applied to them
    setup_hosts: list[str] = field(default_factory=list)  # where Ansible ran (the others were unchanged)
    setup_reasons: dict[str, str] = field(default_factory=dict)  # why each of them ran (what of its address differs)
    setup_left_out: list[str] = field(default_factory=list)  # other hosts that did not answer: not set up
    image: str | None = None  # the image of the set-up the hosts came back from (a new disk over it)
    setup_roles: list[str] | None = None  # the roles the set-up ran (None: the whole profile; []: none, recorded)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def repair(tb: Resolved, host: str, *, setup: bool = True, profile: str | None = None,
           progress: Progress | None = None) -> Repair:
    """Bring one failed host back without touching the others (as ``testbed provision NAME --repair HOST``),
    then apply set-up (``profile``, else the set-up last applied to this testbed; none when it was never set
    up). Where that set-up has an image and the provider can repair from an image, the host comes back on a new
    disk from it, and only the per-testbed roles run there. The set-up is verified on the hosts brought back,
    skipped as usual on the others unless their address changed (a host rebuilt with new host keys changes
    every host's, so the peers learn its keys). What was built once
    for the testbed (source builds, wheels) is installed from the controller's copy; other hosts that do not
    answer (lost too, repaired next) are left out. Raises TestbedError when the host cannot be repaired or set
    up."""
    tb.record = tb.store.testbed(tb.name)  # what the last set-up applied, whoever applied it since tb was opened
    last = tb.info.get("setup") or {}
    roles = None if profile else last.get("roles")
    want = None if roles else profile or last.get("profile")
    p = tb.provider(progress)
    done = p.repair(host, image=images.for_repair(tb, p, want) if setup else None)
    tb.record = tb.store.testbed(tb.name)
    out = Repair(host=host, hosts=done.hosts, replaced=done.replaced, repair_seconds=done.seconds, how=done.how,
                 image=done.image)
    if not setup or not (want or roles):
        return out
    t0 = time.monotonic()
    peers = [h.name for h in tb.hosts if h.name not in done.hosts]
    found = remote.run(tb.name, peers, "true", timeout=20, connect_timeout=10, mux="none") if peers else []
    out.setup_left_out = sorted(r.host for r in found if not r.ok)
    # every host that answers (a role such as ssh_mesh writes the others' side too): verified on the hosts
    # brought back (Ansible runs there even where the disk and its set-up record survived), the others only when
    # their address changed (one round trip each otherwise). The hosts left out are named to the roles (ssh_mesh
    # leaves them out of the mesh); as a variable, that moves every host's address, so the set-up after they
    # are back runs everywhere again
    absent = {"testbed_absent_hosts": out.setup_left_out} if out.setup_left_out else None
    res = apply(tb, profile=want, roles=roles, verify=done.hosts, extra_vars=absent,
                limit=[n for n in [*done.hosts, *peers] if n not in out.setup_left_out])
    out.setup_seconds, out.setup = round(time.monotonic() - t0, 2), res.plan
    out.setup_hosts = sorted(n for n, h in res.hosts.items() if not h.unchanged)
    out.setup_reasons = {n: res.reasons.get(n, "") for n in out.setup_hosts}
    out.setup_roles = list(res.partial_roles) if res.partial else None
    if not res.ok:
        bad = ", ".join(sorted(n for n, h in res.hosts.items() if h.failed or h.unreachable)) or host
        raise TestbedError(f"{host} was repaired but its set-up ({res.plan}) failed on {bad}"
                           + (f": {res.error}" if res.error else "")
                           + (f" (not set up, no answer: {', '.join(out.setup_left_out)})"
                              if out.setup_left_out else ""), where=res.artifact_dir or tb.name,
                           fix=by_door(f"see 'testbed setup {tb.name} --limit {host}' for the failing task, fix it, "
                                       "and run it again", f"see setup(limit=[{host!r}]) for the failing task, fix "
                                       "it, and run it again"))
    return out

