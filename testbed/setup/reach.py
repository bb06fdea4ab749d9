"""Which tasks of a role reach the network: read from its task files, before any host is touched.

A testbed whose hosts have no route out (``testbed_offline``) would leave such a task waiting on a mirror for
minutes with no output. The shipped roles install from the controller there; a user's role is read here, and a
task that downloads (a package manager, ``get_url``, ``git``, ``curl`` in a shell line...) is refused with its
file and line unless it has a ``when:`` (or an enclosing block has): ``when: not testbed_offline`` is the guard to
write, and a task whose condition reads what the hosts answer may not run, so it is left to Ansible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import paths, yamlfile
from testbed.errors import UsageError
from testbed.setup.address import role_closure
from testbed.setup.profiles import roles_dir
from testbed.yamlfile import Loc

# modules that fetch from a mirror, an index or a URL whatever their arguments (short or ansible.builtin./
# community.general. names)
_FETCHING = {"apt", "package", "dnf", "yum", "zypper", "apk", "pacman", "snap", "apt_repository", "apt_key",
             "rpm_key", "yum_repository", "get_url", "uri", "git", "npm", "gem", "cpanm", "pipx", "homebrew",
             "conda", "docker_image", "docker_container", "flatpak", "hg", "subversion"}
_COMMANDS = {"command", "shell", "raw", "script"}
# words of a shell line that reach the network
_SHELL = re.compile(r"\b(curl|wget|git\s+(clone|fetch|pull|submodule)|apt(-get)?\s+(install|update)|yum\s+install|"
                    r"dnf\s+install|conda\s+(install|create|env\s+create)|docker\s+pull|snap\s+install|"
                    r"pip3?\s+install(?![^\n;&|]*--no-index))\b")
_KEYWORDS = {"name", "when", "tags", "become", "become_user", "become_method", "register", "loop", "with_items",
             "with_dict", "with_fileglob", "loop_control", "vars", "environment", "notify", "changed_when",
             "failed_when", "ignore_errors", "no_log", "delegate_to", "run_once", "until", "retries", "delay",
             "args", "check_mode", "diff", "throttle", "timeout", "any_errors_fatal", "listen", "connection",
             "local_action", "action", "debugger", "module_defaults", "collections", "ignore_unreachable",
             "delegate_facts", "async", "poll", "become_flags"}
_INCLUDES = {"include_tasks", "import_tasks"}
MAX_FILES = 64  # task files read per role (includes followed), a bound on a hostile or looping role


@dataclass(frozen=True)
class NetworkTask:
    """One task that reaches the network: where it is, its name and what gives it away."""

    file: Path
    line: int | None
    name: str
    why: str

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else str(self.file)


def _module(task: dict[str, Any]) -> tuple[str, Any]:
    """The task's module (short name) and its arguments; ('', None) for none."""
    for key, value in task.items():
        if key in _KEYWORDS or key in ("block", "rescue", "always") or not isinstance(key, str):
            continue
        return key.rsplit(".", 1)[-1], value
    return "", None


def _why(module: str, args: Any) -> str | None:
    """Why a task of ``module`` with ``args`` reaches the network (None: it does not)."""
    if module in _COMMANDS:
        text = args if isinstance(args, str) else args.get("cmd") or args.get("_raw_params") or args.get("argv") \
            if isinstance(args, dict) else ""
        m = _SHELL.search(str(text or ""))
        return f"its {module} line runs '{m.group(0)}'" if m else None
    if module == "pip":
        extra = str((args or {}).get("extra_args", "")) if isinstance(args, dict) else ""
        return None if "--no-index" in extra else "pip installs from an index"
    if module == "unarchive":
        src = str((args or {}).get("src", "")) if isinstance(args, dict) else str(args)
        return "unarchive downloads its src" if re.match(r"\s*(https?|ftp)://", src) else None
    if module == "apt" and isinstance(args, dict) and (("deb" in args and not args.get("name"))
                                                       or args.get("state") == "absent"):
        return None
    return f"the {module} module fetches from the network" if module in _FETCHING else None


def _guarded(when: Any) -> bool:
    """Whether a ``when:`` may keep the task from running: whether it does cannot be read before the hosts answer
    (``shell_found.rc != 0``), so a conditional task is left to Ansible; ``not testbed_offline`` is the guard to
    write."""
    conds = when if isinstance(when, list) else [when]
    return any(c is not None and str(c).strip() for c in conds)


def network_tasks(role: Path) -> list[NetworkTask]:
    """The tasks of the role at ``role`` that reach the network and are not guarded by ``testbed_offline``.

    A task file that does not parse is left to Ansible, which names its line."""
    found: list[NetworkTask] = []
    todo: list[Path] = [role / "tasks" / "main.yml"]
    seen: set[Path] = set()
    while todo and len(seen) < MAX_FILES:
        path = todo.pop(0)
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            data, located = yamlfile.load(path)
        except UsageError:
            continue

        def walk(tasks: Any, loc: Loc, guarded: bool, path: Path = path, located: yamlfile.Located = located) -> None:
            for i, task in enumerate(tasks if isinstance(tasks, list) else []):
                if not isinstance(task, dict):
                    continue
                here = guarded or _guarded(task.get("when"))
                for part in ("block", "rescue", "always"):
                    walk(task.get(part), (*loc, i, part), here)
                module, args = _module(task)
                if module in _INCLUDES and isinstance(args, str) and "{{" not in args:
                    todo.append((path.parent / args).resolve())
                why = None if here else _why(module, args)
                if why:
                    found.append(NetworkTask(path, located.line((*loc, i)), str(task.get("name") or module), why))

        walk(data, (), False)
    return found


def shipped(folder: Path) -> bool:
    """Whether the role at ``folder`` is one testbed ships (those install from the controller when offline)."""
    real = folder.resolve()
    return any(real.is_relative_to((root / "playbooks" / "roles").resolve())
               for root in (paths.PACKAGE_DIR / "_data", paths.PACKAGE_DIR.parent))


def refuse_offline(roles: list[str], folders: dict[str, Path], testbed: str) -> None:
    """Refuse (UsageError) a set-up of ``roles`` on an offline testbed when a user's role among them, or one they
    include, has a task that reaches the network: the first such task, with its file:line."""
    user = {name: folder for name, folder in folders.items() if not shipped(folder)}
    if not user:
        return
    for name in role_closure(roles, roles_dir()):
        folder = user.get(name)
        tasks = network_tasks(folder) if folder is not None else []
        if tasks:
            t = tasks[0]
            more = f" (and {len(tasks) - 1} more)" if len(tasks) > 1 else ""
            raise UsageError(
                f"role '{name}' reaches the network in task '{t.name}' ({t.why}){more}, but the hosts of "
                f"'{testbed}' have no route out: it would wait on a mirror that never answers",
                where=t.where(),
                fix="guard the task with 'when: not testbed_offline' and copy what it needs from the controller "
                    "(the shipped push role), or set this role up on a testbed whose hosts reach the network")

