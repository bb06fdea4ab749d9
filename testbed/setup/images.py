"""Images of a set-up: set up once, boot many.

An image is keyed by what the set-up installs, whatever hosts it is for (:func:`testbed.setup.address.image_parts`:
the profile's roles and variables, the sources' commits, the tools, the testbed-wide variables and the base image
the hosts booted from). ``bake`` makes one from a host whose set-up has just passed; a new testbed whose default
profile's key has an image boots from it (``for_provision``), and so does a host repaired with a new disk; set-up
then runs only the roles that depend on the other hosts (``per_testbed`` roles: the SSH mesh, MPI hostfiles) and
records the hosts as set up. An image of one key is never used for another: a changed variable, role file or
source commit is another key, and the host does the whole set-up.

Images are recorded in state (``images``) the moment their provider names them; they outlive the testbed that
baked them: destroy never deletes one, ``prune`` does, and so does the dead-man's switch of a testbed whose spec
says ``expire_images: true`` (only the images it baked that no other testbed boots from:
:meth:`testbed.state.Store.expiring_images`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from testbed import deadman, setup
from testbed.capabilities import BakesImages, Capability
from testbed.errors import TestbedError, UsageError
from testbed.providers import provider_class
from testbed.resolved import Resolved
from testbed.setup import address
from testbed.spec import TestbedSpec

if TYPE_CHECKING:
    from testbed.providers.base import Progress, Provider
    from testbed.resolved import Resolved
    from testbed.state import ImageRow, Store


def _profile(tb: Resolved, profile: str | None, suite: str | None) -> tuple[str | None, str | None]:
    """The profile (or suite) an image of ``tb`` holds: the one given, else the set-up last applied to it."""
    if profile or suite:
        return profile, suite
    last = tb.info.get("setup") or {}
    if last.get("roles"):
        raise UsageError(f"the last set-up of '{tb.name}' applied single roles ({', '.join(last['roles'])}): an "
                         "image holds a profile", where=f"testbed {tb.name}",
                         fix=f"testbed setup {tb.name} --profile NAME --bake")
    return last.get("profile") or (tb.spec.profile if tb.spec is not None else None) or "base", None


def bake(tb: Resolved, host: str | None = None, *, profile: str | None = None, suite: str | None = None,
         extra_vars: dict[str, Any] | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """An image of ``host`` (default: the testbed's first host) whose set-up (``profile``, default the last one
    applied) has just passed: refused when the host's record does not match that set-up now. An image of that
    key already recorded for this provider is returned as it is (``new`` False)."""
    if not tb.hosts:
        raise UsageError(f"testbed '{tb.name}' has no hosts", where="state", fix=f"testbed provision {tb.name}")
    names = [h.name for h in tb.hosts]
    host = host or names[0]
    if host not in names:
        raise UsageError(f"testbed '{tb.name}' has no host '{host}'", where="--host", fix=f"hosts: {', '.join(names)}")
    p = refuse_bake(tb, profile=profile, suite=suite, progress=progress)  # before any host or API is asked
    prep = setup.prepare(tb, profile=profile, suite=suite, extra_vars=extra_vars)
    profile = None if suite else prep.plan.name  # the set-up just applied (by default the spec's profile)
    why, parts, key = setup.applied(tb, prep, host)
    if why:
        raise TestbedError(f"{host} does not hold the set-up '{prep.plan.name}' as it is now ({why})",
                           where=f"testbed {tb.name}: {host}",
                           fix=f"testbed setup {tb.name} --profile {prep.plan.name} --bake (an image is made from a "
                               "host whose set-up has just passed)")
    have = [r for r in tb.store.images(key) if r["provider"] == p.kind]
    if have:
        return {**have[-1], "new": False}
    t0 = time.monotonic()

    def note(iid: str, location: str) -> None:  # a cloud's image is recorded before it is waited on
        tb.store.add_image(p.kind, iid, key=key, plan=prep.plan.name, testbed=tb.name, host=host, location=location,
                           size=0, status="saving", spec=tb.info.get("spec"))

    record = address.image_record(key, prep.plan.name, parts, f"{tb.name}/{host}")
    made = BakesImages.of(p).bake_image(host, key, record, note)
    tb.store.add_image(p.kind, str(made["id"]), key=key, plan=prep.plan.name, testbed=tb.name, host=host,
                       location=str(made["location"]), size=int(made.get("size") or 0),
                       **{**(made.get("info") or {}), "seconds": round(time.monotonic() - t0, 2),
                          "spec": tb.info.get("spec")})
    row = next(r for r in tb.store.images(key) if r["provider"] == p.kind and r["id"] == str(made["id"]))
    if tb.spec is not None and tb.spec.expire_images:  # the hosts' agents must be allowed to delete it too
        e = deadman.recorded(tb.store, tb.name)
        if e is not None and e.active and e.switch == "agent":
            deadman.arm(p, tb.hosts, e)
    return {**row, "new": True}


def refuse_bake(tb: Resolved, *, profile: str | None = None, suite: str | None = None,
                progress: Progress | None = None) -> Provider:
    """Raise the provider's refusal to bake an image of ``tb`` (decided from its spec: no host, no request), so
    that ``setup --bake`` is refused before the set-up runs; the provider otherwise."""
    p = tb.provider(progress)
    why = p.bake_refusal(profile or suite or (tb.spec.profile if tb.spec is not None else None))
    if why is not None:
        raise why
    return p


def for_provision(p: Provider) -> Mapping[str, Any] | None:
    """The image a new testbed boots from (set as ``p.image``): one recorded for its provider whose key is that of
    the set-up its spec names (its ``profile:`` and ``vars:``); None when there is none, or when the testbed is
    already provisioned (its hosts keep what they booted from). Costs nothing when no image of this provider is
    recorded."""
    if not p.can(Capability.IMAGES) or p.store.testbed(p.name) is not None:
        return None
    rows = [r for r in p.store.images() if r["provider"] == p.kind]
    if not rows:
        return None
    key, _ = setup.prepare(Resolved(p.name, p.store, p.spec, None)).image()
    match = [r for r in rows if r["key"] == key]
    p.image = match[-1] if match else None
    return p.image


def for_repair(tb: Resolved, p: Provider, profile: str | None) -> ImageRow | None:
    """The image a lost host of ``tb`` is repaired from: one recorded for its provider (where it can repair from an
    image) whose key is that of ``profile`` as it is now (the set-up the repair applies); None otherwise. Costs
    nothing when no image of this provider is recorded."""
    if not profile or not p.can(Capability.REPAIR_FROM_IMAGE):
        return None
    rows = [r for r in tb.store.images() if r["provider"] == p.kind]
    if not rows:
        return None
    key, _ = setup.prepare(tb, profile=profile).image()
    match = [r for r in rows if r["key"] == key]
    return match[-1] if match else None


def offer(tb: Resolved, *, profile: str | None, suite: str | None, extra_vars: dict[str, Any] | None,
          progress: Progress | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """After a set-up that passed everywhere, with no ``--bake`` either way: where this provider
    ``bakes_by_itself``, an image of it (none when one exists or the hosts boot from one); elsewhere, where it can
    bake, one line saying that a bake would make repairs faster and how. (image, note); a bake that fails is a
    note, never a failed set-up."""
    p = tb.provider()
    if not p.can(Capability.IMAGES) or p.booted_image() is not None or p.bake_refusal(profile or suite) is not None:
        return None, None
    prep = setup.prepare(tb, profile=profile, suite=suite, extra_vars=extra_vars)
    profile = None if suite else prep.plan.name  # the set-up just applied (by default the spec's profile)
    if any(r["provider"] == p.kind for r in tb.store.images(prep.image()[0])):
        return None, None
    if p.bakes_by_itself:
        if progress is not None:
            progress(f"baking an image of {prep.plan.name} from {tb.hosts[0].name} (kept for free here: new testbeds "
                     "of this set-up and repaired hosts boot from it)")
        try:
            return bake(tb, profile=profile, suite=suite, extra_vars=extra_vars), None
        except TestbedError as e:
            return None, f"no image of this set-up baked ({e.what}): a lost host is repaired by a whole set-up"
    return None, (f"no image of this set-up yet: 'testbed setup {tb.name} --profile {prep.plan.name} --bake' makes "
                  "one (stored, and billed, until 'testbed image prune'), and a lost host is then repaired from it in "
                  "seconds instead of a whole set-up")


def prune(st: Store, ids: list[str] | None = None, *, progress: Progress | None = None) -> list[ImageRow]:
    """Delete images where they live and forget them: those named (by id or a key's first characters), else every
    image no testbed uses. One a testbed uses is refused (its hosts boot from it). The images deleted."""
    rows = st.images()
    used = st.image_users()
    if ids:
        picked = []
        for want in ids:
            found = [r for r in rows if r["id"] == want or (len(want) >= 6 and r["key"].startswith(want))]
            if not found:
                raise UsageError(f"no image '{want}'", where="testbed image prune",
                                 fix="'testbed image list' shows the images (id or the first characters of a key)")
            picked += [r for r in found if r not in picked]
        busy = [r for r in picked if used.get(r["key"])]
        if busy:
            r = busy[0]
            raise UsageError(f"image {r['id']} is used by {', '.join(used[r['key']])}", where="testbed image prune",
                             fix=f"destroy {', '.join(used[r['key']])} first (their hosts boot from it)")
    else:
        picked = [r for r in rows if not used.get(r["key"])]
    out = []
    for r in picked:
        p = _provider_of(st, r, progress)
        BakesImages.of(p).delete_image(r)
        st.remove_image(r["provider"], r["id"])
        out.append(r)
    return out


def _provider_of(st: Store, row: ImageRow, progress: Progress | None) -> Provider:
    """A provider that can delete ``row``: that of the testbed that baked it (its spec, else its recorded copy)."""
    try:
        return Resolved.open(row["testbed"], st, recorded_ok=True).provider(progress)
    except TestbedError:
        copy = row["info"].get("spec")
        if not copy:
            raise TestbedError(f"image {row['id']} was baked by testbed '{row['testbed']}', whose spec is gone",
                               where=f"image {row['id']} ({row['location']})",
                               fix=f"restore inventories/{row['testbed']}.yml, or delete the image where it lives "
                                   "by hand") from None
        spec = TestbedSpec.model_validate(copy)
        return provider_class(spec.kind)(spec, st, progress) if progress else provider_class(spec.kind)(spec, st)
