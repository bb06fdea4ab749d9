"""SSH for a testbed: its key pair, pinned host keys, a generated ssh_config and Ansible inventory.

Files per testbed under ``.testbed/testbeds/<name>/`` so that plain tools work without testbed:
``ssh -F .testbed/testbeds/local/ssh_config node0`` and
``ansible-playbook -i .testbed/testbeds/local/inventory.yml site.yml``.

Host keys are pinned per testbed under the host's own name (``HostKeyAlias``): trust on first use
(``StrictHostKeyChecking accept-new``), verified after; a changed key is refused by OpenSSH and
reported as such.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from testbed import paths, quoting
from testbed.errors import TestbedError
from testbed.hosts import Host

T = TypeVar("T")

KEY_NAME = "id_ed25519"
_KNOWN_HOSTS_LOCK = threading.Lock()  # known_hosts is read, changed and written whole


def key_path(testbed: str) -> Path:
    return paths.testbed_dir(testbed) / KEY_NAME


def ensure_keypair(testbed: str) -> tuple[Path, str]:
    """The testbed's ed25519 key pair (created 0600 on first use); returns (private path, public line)."""
    priv = key_path(testbed)
    pub = priv.with_suffix(".pub")
    if not priv.exists() or not pub.exists():
        priv.unlink(missing_ok=True)
        pub.unlink(missing_ok=True)
        import shutil  # here, not at the top: exec's start-up does not need it

        if shutil.which("ssh-keygen") is None:
            raise TestbedError("ssh-keygen is not installed", where="this machine",
                               fix="apt-get install openssh-client (testbed doctor checks this)")
        old = os.umask(0o077)
        try:
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"testbed-{testbed}",
                            "-f", str(priv)], check=True, capture_output=True)
        finally:
            os.umask(old)
    priv.chmod(0o600)
    return priv, pub.read_text().strip()


def known_hosts_path(testbed: str) -> Path:
    return paths.testbed_dir(testbed) / "known_hosts"


def ssh_config_path(testbed: str) -> Path:
    return paths.testbed_dir(testbed) / "ssh_config"


def inventory_path(testbed: str) -> Path:
    return paths.testbed_dir(testbed) / "inventory.yml"


CONTROL_PREFIX = "tbcm-"
CONTROL_OWNER = "owner"


def control_dir(testbed: str, *, make: bool = True) -> Path:
    """Where OpenSSH keeps the testbed's multiplexed connections (testbed's own; Ansible's under ``ansible/``):
    ``/tmp/tbcm-<uid>-<tag>``, a short path (unix sockets are limited to ~100 bytes).

    The testbed owns it: it is made (``make``) with the testbed's ssh_config and set-up, its ``owner`` file names
    the testbed's folder (:func:`control_dirs`), and destroy removes it (:func:`close_connections`, ``remove``).
    """
    import hashlib
    import stat

    owner = paths.home() / "testbeds" / testbed  # (paths.testbed_dir would make that folder)
    tag = hashlib.sha256(str(owner).encode()).hexdigest()[:10]
    d = Path(f"/tmp/{CONTROL_PREFIX}{os.getuid()}-{tag}")
    if make:
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise TestbedError(f"{d} is not a private folder of this user: testbed will not keep SSH connections "
                               "there", where=str(d), fix=f"remove {d} (another user or program made it), then retry")
        marker = d / CONTROL_OWNER
        if not marker.exists():
            marker.write_text(f"{owner}\n")
    return d


def control_dirs() -> list[tuple[Path, Path | None]]:
    """This user's control folders in /tmp, each with the testbed folder that owns it (None: no owner recorded)."""
    out: list[tuple[Path, Path | None]] = []
    for d in sorted(Path("/tmp").glob(f"{CONTROL_PREFIX}{os.getuid()}-*")):
        try:
            owner: Path | None = Path((d / CONTROL_OWNER).read_text().strip())
        except (OSError, ValueError):
            owner = None
        out.append((d, owner))
    return out


def pin_host_keys(testbed: str, host: str, key_lines: list[str]) -> None:
    """Record ``host``'s public keys (``type base64`` lines) as trusted, replacing older entries."""
    pin_many(testbed, {host: key_lines})


def pin_many(testbed: str, keys: Mapping[str, list[str]]) -> None:
    """Record each host's public keys as trusted, replacing its older entries, in one rewrite of the file; under
    one lock, since a provision pins its hosts from many threads at once (each rewrite reads what the others
    wrote)."""
    with _KNOWN_HOSTS_LOCK:
        kh = known_hosts_path(testbed)
        lines = [ln for ln in (kh.read_text().splitlines() if kh.exists() else []) if ln.split(" ", 1)[0] not in keys]
        for host, key_lines in keys.items():
            for k in key_lines:
                parts = k.split()
                lines.append(f"{host} {parts[0]} {parts[1]}")
        kh.write_text("\n".join(lines) + "\n")
        kh.chmod(0o600)


def pinned_keys(testbed: str, host: str) -> set[str]:
    """``host``'s pinned keys, as ``type base64``."""
    kh = known_hosts_path(testbed)
    with _KNOWN_HOSTS_LOCK:
        text = kh.read_text() if kh.exists() else ""
    return {" ".join(ln.split()[1:3]) for ln in text.splitlines() if ln.split(" ", 1)[0] == host}


def forget_host_keys(testbed: str, hosts: list[str] | None = None) -> None:
    with _KNOWN_HOSTS_LOCK:
        kh = known_hosts_path(testbed)
        if not kh.exists():
            return
        if hosts is None:
            kh.unlink()
            return
        keep = [ln for ln in kh.read_text().splitlines() if ln.split(" ", 1)[0] not in hosts]
        kh.write_text("\n".join(keep) + ("\n" if keep else ""))


def _key_for(testbed: str, h: Host) -> str:
    """The host's private key file, absolute (a relative key is the working folder's, as ``ssh -i`` reads it)."""
    return os.path.abspath(os.path.expanduser(h.key)) if h.key else str(key_path(testbed))


# the user's own OpenSSH configuration ----------------------------------------------------------------------------
USER_SSH_CONFIG = "~/.ssh/config"
_MULTI = ("identityfile",)
_KEPT = ("hostname", "user", "port", "proxyjump", "proxycommand", "identityfile", "identitiesonly", "identityagent")


def _ssh_g(args: list[str], where: str) -> dict[str, list[str]]:
    """``ssh -G``'s view of a host (what OpenSSH would use to connect, nothing connected): key -> values."""
    try:
        r = subprocess.run(["ssh", "-G", *args], capture_output=True, text=True, timeout=15,
                           stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"reading {where} for '{args[-1]}' took over 15 s (a Match exec that hangs?)",
                           where=where, fix="fix that file, or set provider.ssh_config: null to ignore it") from None
    except FileNotFoundError:
        raise TestbedError("ssh is not installed", where="this machine",
                           fix="apt-get install openssh-client (testbed doctor checks this)") from None
    if r.returncode != 0:
        raise TestbedError(f"OpenSSH cannot read {where} for '{args[-1]}': "
                           f"{(r.stderr.strip().splitlines() or ['ssh -G failed'])[-1]}", where=where,
                           fix="fix that file (ssh -G HOST shows what OpenSSH makes of it), or set "
                               "provider.ssh_config: null to ignore it")
    out: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key in _KEPT:
            out.setdefault(key, []).append(value.strip())
    return out


def user_ssh_config(host: str, config: str | None = USER_SSH_CONFIG) -> dict[str, Any]:
    """What the user's own OpenSSH config (``config``, default ``~/.ssh/config``) sets for ``host``: hostname,
    user, port, proxyjump or proxycommand (the one in effect), identityfile (a list), identitiesonly and
    identityagent, only where the file sets them.

    Read with ``ssh -G`` (Host, Match and Include as OpenSSH reads them; nothing is connected) and compared with
    what OpenSSH does with no config. A ``User`` equal to this machine's login name is found in the file's text.
    {} when ``config`` is None or no such file exists."""
    if not config:
        return {}
    path = os.path.expanduser(config)
    if not os.path.isfile(path):
        return {}
    got = _ssh_g(["-F", path, host], config)
    base = _ssh_g(["-F", "/dev/null", host], config)
    out: dict[str, Any] = {}
    for key in _KEPT:
        if key in got and got[key] != base.get(key):
            out[key] = got[key] if key in _MULTI else got[key][0]
    if "user" not in out and got.get("user") and _names_user(path, got["user"][0]):
        out["user"] = got["user"][0]
    for key in ("proxyjump", "proxycommand"):
        if out.get(key) == "none":
            out.pop(key)
    return out


def proxy_command(command: str, alias: str, where: str) -> str:
    """A ProxyCommand from the user's config as the testbed's ssh_config must give it: the same text (OpenSSH
    passes it to the shell as written, so the user's own quoting stands), with ``%n`` -- the name the user would
    type, ``alias`` -- written out, since the testbed's ssh is given its own name for the host. A control
    character would end the line (and add options): refused."""
    import re

    if re.search(r"[\x00-\x1f\x7f]", command):
        raise TestbedError(f"the ProxyCommand for '{alias}' holds a control character", where=where,
                           fix="fix that ProxyCommand, or set provider.ssh_config: null to ignore the file")
    return re.sub(r"%(.)", lambda m: alias.replace("%", "%%") if m.group(1) == "n" else m.group(0), command)


def _names_user(path: str, user: str, depth: int = 0) -> bool:
    """Whether the config at ``path`` (or a file it includes) has a ``User <user>`` line."""
    import glob
    import re

    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return False
    if re.search(rf"(?im)^\s*User\s*=?\s*\"?{re.escape(user)}\"?\s*$", text):
        return True
    if depth >= 4:
        return False
    for inc in re.findall(r"(?im)^\s*Include\s*=?\s*(.+)$", text):
        for pattern in inc.split():
            full = os.path.expanduser(pattern)
            if not os.path.isabs(full):
                full = os.path.join(os.path.expanduser("~/.ssh"), full)
            if any(_names_user(f, user, depth + 1) for f in sorted(glob.glob(full))[:50]):
                return True
    return False


def write_ssh_config(testbed: str, hosts: list[Host], *, connect_timeout: int = 10) -> Path:
    """Generate the testbed's ssh_config (one Host block per host, multiplexed connections).

    A host whose facts hold ``ssh`` (a lab host with no key in its spec) logs in as the user's own OpenSSH
    would: the IdentityFiles of the user's ssh config, then the testbed's key, with the ssh-agent
    (SSH_AUTH_SOCK) offered too (no IdentitiesOnly unless the user's config says so); the jump hosts its
    ProxyJump names get blocks from the user's config. Host keys stay pinned in the testbed's known_hosts.

    Every value reaches the template written as ssh_config reads it back (quoted, ``%`` doubled where OpenSSH
    expands tokens), and no value the template writes may hold a line break: what cannot be written is refused
    with a TestbedError naming it, before the file is written.
    """
    import jinja2

    kh = known_hosts_path(testbed)
    kh.touch(mode=0o600, exist_ok=True)
    tmpl_path = paths.find_resource("templates", "ssh_config.j2")
    if tmpl_path is None:
        # lazy: start-up (testbed status and exec load this module)
        from testbed.distribution import install_command

        raise TestbedError("the ssh_config template is missing", where="templates/ssh_config.j2",
                           fix=f"reinstall testbed ({install_command(reinstall=True)}), or put a "
                               "templates/ssh_config.j2 in the working directory")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, autoescape=False,  # noqa: S701 (not HTML)
                             finalize=lambda v: _one_line(v, tmpl_path))
    where = f"testbed {testbed}: {ssh_config_path(testbed)}"
    cd = _arg(str(control_dir(testbed)), "the control folder", where, tokens=True, path=True)
    values = {"testbed": testbed, "config_path": shlex.quote(str(ssh_config_path(testbed))),
              "known_hosts": _arg(str(kh), "the known_hosts file", where, tokens=True, path=True),
              "control_dir": cd, "control_path": f'{cd[:-1]}/%C"' if cd.endswith('"') else f"{cd}/%C",
              "connect_timeout": int(connect_timeout)}  # ControlPath: the folder, then OpenSSH's %C
    try:
        text = env.from_string(tmpl_path.read_text()).render(
            **values, hosts=[_host_block(testbed, h, where) for h in hosts], jumps=_jump_blocks(hosts, where))
    except jinja2.TemplateError as e:
        raise TestbedError(f"cannot render {tmpl_path}: {e}", where=str(tmpl_path),
                           fix="fix the template (variables: testbed, hosts, known_hosts, control_dir, ...)") from None
    p = ssh_config_path(testbed)
    p.write_text(text)
    p.chmod(0o600)
    return p


def _host_block(testbed: str, h: Host, where: str) -> dict[str, Any]:
    """A host's values for the template, each written as ssh_config reads it back (:func:`_arg`): ``identity``
    (the first key), ``identities`` (every IdentityFile, in order), ``identities_only`` and ``identity_agent``."""
    own = h.facts.get("ssh") if isinstance(h.facts.get("ssh"), dict) else None
    what = f"host {h.name}'s"
    if own is None:  # a key of its own, or the testbed's: only that key is offered
        ids = [_arg(_key_for(testbed, h), f"{what} key file", where, tokens=True, path=True)]
        only, agent = True, None
    else:  # the user's config's IdentityFiles as OpenSSH printed them (its tokens kept), then the testbed's key
        ids = [*(_arg(k, f"{what} IdentityFile", where) for k in own.get("identities", [])),
               _arg(str(key_path(testbed)), "the testbed's key file", where, tokens=True, path=True)]
        only, agent = bool(own.get("identities_only")), own.get("identity_agent")
    proxy = h.facts.get("ssh_proxy_command")  # a lab host's, from the user's config (never beside a ProxyJump)
    return {**h.to_dict(), **_names(h.name, h.address, h.user, h.proxy_jump, what, where),
            "identity": ids[0], "identities": ids, "identities_only": only,
            "identity_agent": _arg(agent, f"{what} IdentityAgent", where, tokens=True, env=True) if agent else None,
            "proxy_command": str(proxy) if proxy and not h.proxy_jump else None}


def _names(name: str, address: object, user: object, jump: object, what: str, where: str) -> dict[str, Any]:
    """Host (and HostKeyAlias), HostName, User and ProxyJump as ssh_config reads them back (None stays None)."""
    if user and re.search(r"%|\$\{", str(user)):
        raise quoting.refused(f"{what} login user", str(user), "holds '%' or '${', which newer OpenSSH releases "
                              "expand in User", where=where, fix="use the plain login name")
    return {"name": _arg(name, f"{what} name", where),
            "address": _arg(address, f"{what} address", where, tokens=True) if address else address,
            "hostname": _arg(address, f"{what} address", where, tokens=True) if address else address,
            "user": _arg(user, f"{what} login user", where) if user else user,
            "proxy_jump": _arg(jump, f"{what} ProxyJump", where) if jump else jump}


def _arg(value: object, what: str, where: str, *, tokens: bool = False, path: bool = False, env: bool = False) -> str:
    """``value`` as one ssh_config argument (:func:`testbed.quoting.ssh_arg`), or one TestbedError naming it."""
    try:
        return quoting.ssh_arg(str(value), tokens=tokens, path=path, env=env)
    except ValueError as e:
        raise quoting.refused(what, str(value), f"{e}: it cannot be written into the testbed's ssh_config",
                              where=where, fix=f"change {what} to one without it (quoted values of ssh_config: "
                                               "ssh_config(5))") from None


def _one_line(value: T, template: Path) -> T:
    """Jinja's ``finalize``: every value the ssh_config template writes stays on its line (a line break would
    start a directive of its own, such as a ProxyCommand run on this machine)."""
    why = quoting.line_problem(str(value)) if value is not None else None
    if why is not None:
        raise quoting.refused("a value for the ssh_config", str(value), why, where=str(template),
                              fix="write only the values testbed passes (quoted for ssh_config), or change that value")
    return value


def _jump_blocks(hosts: list[Host], where: str) -> list[dict[str, Any]]:
    """The jump hosts the hosts' ProxyJump names, as the user's ssh config defines them (each alias once; never
    one of the testbed's own hosts, which have their blocks)."""
    names = {h.name for h in hosts}
    out: dict[str, dict[str, Any]] = {}
    for h in hosts:
        jumps = h.facts.get("ssh_jumps")
        for j in jumps if isinstance(jumps, list) else []:
            if isinstance(j, dict) and j.get("alias") and j["alias"] not in names and str(j["alias"]) not in out:
                what = f"jump host {j['alias']}'s"
                named = _names(str(j["alias"]), j.get("hostname"), j.get("user"), j.get("proxy_jump"), what, where)
                out[str(j["alias"])] = {
                    **named, "alias": named["name"], "source": j.get("source") or USER_SSH_CONFIG,
                    "port": int(j["port"]) if j.get("port") else None,
                    "identities": [_arg(k, f"{what} IdentityFile", where) for k in j.get("identities") or []],
                    "identities_only": bool(j.get("identities_only")),
                    "identity_agent": _arg(j["identity_agent"], f"{what} IdentityAgent", where, tokens=True, env=True)
                    if j.get("identity_agent") else None,
                    "proxy_command": None if j.get("proxy_jump") else j.get("proxy_command")}
    return list(out.values())


def inventory(testbed: str, hosts: list[Host], variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one Ansible inventory of a testbed (set-up and plain ``ansible -i`` alike): SSH through its ssh_config.

    ``testbed_mesh_address`` is the address the hosts use among themselves (``Host.mesh_address``: a cloud's
    private IP when the provider knows it, else the address the controller uses).
    """
    cfg, key = str(ssh_config_path(testbed)), str(key_path(testbed))
    for p in (cfg, key):
        if (why := quoting.ansible_problem(p)) is not None:
            raise quoting.refused("the path", p, f"{why}: it cannot be written into an Ansible inventory",
                                  where=f"testbed {testbed}", fix="set TESTBED_HOME to a plain folder")
    groups: dict[str, list[str]] = {}
    for h in hosts:
        for g in h.groups:
            groups.setdefault(g, []).append(h.name)
    hostvars: dict[str, Any] = {}
    for h in hosts:
        hv: dict[str, Any] = {"ansible_host": h.name, "ansible_user": h.user, "testbed_address": h.address,
                              "testbed_port": h.port, "testbed_mesh_address": h.mesh_address}
        if h.facts.get("python"):
            hv["ansible_python_interpreter"] = h.facts["python"]
        if h.facts.get("accelerator"):
            hv["testbed_accelerator"] = h.facts["accelerator"]
        hostvars[h.name] = hv
    return {
        "all": {
            "hosts": hostvars,
            "vars": {
                "ansible_ssh_common_args": f"-F {shlex.quote(cfg)}",  # Ansible splits it with shlex
                "ansible_ssh_private_key_file": key,
                "ansible_python_interpreter": "auto_silent",
                "testbed_name": testbed,
                **(variables or {}),
            },
            "children": {g: {"hosts": {m: {} for m in members}} for g, members in sorted(groups.items())},
        }
    }


def write_inventory(testbed: str, hosts: list[Host], variables: dict[str, Any] | None = None) -> Path:
    """:func:`inventory` written to the testbed's inventory.yml (YAML is JSON), usable with plain ansible."""
    p = inventory_path(testbed)
    p.write_text(json.dumps(inventory(testbed, hosts, variables), indent=2) + "\n")
    return p


def ssh_options(testbed: str, *, mux: str = "client", connect_timeout: float | None = None) -> list[str]:
    """ssh's options for the testbed's config (``-F ...``), shared by ssh, sftp and rsync's ``-e``.

    ``mux``: "client" uses a running master connection if there is one and never becomes one (so captured
    pipes are not held open by a lingering master); "none" bypasses multiplexing; "auto" is ssh's default.
    """
    opts = ["-F", str(ssh_config_path(testbed))]
    if mux == "client":
        opts += ["-o", "ControlMaster=no"]
    elif mux == "none":
        opts += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
    if connect_timeout is not None:
        opts += ["-o", f"ConnectTimeout={max(1, int(connect_timeout))}"]
    return opts


def ssh_argv(testbed: str, host: str, command: str | None = None, *, tty: bool = False,
             mux: str = "client") -> list[str]:
    """argv for ``ssh`` to ``host`` through the testbed's config; ``command`` runs in the host's shell.

    ``mux``: as for :func:`ssh_options`. Processes are started by testbed.remote, the one transport.
    """
    argv = ["ssh", *ssh_options(testbed, mux=mux)]
    if tty:
        argv.append("-t")
    argv.append(host)
    if command is not None:
        argv += ["--", command]
    return argv


def tcp_open(address: str, port: int, timeout: float = 2) -> bool:
    import socket

    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def describe_ssh_failure(stderr: str, host: str, testbed: str) -> str:
    """Turn OpenSSH's stderr into one actionable sentence."""
    s = stderr.strip()
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in s or "Host key verification failed" in s:
        return (f"the host key of {host} changed since it was pinned: refusing to connect (if the host was "
                f"really rebuilt, run: testbed forget-host {shlex.quote(testbed)} {shlex.quote(host)})")
    if "Permission denied" in s:
        return f"{host} refused the key (Permission denied): check the user and that the testbed key is installed"
    if "Connection refused" in s:
        return f"{host} refused the connection: is sshd running?"
    if "timed out" in s or "No route to host" in s or "Network is unreachable" in s:
        return f"{host} is unreachable ({s.splitlines()[-1] if s else 'timeout'})"
    if "Could not resolve hostname" in s:
        return f"{host}: cannot resolve its address"
    return s.splitlines()[-1] if s else "ssh failed"
