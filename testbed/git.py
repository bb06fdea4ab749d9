"""One local git command, as source overrides and the set-up's address run it: argv (no shell), no prompt, no
stdin, the C locale, bounded by a timeout (exit 124, as timeout(1) gives, with a one-line reason)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from testbed.errors import UsageError

TIMEOUT = 60


def run(args: list[str], cwd: str | Path | None = None, *, env_extra: dict[str, str] | None = None,
        timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``git ARGS`` in ``cwd``; a missing git is a UsageError, a timeout a result with exit code 124."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", **(env_extra or {})}
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["git", *args], 124, "", f"git {args[0]} timed out after {timeout:g} s")
    except FileNotFoundError:
        raise UsageError("git is not installed on this machine", where="controller",
                         fix="apt-get install git (source overrides need it)") from None
