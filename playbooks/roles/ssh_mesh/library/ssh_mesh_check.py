#!/usr/bin/python
"""Ansible module of the ssh_mesh role: check on one host, in one call, what the mesh promises for every peer."""

import base64
import hashlib
import hmac
import os
import re
import socket
import subprocess

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ssh_mesh_check
short_description: Check this host's side of the SSH mesh for every peer, and log in to a few of them
description:
  - By content, for every peer, on this host (O(peers) work, no network): its user key is in C(authorized_keys),
    each of its host keys is pinned in C(known_hosts) (or C(/etc/ssh/ssh_known_hosts)) under its name and its
    address, and its name resolves (getaddrinfo, as ssh resolves it) to its address first.
  - Then logs in with C(ssh -o BatchMode=yes -o StrictHostKeyChecking=yes) to each peer named in C(login), by
    its name and by its address: that proves the mechanism end to end (sshd accepting the key, ssh using the
    pinned keys, ~/.ssh/config, name resolution) for those pairs.
  - Never changes anything.
options:
  peers:
    description: Every peer, each with C(name), C(address), C(user_key) (a public key line) and C(host_keys)
      (C(ssh-keyscan) lines or C(type base64) pairs).
    type: list
    elements: dict
    required: true
  login:
    description: Names of peers to log in to (C(ssh TARGET true)), by name and by address.
    type: list
    elements: str
    default: []
  port:
    description: The peers' SSH port.
    type: int
    default: 22
  resolve:
    description: Whether each peer's name must resolve to its address (false where the role wrote no
      C(/etc/hosts), e.g. on a Slurm cluster without root: C(~/.ssh/config) names each peer's HostName instead).
    type: bool
    default: true
  timeout:
    description: Connect timeout of each login, in seconds.
    type: int
    default: 10
  authorized_keys:
    description: This user's authorized_keys file.
    type: path
    default: ~/.ssh/authorized_keys
  known_hosts:
    description: Files of pinned host keys, read in order; a key found in any of them is pinned.
    type: list
    elements: path
    default: [~/.ssh/known_hosts, /etc/ssh/ssh_known_hosts]
author: testbed
"""


MAX_SHOWN = 20  # problems listed in the failure message (the count is always complete)


def _read_lines(path):
    try:
        with open(os.path.expanduser(path), errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def _key_pairs(line):
    """(type, base64) pairs found in a key line, whatever options or host patterns precede them."""
    words = line.split()
    out = set()
    for i in range(len(words) - 1):
        w = words[i]
        if w.startswith(("ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-")) and words[i + 1][:4] == "AAAA":
            out.add((w, words[i + 1]))
    return out


def _hashed_match(pattern, host):
    """A HashKnownHosts entry (|1|salt|hash) against one host name."""
    parts = pattern.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt, want = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (TypeError, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, host.encode(), hashlib.sha1).digest(), want)


def _glob(pattern, host):
    """ssh's wildcards: ``*`` and ``?`` only (brackets are literal: ``[name]:port``)."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.match(rx + r"\Z", host) is not None


def _host_matches(field, host):
    """ssh's host-pattern list semantics: a match unless a negated pattern also matches."""
    hit = False
    for pat in field.split(","):
        if pat.startswith("|"):
            hit = hit or _hashed_match(pat, host)
        elif pat.startswith("!"):
            if _glob(pat[1:], host):
                return False
        elif _glob(pat, host):
            hit = True
    return hit


def pinned(lines, host):
    """The (type, base64) keys pinned for ``host`` and those revoked, over known_hosts lines."""
    keys, revoked = set(), set()
    for line in lines:
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        marker = None
        if words[0].startswith("@"):
            marker, words = words[0], words[1:]
        if len(words) < 3 or marker == "@cert-authority" or not _host_matches(words[0], host.lower()):
            continue
        (revoked if marker == "@revoked" else keys).add((words[1], words[2]))
    return keys, revoked


def resolves_to(name):
    """The addresses ``name`` resolves to, in the order ssh tries them (getaddrinfo), without repeats."""
    try:
        found = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    out = []
    for ai in found:
        if ai[4][0] not in out:
            out.append(ai[4][0])
    return out


def content_problems(peers, port, authorized, known, resolve=True):
    """What this host's files and resolver get wrong, peer by peer (an empty list: nothing)."""
    problems = []
    allowed = set()
    for line in authorized:
        if line.strip() and not line.lstrip().startswith("#"):
            allowed |= _key_pairs(line)
    for p in peers:
        name, addr = str(p.get("name") or ""), str(p.get("address") or "")
        user = _key_pairs(str(p.get("user_key") or ""))
        if not user:
            problems.append(f"{name}: no user key was read from it")
        elif not user & allowed:
            problems.append(f"{name}: its key is not in authorized_keys")
        host_keys = set()
        for line in p.get("host_keys") or []:
            host_keys |= _key_pairs(line)
        if not host_keys:
            problems.append(f"{name}: no host key was scanned from it")
        for target in sorted(set([name, addr])):
            lookup = target if port == 22 else f"[{target}]:{port}"
            keys, revoked = pinned(known, lookup)
            missing = host_keys - keys
            if missing or host_keys & revoked:
                bad = len(missing | (host_keys & revoked))
                problems.append(f"{name}: {bad} of its {len(host_keys)} host keys not pinned under {lookup}")
        got = resolves_to(name) if resolve else [addr]
        if got[:1] != [addr]:  # ssh connects to the first address that answers
            problems.append("{} resolves to {}, not to {} first".format(name, ", ".join(got) or "nothing", addr))
    return problems


def login_problems(targets, port, timeout):
    """``ssh TARGET true`` for each target, strictly against the pinned keys; failures with ssh's last words."""
    problems = []
    for target in targets:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "UpdateHostKeys=no",
                "-o", f"ConnectTimeout={timeout}", "-p", str(port), target, "true"]
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               timeout=timeout * 3 + 10, check=False)
            if r.returncode != 0:
                last = (r.stderr.decode(errors="replace").strip().splitlines() or [f"exit {r.returncode}"])[-1]
                problems.append(f"no passwordless SSH to {target}: {last}")
        except subprocess.TimeoutExpired:
            problems.append(f"no passwordless SSH to {target}: no answer in {timeout * 3 + 10} s")
    return problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            peers=dict(type="list", elements="dict", required=True),
            login=dict(type="list", elements="str", default=[]),
            port=dict(type="int", default=22),
            resolve=dict(type="bool", default=True),
            timeout=dict(type="int", default=10),
            authorized_keys=dict(type="path", default="~/.ssh/authorized_keys"),
            known_hosts=dict(type="list", elements="path",
                             default=["~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts"]),
        ),
        supports_check_mode=True,
    )
    a = module.params
    known = []
    for path in a["known_hosts"]:
        known += _read_lines(path)
    problems = content_problems(a["peers"], a["port"], _read_lines(a["authorized_keys"]), known, a["resolve"])
    address = dict((str(p.get("name")), str(p.get("address") or "")) for p in a["peers"])
    unknown = [n for n in a["login"] if n not in address]
    if unknown:
        module.fail_json(msg="login names hosts that are not peers: {}".format(", ".join(unknown)))
    targets = []
    for n in a["login"]:
        targets += [t for t in (n, address[n]) if t and t not in targets]
    problems += login_problems(targets, a["port"], a["timeout"])
    summary = f"{len(a['peers'])} peers checked by content, logged in to {', '.join(targets) or 'none'}"
    if problems:
        shown = "; ".join(problems[:MAX_SHOWN]) + ("; ..." if len(problems) > MAX_SHOWN else "")
        module.fail_json(msg=f"ssh mesh from {socket.gethostname()}: {len(problems)} problems: {shown}",
                         problems=problems)
    module.exit_json(changed=False, msg=summary)


if __name__ == "__main__":
    main()
