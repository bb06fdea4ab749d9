"""Values written into other programs' formats: ssh_config and Ansible inventories.

Each value is quoted for its format, or refused with a TestbedError (what, where, fix) when the format cannot
hold it. A line break in a path written into ssh_config starts a new directive (a ``ProxyCommand`` runs on this
machine); in an Ansible inventory ``{{ }}`` is a template Ansible evaluates on this machine.

ssh_config (OpenSSH's ``readconf.c``; ``misc.c``'s ``argv_split`` since 8.7, ``strdelim`` before): an argument
is split at spaces and tabs, ``#`` at a word's start begins a comment, double quotes hold spaces. Since 8.7 a
backslash escapes ``\\``, ``'`` and ``"``; before it is itself, and a ``"`` cannot be quoted at all: both are
refused, so every OpenSSH reads the same value. Keywords that expand tokens (ssh_config(5) TOKENS) read ``%%``
as ``%``; those that expand environment variables read ``${`` as one, with no escape (refused); those that
expand a leading ``~`` get absolute paths only.
"""

from __future__ import annotations

import re

from testbed.errors import TestbedError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SSH_PLAIN = re.compile(r"[A-Za-z0-9_./:@,+%\[\]-]+")  # an ssh_config word that needs no quotes
_TEMPLATE = re.compile(r"\{[{%#]")  # Jinja2 (Ansible) markers: {{ }}, {% %}, {# #}


def control_char(text: str) -> str | None:
    """The name of the first control character in ``text`` ("a line break", ...), None when it has none."""
    m = _CONTROL.search(text)
    if m is None:
        return None
    c = m.group()
    names = {"\n": "a line break", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte"}
    return names.get(c, f"a control character ({c!r})")


def not_utf8(text: str) -> bool:
    """Whether ``text`` holds bytes that are not UTF-8 (a file name read with surrogateescape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def line_problem(text: str) -> str | None:
    """Why ``text`` cannot be one value on one line of a text file (None: it can)."""
    if (c := control_char(text)) is not None:
        return f"holds {c}"
    if not_utf8(text):
        return "holds bytes that are not UTF-8"
    return None


def ssh_problem(text: str, *, path: bool = False, env: bool = False) -> str | None:
    """Why ``text`` cannot be one ssh_config argument read back alike by every OpenSSH (None: it can).
    ``path``: a file path of a keyword that expands ``~`` and ``${VAR}`` (IdentityFile, UserKnownHostsFile,
    ControlPath), written literally; ``env``: a literal value of a keyword that expands ``${VAR}``."""
    if (why := line_problem(text)) is not None:
        return why
    if text == "":
        return "is empty"
    for c, name in (('"', "a double quote (\")"), ("\\", "a backslash (\\)")):
        if c in text:
            return f"holds {name}, which OpenSSH's config cannot hold the same way in every version"
    if (path or env) and "${" in text:
        return "holds '${', which OpenSSH reads as an environment variable"
    if path and not text.startswith("/"):
        return "is not an absolute path"
    return None


def ssh_arg(text: str, *, tokens: bool = False, path: bool = False, env: bool = False) -> str:
    """``text`` as one ssh_config argument that OpenSSH reads back as ``text``: ``%`` doubled where the keyword
    expands tokens (``tokens``), double-quoted unless plain. Raises ValueError (the reason) for what cannot be
    written (:func:`ssh_problem`); callers turn it into a TestbedError naming the value."""
    why = ssh_problem(text, path=path, env=env)
    if why is not None:
        raise ValueError(why)
    if tokens:
        text = text.replace("%", "%%")
    return text if _SSH_PLAIN.fullmatch(text) else f'"{text}"'


def ansible_problem(text: str) -> str | None:
    """Why ``text`` cannot be a value of an Ansible inventory or extra variable (None: it can): Ansible
    evaluates ``{{ }}``, ``{% %}`` and ``{# #}`` in them, on this machine."""
    if (why := line_problem(text)) is not None:
        return why
    if _TEMPLATE.search(text):
        return "holds '{{', '{%' or '{#', which Ansible evaluates as a template"
    return None


def path_problem(text: str) -> str | None:
    """Why a controller path (the state home and what lies under it) cannot be written into the testbed's
    ssh_config, inventories and command lines (None: it can)."""
    return ssh_problem(text, path=True) or ansible_problem(text)


def refused(what: str, value: str, why: str, *, where: str, fix: str, code: int = 2) -> TestbedError:
    """One TestbedError for a value that cannot be written: ``what`` names it, ``value`` is shown escaped."""
    return TestbedError(f"{what} {shown(value)} {why}", where=where, fix=fix, code=code)


def shown(value: str) -> str:
    """``value`` as a message shows it: every control character and undecodable byte escaped, quoted."""
    return ascii(value) if line_problem(value) or not value.isprintable() else f"'{value}'"
