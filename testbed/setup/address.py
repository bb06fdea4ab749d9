"""Set-up that knows when to skip: a content address of what a plan applies to each host, recorded on the host.

The address of a host is the sha256 of named **parts**, each itself a sha256 (values never leave this machine, so
no variable, index URL or token reaches a host):

- ``plan``: roles in order, their ``vars:`` and ``when:``, the play's variables;
- ``role NAME``: every file of each role it uses (path, executable bit, bytes), meta dependencies included;
- ``variables``: the spec's ``vars:`` and ``--var`` (source overrides carry their commits);
- ``sources``: the commits that moving source refs (branches, tags, HEAD) point at now (``git ls-remote``);
- ``inventory``: every host's name, address and groups, and what testbed derives (provider, subnet, offline,
  cache folder): the SSH mesh and MPI hostfiles depend on all hosts; ``host``: this host's own entry;
- ``host keys``: the testbed's pinned host keys (the controller's known_hosts, sorted lines): a host rebuilt with
  a new disk changes every host's address, so the others run again and learn its new keys;
- ``environment``: the ``PIP_*`` and ``ANSIBLE_*`` settings here (index URLs, an Ansible strategy);
- ``tools``: the versions of ansible-core and testbed.

The record is ``~/.cache/testbed/setup.json`` in the login user's home on the host (no ``become`` needed; the
roles set up that user's home as well): one per host, the last set-up that succeeded there. It is removed before
Ansible touches the host and written only after the host's play ran to its end without a failure, so a failed,
stopped or interrupted set-up leaves no address and the next run does the work. In its place, until then, the
host holds a **pending** mark (``setup+pending.json``): the next set-up reads it and says that an earlier set-up
did not finish there (not "no record", and never drift).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import distribution, git, paths, remote

RECORD = ".cache/testbed/setup.json"
"""Where the record lives, relative to the login user's home on the host."""
FORMAT = 1


def _sha(data: object) -> str:
    blob = data if isinstance(data, bytes) else json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@functools.cache
def _dir_digest(path: Path, stamp: tuple[tuple[str, int, int], ...]) -> str:
    """sha256 of a folder's files (relative path, executable bit, bytes); ``stamp`` keys the cache."""
    h = hashlib.sha256()
    for rel, _, _ in stamp:
        f = path / rel
        h.update(rel.encode() + b"\0" + (b"x" if os.access(f, os.X_OK) else b"-") + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def role_digest(role_dir: Path) -> str:
    """The content address of one role folder (every file but Python caches)."""
    stamp: list[tuple[str, int, int]] = []
    for root, dirs, files in os.walk(role_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".swp", "~")):
                continue
            p = Path(root) / name
            st = p.stat()
            stamp.append((str(p.relative_to(role_dir)), st.st_mtime_ns, st.st_size))
    return _dir_digest(role_dir, tuple(sorted(stamp)))


_INCLUDED_ROLE = re.compile(r"^\s*(?:ansible\.builtin\.)?(?:include|import)_role:\s*\n\s+name:\s*([\w.-]+)\s*$", re.M)


def role_closure(roles: Iterable[str], roles_dir: Path) -> list[str]:
    """``roles``, every role they name as ``dependencies`` in meta/main.yml and every role their tasks include or
    import by a literal name (``include_role: name: push``), transitively (sorted)."""
    from ruamel.yaml import YAML

    seen: set[str] = set()
    todo = list(roles)
    while todo and len(seen) < 1000:  # bounded: a role folder holds far fewer
        r = todo.pop()
        if r in seen:
            continue
        seen.add(r)
        meta = roles_dir / r / "meta" / "main.yml"
        data = YAML(typ="safe").load(meta.read_text()) if meta.is_file() else None
        for dep in (data or {}).get("dependencies") or [] if isinstance(data, dict) else []:
            name = dep.get("role") if isinstance(dep, dict) else dep
            if isinstance(name, str):
                todo.append(name)
        tasks = roles_dir / r / "tasks"
        for f in sorted(tasks.glob("*.yml")) if tasks.is_dir() else []:
            todo += [n for n in _INCLUDED_ROLE.findall(f.read_text(errors="replace")) if (roles_dir / n).is_dir()]
    return sorted(seen)


def _tools() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ansible = version("ansible-core")
    except PackageNotFoundError:
        ansible = "?"
    return {"ansible-core": ansible, "testbed": distribution.version()}


def common_parts(*, playbook: list[dict[str, Any]], roles: list[str], roles_dir: Path,
                 variables: dict[str, Any], inventory: dict[str, Any],
                 sources: dict[str, str] | None = None, known_hosts: Path | None = None) -> dict[str, str]:
    """The parts every host of one set-up shares (see the module); ``sources``: :func:`source_commits`;
    ``known_hosts``: the testbed's pinned host keys (a missing file pins none)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("PIP_", "ANSIBLE_"))}
    parts = {"plan": _sha(playbook), "variables": _sha(variables), "inventory": _sha(inventory),
             "environment": _sha(env), "tools": _sha(_tools()), "host keys": _sha(pinned_keys(known_hosts))}
    if sources:
        parts["sources"] = _sha(sources)
    for r in role_closure(roles, roles_dir):
        d = roles_dir / r
        parts[f"role {r}"] = role_digest(d) if d.is_dir() else "missing"
    return parts


def pinned_keys(known_hosts: Path | None) -> list[str]:
    """The pinned host keys of a known_hosts file as sorted lines (the order of pinning does not matter)."""
    try:
        text = known_hosts.read_text() if known_hosts is not None else ""
    except FileNotFoundError:
        text = ""
    return sorted(" ".join(ln.split()) for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))


_HEX = re.compile(r"[0-9a-f]{7,40}")


def source_refs(plan_vars: dict[str, Any], steps: list[tuple[str, dict[str, Any]]],
                extravars: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The sources a plan checks out by a name that can move (a branch, a tag, HEAD): {label: (url, ref)}.

    A role entry's ``<prefix>_repo`` with its ``<prefix>_version`` (the effective value: profile vars < the
    entry's vars < the spec's and extra vars), and ``--source`` overrides given as a URL. A commit id, a
    template or a local bundle (already a commit) needs nothing more.
    """
    out: dict[str, tuple[str, str]] = {}
    for i, (role, svars) in enumerate(steps):
        values = {**plan_vars, **svars, **extravars}
        for key, url in values.items():
            if not (key.endswith("_repo") and isinstance(url, str)) or "{{" in url:
                continue
            ref = values.get(key[: -len("_repo")] + "_version") or "HEAD"
            if isinstance(ref, str) and "{{" not in ref and not _HEX.fullmatch(ref):
                out[f"{i} {role} {key}"] = (url, ref)
    overrides = extravars.get("testbed_source_overrides")
    for name, o in (overrides or {}).items() if isinstance(overrides, dict) else ():
        if isinstance(o, dict) and o.get("kind") == "url" and not _HEX.fullmatch(str(o.get("ref") or "")):
            out[f"override {name}"] = (str(o.get("location")), str(o.get("ref") or "HEAD"))
    return out


def source_commits(refs: dict[str, tuple[str, str]], timeout: float = 15) -> dict[str, str]:
    """Each moving ref resolved to its commit with ``git ls-remote`` from this machine, in parallel; one that
    cannot be resolved (no route, no credentials) is named by its ref ("unresolved"): ``--verify`` still runs."""
    def one(url: str, ref: str) -> str:
        r = git.run(["ls-remote", url, ref, f"{ref}^{{}}"], timeout=timeout)
        lines = [ln.split("\t") for ln in r.stdout.splitlines() if "\t" in ln] if r.returncode == 0 else []
        peeled = [sha for sha, name in lines if name.endswith("^{}")]
        return (peeled or [sha for sha, _ in lines] or [f"unresolved {ref}"])[0]

    if not refs:
        return {}
    keys = list(refs)
    return dict(zip(keys, remote.each(lambda k: one(*refs[k]), keys, limit=8, name="ls-remote"), strict=True))


def host_address(common: dict[str, str], inventory: dict[str, Any], host: str) -> tuple[str, dict[str, str]]:
    """(address, parts) of ``host``: the common parts and its own inventory entry."""
    parts = {**common, "host": _sha(inventory.get("all", {}).get("hosts", {}).get(host))}
    return _sha(parts), parts


def record(testbed: str, host: str, plan: str, address: str, parts: dict[str, str]) -> str:
    """The record written on ``host`` after a successful set-up (JSON; hashes and names only)."""
    return json.dumps({"format": FORMAT, "testbed": testbed, "host": host, "plan": plan, "address": address,
                       "parts": parts, "applied_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                      sort_keys=True)


def record_path(host: str | None = None) -> str:
    """The record's path under the login user's home; ``host``: a file per host (a home every host shares)."""
    if host is None:
        return RECORD
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}", host):
        raise ValueError(f"not a host name: {host!r}")
    return RECORD.replace("setup.json", f"setup-{host}.json")


def pending_path(host: str | None = None) -> str:
    """The pending mark's path beside the record (``+``: never part of a host name, so never another's record)."""
    return record_path(host).removesuffix(".json") + "+pending.json"


def pending(plan: str) -> str:
    """The pending mark a set-up leaves on a host until its play there finished (JSON; the plan and a time)."""
    return json.dumps({"format": FORMAT, "plan": plan,
                       "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, sort_keys=True)


def unfinished(text: str) -> str | None:
    """Why the host's pending mark (``text``) says its set-up is not to be trusted; None: no mark."""
    if not text.strip():
        return None
    try:
        mark = json.loads(text)
    except ValueError:
        mark = {}
    mark = mark if isinstance(mark, dict) else {}
    plan, at = mark.get("plan"), mark.get("started_at")
    about = ", ".join(x for x in (f"'{plan}'" if isinstance(plan, str) else "",
                                  f"started {at}" if isinstance(at, str) else "") if x)
    return f"{UNFINISHED}" + (f" ({about})" if about else "")


UNFINISHED = "an earlier set-up did not finish"
"""How a host whose pending mark was found is told apart (from "no record" and from drift)."""


def probe_command(keep: str | None, mark: str, host: str | None = None) -> str:
    """The probe's command: print the pending mark, :data:`PENDING_MARK`, then what :func:`read_command` prints.
    Unless ``keep`` is None (check mode, nothing changed): a record beside a pending mark is not trusted (removed),
    and a host whose record is gone gets the pending mark ``mark`` until a finished play replaces it."""
    path, mark_path = f'"$HOME/{record_path(host)}"', f'"$HOME/{pending_path(host)}"'
    out = f'cat {mark_path} 2>/dev/null; printf "\\n%s\\n" {PENDING_MARK}; '
    if keep is None:
        return out + read_command(None, host)
    return (f"{out}[ -e {mark_path} ] && rm -f {path}; {read_command(keep, host)}; [ -e {path} ] || "
            f'{{ mkdir -p "$HOME/{os.path.dirname(RECORD)}" && (umask 077 && printf %s {shlex.quote(mark)} > '
            f"{mark_path}); }}; true")


PENDING_MARK = "--testbed-pending-mark--"


def read_command(keep: str | None, host: str | None = None) -> str:
    """The host-side command that prints the record and then removes it unless it holds the address ``keep``
    (``None``: never remove; ``""``: always); it never fails. ``host``: the record of that host in a shared home."""
    path = f'"$HOME/{record_path(host)}"'
    if keep is None:
        return f"cat {path} 2>/dev/null; true"
    if keep:
        if not re.fullmatch(r"[0-9a-f]{64}", keep):
            raise ValueError(f"not a set-up address: {keep!r}")
        return (f"cat {path} 2>/dev/null; grep -qF '\"address\": \"{keep}\"' {path} 2>/dev/null "
                f"|| rm -f {path}; true")
    return f"cat {path} 2>/dev/null; rm -f {path}; true"


def write_command(text: str, host: str | None = None) -> str:
    """The host-side command that writes ``text`` as the record, atomically (a temp file, then a rename), and
    removes the pending mark."""
    path = "$HOME/" + record_path(host)
    return (f'umask 077 && mkdir -p "$HOME/{os.path.dirname(RECORD)}" && printf %s {shlex.quote(text)} > "{path}.tmp"'
            f' && mv -f "{path}.tmp" "{path}" && rm -f "$HOME/{pending_path(host)}"')


@dataclass
class Verdict:
    """What the probe found on one host: whether its record matches, and why not."""

    host: str
    unchanged: bool
    reason: str  # "" when unchanged; else what differs (for humans)


def compare(testbed: str, host: str, plan: str, address: str, parts: dict[str, str], text: str | None,
            error: str | None = None, mark: str = "") -> Verdict:
    """Compare what ``host`` recorded (``text``: the record, or None/empty) with the address wanted now; ``mark``:
    its pending mark (an earlier set-up that did not finish there: whatever the record says, it runs again)."""
    if error:
        return Verdict(host, False, f"no answer ({error})")
    why = unfinished(mark)
    if why:
        return Verdict(host, False, why)
    if not text or not text.strip():
        return Verdict(host, False, "no record of a set-up")
    try:
        rec = json.loads(text)
    except ValueError:
        return Verdict(host, False, "unreadable record")
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        return Verdict(host, False, "record of another format")
    if rec.get("testbed") != testbed or rec.get("host") != host:
        return Verdict(host, False, f"record of another host ({rec.get('testbed')}/{rec.get('host')})")
    if rec.get("address") == address:
        return Verdict(host, True, "")
    if rec.get("plan") != plan:
        return Verdict(host, False, f"last set-up was '{rec.get('plan')}'")
    old = rec.get("parts")
    old = old if isinstance(old, dict) else {}
    differ = sorted(k for k in set(parts) | set(old) if parts.get(k) != old.get(k))
    return Verdict(host, False, "changed: " + ", ".join(differ) if differ else "changed")


# --- images: what a set-up installs, whatever hosts it is for ---------------------------------------------
TESTBED_PARTS = ("inventory", "host keys")
"""Parts that say which hosts a set-up is for rather than what it installs. A host whose record differs only in
these (a host of the testbed rebuilt, one added) or that booted from an image of this set-up runs only the
per-testbed roles (:func:`per_testbed_roles`): everything else it holds already."""
IMAGE_RECORD = paths.IMAGE_RECORD
HOST_VARS = ("testbed_cache_dir", "testbed_progress_file", "testbed_subnet")
"""Play-wide variables that name this testbed or this machine's folders, not what is installed (left out of an
image's key)."""


def image_parts(common: dict[str, str], play_vars: dict[str, Any], base_image: str) -> dict[str, str]:
    """The parts of an image's key: the set-up's parts (:func:`common_parts`) less those that name the hosts, the
    testbed-wide variables that shape what is installed (provider, hardware, offline...), and the base image the
    set-up ran on (a different base is a different image)."""
    shaping = {k: v for k, v in play_vars.items() if k not in HOST_VARS and not k.startswith("ansible_")}
    parts = {k: v for k, v in common.items() if k not in TESTBED_PARTS}
    parts["testbed variables"] = _sha(shaping)
    parts["base image"] = _sha(base_image)
    return parts


def image_key(parts: dict[str, str]) -> str:
    """An image's content address (sha256 of its parts)."""
    return _sha(parts)


def image_record(key: str, plan: str, parts: dict[str, str], source: str) -> str:
    """What an image holds at :data:`IMAGE_RECORD` (JSON; hashes and names only)."""
    return json.dumps({"format": FORMAT, "key": key, "plan": plan, "parts": parts, "source": source,
                       "baked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, sort_keys=True)


def read_image_key(text: str) -> str | None:
    """The key of an image record's text; None when there is none or it cannot be read."""
    try:
        rec = json.loads(text)
    except ValueError:
        return None
    key = rec.get("key") if isinstance(rec, dict) and rec.get("format") == FORMAT else None
    return key if isinstance(key, str) and re.fullmatch(r"[0-9a-f]{64}", key) else None


def per_testbed_roles(roles: Iterable[str], roles_dir: Path) -> list[str]:
    """The roles whose work depends on the testbed's other hosts (its SSH mesh, its MPI hostfiles): those whose
    ``meta/testbed.yml`` says ``per_testbed: true``. Only they run on a host that holds the rest already."""
    from ruamel.yaml import YAML

    out = []
    for r in roles:
        f = roles_dir / r / "meta" / "testbed.yml"
        data = YAML(typ="safe").load(f.read_text()) if f.is_file() else None
        if isinstance(data, dict) and data.get("per_testbed") is True:
            out.append(r)
    return out


def only_testbed_parts_differ(text: str | None, parts: dict[str, str]) -> bool:
    """Whether the record ``text`` holds this set-up but for the hosts it was for (:data:`TESTBED_PARTS`)."""
    try:
        rec = json.loads(text or "")
    except ValueError:
        return False
    old = rec.get("parts") if isinstance(rec, dict) and rec.get("format") == FORMAT else None
    if not isinstance(old, dict):
        return False
    return all(parts.get(k) == old.get(k) for k in set(parts) | set(old) if k not in TESTBED_PARTS)
