"""The per-testbed roles (ssh_mesh, mpi) applied by testbed itself over its SSH masters, without Ansible.

On hosts that hold a set-up's work already (booted from its image, or only the testbed's hosts changed) only the
per-testbed roles run: a few files that name the other hosts, and checks. Through Ansible that is ~20 tasks and
its start-up (~12 s on 4 local hosts); here it is three parallel round trips, one command per host each:

1. read: the host's home and user, its login user's key (made when missing, as the role does), the host keys its
   sshd offers on its mesh address, and whether OpenMPI's packages are installed;
2. write: the role's templates (``known_hosts.j2``, ``ssh_config.j2``, ``etc_hosts.j2``, ``hostfile.j2``) rendered
   here with the role's defaults, written as the role writes them (the same ``blockinfile`` markers, modes and
   hostfiles); ``mpi_check.c`` from the role's files, compiled when it changed or is missing;
3. verify: the role's own check (``ssh_mesh_check``'s code, run on each host: every peer by content, a login to
   the next host by name and by address), then the MPI check across every host from the first.

The roles stay the one description: their templates, defaults, files and check are read from the role folders.
Used only where that is exact (:func:`why_not`): the roles with their defaults (no variable of theirs set by a
profile, the spec or ``--var``), no ``when``, a home of each host's own, Debian's packages in place, every host
answering; anywhere else Ansible runs the roles as usual.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed import remote
from testbed.setup.events import HostSetupResult
from testbed.textfmt import plural

if TYPE_CHECKING:
    import jinja2

    from testbed.setup.profiles import RoleStep

ROLES = ("ssh_mesh", "mpi")
_PREFIXES = ("ssh_mesh_", "mpi_")


def why_not(roles: list[str], steps: list[RoleStep], plan_vars: dict[str, Any], extravars: dict[str, Any],
            variables: dict[str, Any]) -> str:
    """Why the per-testbed ``roles`` cannot be applied directly ("" when they can)."""
    if not roles or any(r not in ROLES for r in roles):
        return f"roles other than {', '.join(ROLES)}"
    for st in steps:
        if st.role in roles and (st.when or st.vars):
            return f"the profile gives role {st.role} variables or a condition"
    for k in [*plan_vars, *extravars]:
        if k.startswith(_PREFIXES) or k == "testbed_absent_hosts":
            return f"variable {k} is set"
    if (variables.get("testbed_hardware") or {}).get("shared_home"):
        return "the hosts share one home"
    return ""


@dataclass
class Facts:
    """What round 1 read from one host."""

    home: str
    user: str
    python: str
    user_key: str
    host_keys: list[str]
    mpi_missing: list[str] = field(default_factory=list)


def _defaults(roles_dir: Path, role: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((roles_dir / role / "defaults" / "main.yml").read_text()) or {}


def _env() -> jinja2.Environment:
    """Jinja as Ansible's template lookup renders (trim_blocks), with the Ansible filters the roles use."""
    import jinja2

    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined,
                             autoescape=False)  # noqa: S701 (not HTML)
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).strip().lower() in ("yes", "true", "1", "on")
    env.filters["quote"] = lambda v: shlex.quote(str(v))
    return env


def role_vars(roles_dir: Path, roles: list[str], ctx: dict[str, Any]) -> dict[str, Any]:
    """The roles' defaults, each string rendered in ``ctx`` (later defaults may use earlier ones)."""
    env = _env()
    out: dict[str, Any] = {}
    for role in roles:
        for k, v in _defaults(roles_dir, role).items():
            out[k] = env.from_string(v).render({**ctx, **out}) if isinstance(v, str) and "{{" in v else v
    for k, v in out.items():  # a default that names a later one
        if isinstance(v, str) and "{{" in v:
            out[k] = env.from_string(v).render({**ctx, **out})
    return out


def render(roles_dir: Path, role: str, template: str, ctx: dict[str, Any]) -> str:
    return str(_env().from_string((roles_dir / role / "templates" / template).read_text()).render(ctx))


def block(text: str, marker: str, body: str, *, bof: bool = False) -> str:
    """``text`` with ``body`` between ``# BEGIN marker`` and ``# END marker``, as Ansible's blockinfile writes it
    (an old block replaced in place; a new one at the end, or at the start with ``bof``; an empty body removes
    the block)."""
    lines = text.splitlines(keepends=True)
    m0, m1 = f"# BEGIN {marker}", f"# END {marker}"
    n0 = n1 = None
    for i, line in enumerate(lines):
        if line.rstrip("\r\n") == m0:
            n0 = i
        if line.rstrip("\r\n") == m1:
            n1 = i
    if n0 is None or n1 is None:
        n0 = 0 if bof else len(lines)
    elif n0 < n1:
        del lines[n0:n1 + 1]
    else:
        del lines[n1:n0 + 1]
        n0 = n1
    if lines and n0 > 0 and not lines[n0 - 1].endswith("\n"):
        lines[n0 - 1] += "\n"
    new = [m0 + "\n", *[x + "\n" for x in body.splitlines()], m1 + "\n"] if body else []  # empty: no block
    lines[n0:n0] = new
    return "".join(lines)


# --- round 1: read ----------------------------------------------------------------------------------------
_READ = r"""
set -u
key=$1; port=$2; addr=$3; make=$4; name=$5; ktype=$6; shift 6
case $key in "~/"*) key=$HOME/${key#"~/"} ;; esac
if [ "$make" = 1 ]; then
  mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh" || exit 3
  [ -e "$key" ] || ssh-keygen -q -t "$ktype" -N '' -C "testbed@$name" -f "$key" || exit 3
fi
py=$(command -v python3 || command -v python || true)
printf 'home %s\nuser %s\npython %s\n' "$HOME" "$(id -un)" "$py"
[ -s "$key.pub" ] && while IFS= read -r l; do printf 'userkey %s\n' "$l"; done < "$key.pub"
ssh-keyscan -T 5 -p "$port" "$addr" 2>/dev/null | grep -v '^#' | while IFS= read -r l; do printf 'host %s\n' "$l"; done
if [ "$#" -gt 0 ]; then
  if command -v dpkg-query >/dev/null; then
    for p in "$@"; do
      dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || printf 'missing %s\n' "$p"
    done
  else
    printf 'missing (not Debian)\n'
  fi
fi
true
"""


def parse_facts(text: str) -> Facts:
    f = Facts("", "", "", "", [])
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "home":
            f.home = rest
        elif word == "user":
            f.user = rest
        elif word == "python":
            f.python = rest
        elif word == "userkey" and not f.user_key:
            f.user_key = rest
        elif word == "host" and rest.strip():
            f.host_keys.append(rest)
        elif word == "missing":
            f.mpi_missing.append(rest)
    return f


# --- round 2: write ---------------------------------------------------------------------------------------
_WRITE = r"""
import json, os, sys
spec = json.load(sys.stdin)
changed = []
become = [f for f in spec["files"] if f.get("become")] if os.geteuid() != 0 else []
if become:  # as the role's become: true (sudo, never a password prompt)
    import subprocess
    r = subprocess.run(["sudo", "-n", sys.executable, "-c", spec["self"]], capture_output=True, text=True,
                       input=json.dumps({"files": become, "self": spec["self"]}))
    if r.returncode != 0:
        sys.stderr.write("writing " + ", ".join(f["path"] for f in become) + " with sudo: "
                         + (r.stderr.strip()[-400:] or "exit %d" % r.returncode))
        sys.exit(1)
    changed += json.loads(r.stdout.strip().splitlines()[-1])
for f in spec["files"]:
    if f in become:
        continue
    path, mode = f["path"], int(f["mode"] or "0", 8)
    try:
        with open(path) as h:
            old = h.read()
    except FileNotFoundError:
        old = None
    text = old or ""
    for b in f.get("blocks") or []:
        text = BLOCK(text, b["marker"], b["body"], bof=b.get("bof", False))
    if not f.get("blocks"):
        text = f["text"]
    if text != old:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if f.get("in_place") and old is not None:
            with open(path, "w") as h:
                h.write(text)
        else:
            tmp = path + ".testbed-tmp"
            with open(tmp, "w") as h:
                h.write(text)
            os.chmod(tmp, mode or 0o644)
            os.replace(tmp, path)
        changed.append(path)
    if f["mode"] and (os.stat(path).st_mode & 0o7777) != mode:
        os.chmod(path, mode)
for c in spec.get("compile") or []:
    if c["src"] in changed or not os.path.exists(c["out"]):
        import subprocess
        r = subprocess.run(c["argv"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.stderr.write("compiling " + c["src"] + ": " + (r.stderr.strip()[-400:] or "exit %d" % r.returncode))
            sys.exit(1)
        changed.append(c["out"])
print(json.dumps(changed))
"""


def _write_program() -> str:
    import inspect

    return inspect.getsource(block) + _WRITE.replace("BLOCK(", "block(")


# --- round 3: verify --------------------------------------------------------------------------------------
_VERIFY = r"""
import json, socket, sys, types
for n in ("ansible", "ansible.module_utils", "ansible.module_utils.basic"):
    sys.modules[n] = types.ModuleType(n)
sys.modules["ansible.module_utils.basic"].AnsibleModule = object
spec = json.load(sys.stdin)
g = {"__name__": "ssh_mesh_check"}
exec(compile(spec["check"], "ssh_mesh_check.py", "exec"), g)
known = []
for p in spec["known_hosts"]:
    known += g["_read_lines"](p)
problems = g["content_problems"](spec["peers"], spec["port"], g["_read_lines"](spec["authorized_keys"]), known)
problems += g["login_problems"](spec["login"], spec["port"], spec["timeout"])
out = {"problems": problems}
if spec.get("hello"):
    import subprocess
    try:
        r = subprocess.run(spec["hello"], capture_output=True, text=True, timeout=spec["hello_timeout"])
        lines = [x for x in r.stdout.splitlines() if x.startswith("hello from rank")]
        if r.returncode != 0 or len(lines) != spec["ranks"]:
            out["hello"] = "mpi_check: exit %d, %d of %d ranks answered: %s" % (
                r.returncode, len(lines), spec["ranks"], (r.stderr.strip() or r.stdout.strip())[-400:])
    except subprocess.TimeoutExpired:
        out["hello"] = "mpi_check did not finish in %d s" % spec["hello_timeout"]
print(json.dumps(out))
"""


@dataclass
class Outcome:
    """What the direct pass did: per-host counts (changed: files written), and its first error."""

    hosts: dict[str, HostSetupResult]
    error: str | None = None
    fallback: str = ""  # why Ansible must run these roles after all (nothing was written then)


def apply(testbed: str, inventory: dict[str, Any], targets: list[str], roles: list[str],
          roles_dir: Path) -> Outcome:
    """Apply the per-testbed ``roles`` on ``targets`` (the others' keys are read, never changed)."""
    hv: dict[str, dict[str, Any]] = inventory["all"]["hosts"]
    addr = {n: str(hv[n].get("testbed_mesh_address") or hv[n]["ansible_host"]) for n in hv}
    res = {n: HostSetupResult(n) for n in targets}
    facts = _read_facts(testbed, inventory["all"]["vars"], addr, targets, roles, roles_dir, res)
    if isinstance(facts, Outcome):
        return facts
    missing = sorted({p for n in targets for p in facts[n].mpi_missing})
    if missing:
        return Outcome(res, fallback=f"OpenMPI packages missing: {', '.join(missing)}")
    plans = _host_plans(inventory, facts, addr, targets, roles, roles_dir)
    err = _write(testbed, facts, plans, targets, res)
    return Outcome(res, err or _verify(testbed, facts, plans, targets, res))


def _read_facts(testbed: str, allv: dict[str, Any], addr: dict[str, str], targets: list[str], roles: list[str],
                roles_dir: Path, res: dict[str, HostSetupResult]) -> dict[str, Facts] | Outcome:
    """Round 1: every host's keys and facts (and, on ``targets``, the MPI packages it lacks); the outcome instead
    when a host cannot be read or has no keys."""
    # the defaults that round 1 needs do not depend on the host's facts
    pre = role_vars(roles_dir, ["ssh_mesh"], {**allv, "ansible_facts": {"user_dir": "~", "user_id": ""}})
    mpi_pre = role_vars(roles_dir, ["mpi"], {**allv, "ansible_facts": {"user_dir": "~", "user_id": ""}}) \
        if "mpi" in roles else {}
    pkgs = list(mpi_pre.get("mpi_packages_debian") or []) if mpi_pre.get("mpi_source") == "distro" else []
    key_file = str(pre["ssh_mesh_key_file"])
    port = int(pre["ssh_mesh_port"])
    cmds = {}
    for n in addr:
        args = [key_file, str(port), addr[n], "1" if n in targets else "0", n, str(pre["ssh_mesh_key_type"]),
                *(pkgs if n in targets else [])]
        cmds[n] = "sh -c " + shlex.quote(_READ) + " sh " + " ".join(shlex.quote(a) for a in args)
    found = {r.host: r for r in remote.run_each(testbed, cmds, timeout=60, connect_timeout=15)}
    facts: dict[str, Facts] = {}
    for n in addr:
        r = found[n]
        if not r.ok:
            why = r.error or r.stderr.strip()[-300:] or f"exit {r.exit_code}"
            if n in targets:
                res[n].unreachable = 1
                res[n].error, res[n].error_task = why, "ssh_mesh : read the host's keys (testbed)"
            return Outcome(res, f"{n}: {why}")
        facts[n] = parse_facts(r.stdout)
        if not facts[n].user_key or not facts[n].host_keys:
            return Outcome(res, f"{n}: " + ("no user key at " + key_file + ".pub" if not facts[n].user_key
                                            else f"its sshd gave no host key at {addr[n]} port {port}"))
    return facts


def _host_plans(inventory: dict[str, Any], facts: dict[str, Facts], addr: dict[str, str], targets: list[str],
                roles: list[str], roles_dir: Path) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """host -> (the files to write there, what to verify there), the roles' variables rendered with its facts."""
    hv: dict[str, dict[str, Any]] = inventory["all"]["hosts"]
    names = list(hv)
    keys = {n: {"user_key": facts[n].user_key, "host_keys": facts[n].host_keys} for n in names}
    hostvars = {n: {**hv[n]} for n in names}
    groups = {"all": names}
    plans: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for n in targets:
        f = facts[n]
        ctx = {**inventory["all"]["vars"], "ansible_facts": {"user_dir": f.home, "user_id": f.user,
                                                             "python": {"executable": f.python}},
               "hostvars": hostvars, "groups": groups, "inventory_hostname": n, "ssh_mesh_keys": keys}
        ctx.update(role_vars(roles_dir, roles, ctx))
        plans[n] = _host_files(n, names, ctx, roles, roles_dir, keys, addr, set(targets) >= set(names))
    return plans


def _write(testbed: str, facts: dict[str, Facts], plans: dict[str, tuple[dict[str, Any], dict[str, Any]]],
           targets: list[str], res: dict[str, HostSetupResult]) -> str | None:
    """Round 2: write each target's files (counted in ``res``); the first error."""
    wprog = _write_program()
    wcmds = {n: f"{shlex.quote(facts[n].python)} -c {shlex.quote(wprog)}" for n in targets}
    wrote = remote.run_each(testbed, wcmds, stdin={n: json.dumps({**plans[n][0], "self": wprog}).encode()
                                                   for n in targets},
                            timeout=120, connect_timeout=15)
    err = None
    for r in wrote:
        if not r.ok:
            res[r.host].failed = 1
            res[r.host].error = r.error or r.stderr.strip()[-300:] or f"exit {r.exit_code}"
            res[r.host].error_task = "ssh_mesh/mpi : write the per-testbed files (testbed)"
            err = err or f"{r.host}: {res[r.host].error}"
            continue
        changed = json.loads(r.stdout.strip().splitlines()[-1] or "[]")
        res[r.host].changed = len(changed)
        res[r.host].ok = len(plans[r.host][0]["files"]) - len(changed) + 1
        res[r.host].changed_tasks = [f"wrote {p}" for p in changed][:20]
    return err


def _verify(testbed: str, facts: dict[str, Facts], plans: dict[str, tuple[dict[str, Any], dict[str, Any]]],
            targets: list[str], res: dict[str, HostSetupResult]) -> str | None:
    """Round 3: each target checks the mesh (a host's problems fail it in ``res``); the first error."""
    vcmds = {n: f"{shlex.quote(facts[n].python)} -c {shlex.quote(_VERIFY)}" for n in targets}
    checked = remote.run_each(testbed, vcmds, stdin={n: json.dumps(plans[n][1]).encode() for n in targets},
                              timeout=300, connect_timeout=15)
    err = None
    for r in checked:
        try:
            out = json.loads(r.stdout.strip().splitlines()[-1]) if r.ok else {}
        except (ValueError, IndexError):
            out = {}
        problems = list(out.get("problems") or []) if r.ok else \
            [r.error or r.stderr.strip()[-300:] or f"exit {r.exit_code}"]
        if out.get("hello"):
            problems.append(str(out["hello"]))
        if problems:
            res[r.host].failed = 1
            res[r.host].error = f"ssh mesh from {r.host}: {plural(len(problems), 'problem')}: " + \
                "; ".join(problems[:20])
            res[r.host].error_task = "ssh_mesh : verify the mesh (testbed)"
            err = err or f"{r.host}: {res[r.host].error}"
    return err


def _host_files(n: str, names: list[str], ctx: dict[str, Any], roles: list[str], roles_dir: Path,
                keys: dict[str, dict[str, Any]], addr: dict[str, str],
                everyone: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """What round 2 writes on host ``n`` and what round 3 checks there."""
    home = ctx["ansible_facts"]["user_dir"]
    ssh_dir = f"{home}/.ssh"
    files: list[dict[str, Any]] = []
    b = _env().filters["bool"]
    if "ssh_mesh" in roles:
        auth = "\n".join(k for k in (keys[h]["user_key"] for h in names) if k)
        files += [
            {"path": f"{ssh_dir}/authorized_keys", "mode": "0600",
             "blocks": [{"marker": "testbed ssh_mesh peers", "body": auth}]},
            {"path": f"{ssh_dir}/known_hosts", "mode": "0600",
             "blocks": [{"marker": "testbed ssh_mesh host keys",
                         "body": render(roles_dir, "ssh_mesh", "known_hosts.j2", ctx)}]},
            {"path": f"{ssh_dir}/config", "mode": "0600",
             "blocks": [{"marker": "testbed ssh_mesh peers", "bof": True,
                         "body": render(roles_dir, "ssh_mesh", "ssh_config.j2", ctx)}]}]
        if b(ctx["ssh_mesh_etc_hosts"]):
            files.append({"path": "/etc/hosts", "mode": "", "in_place": True, "become": True,
                          "blocks": [{"marker": "testbed ssh_mesh",
                                      "body": render(roles_dir, "ssh_mesh", "etc_hosts.j2", ctx)}]})
    compile_: list[dict[str, Any]] = []
    hello: list[str] = []
    if "mpi" in roles:
        d = str(ctx["mpi_dir"])
        bin_ = (str(ctx["mpi_prefix"]) + "/bin/") if ctx["mpi_source"] == "prefix" else ""
        subsets: dict[str, list[str]] = {"hosts.txt": names}
        if b(ctx["mpi_subsets"]):
            for i in range(1, len(names) + 1):
                subsets[f"{i}_host.txt" if i == 1 else f"{i}_hosts.txt"] = names[:i]
        for fname, hosts in subsets.items():
            files.append({"path": f"{d}/{fname}", "mode": "0644",
                          "text": render(roles_dir, "mpi", "hostfile.j2", {**ctx, "mpi_hostfile_hosts": hosts})})
        files.append({"path": f"{d}/mpi_check.c", "mode": "0644",
                      "text": (roles_dir / "mpi" / "files" / "mpi_check.c").read_text()})
        compile_.append({"src": f"{d}/mpi_check.c", "out": f"{d}/mpi_check",
                         "argv": [f"{bin_}mpicc", "-O2", "-o", f"{d}/mpi_check", f"{d}/mpi_check.c"]})
        inc = str(ctx.get("mpi_tcp_include") or "")
        if b(ctx["mpi_check"]) and n == names[0] and everyone:
            hello = [f"{bin_}mpirun", "-np", str(len(names)), "--hostfile", f"{d}/hosts.txt", "--map-by", "node",
                     *(["--allow-run-as-root"] if ctx["ansible_facts"]["user_id"] == "root" else []),
                     *(["--mca", "btl_tcp_if_include", inc, "--mca", "oob_tcp_if_include", inc] if inc else []),
                     f"{d}/mpi_check"]
    others = [h for h in names if h != n]
    i = names.index(n)
    nxt = names[(i + 1) % len(names)]
    login = []
    if "ssh_mesh" in roles and b(ctx["ssh_mesh_verify"]):
        login_hosts = others if ctx["ssh_mesh_verify_pairs"] == "all" else [h for h in [nxt] if h != n]
        for h in login_hosts:
            login += [t for t in (h, addr[h]) if t not in login]
    check = {"check": (roles_dir / "ssh_mesh" / "library" / "ssh_mesh_check.py").read_text(),
             "peers": [{"name": h, "address": addr[h], **keys[h]} for h in others] if "ssh_mesh" in roles else [],
             "login": login, "port": int(ctx.get("ssh_mesh_port") or 22),
             "timeout": int(ctx.get("ssh_mesh_verify_timeout") or 10),
             "authorized_keys": f"{ssh_dir}/authorized_keys",
             "known_hosts": [f"{ssh_dir}/known_hosts", "/etc/ssh/ssh_known_hosts"],
             "hello": hello, "hello_timeout": int(ctx.get("mpi_check_timeout") or 120), "ranks": len(names)}
    return {"files": files, "compile": compile_}, check
