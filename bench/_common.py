"""Shared helpers for the hand-run benchmarks: local testbeds in a temp home, timing, tables.

Every benchmark provisions its own local testbed (LocalProvider) under a temporary TESTBED_HOME on a free
10.213.N.0/24 subnet, alternates the compared commands round by round (the machine is noisy) and prints
medians and ratios measured in that one run.
"""

from __future__ import annotations

import compileall
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
VENV_BIN = Path(sys.executable).parent

from localbed import LocalBed, local_available, local_bed  # noqa: E402

# the package's bytecode, as an installed testbed has it: with PYTHONDONTWRITEBYTECODE set, every command
# would compile testbed's modules again (~65 ms of each CLI call) and the start-up figures would measure that
compileall.compile_dir(str(REPO / "testbed"), quiet=1)


def tool(name: str) -> str:
    """A command next to this Python (the venv) or on PATH."""
    p = VENV_BIN / name
    return str(p) if p.exists() else (shutil.which(name) or name)


@contextlib.contextmanager
def bed(hosts: int, name: str = "bench", bridge_ports: int | None = None) -> Iterator[LocalBed]:
    """A provisioned local testbed of ``hosts`` hosts in a temporary directory (destroyed on exit), on a subnet that
    holds them (wider than a /24 past 252) and ``bridge_ports`` hosts a bridge (default: the provider's)."""
    from testbed.providers.local.settings import prefix_for

    reason = local_available()
    if reason:
        sys.exit(f"local testbed unavailable: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="tb-bench-"))
    try:
        with local_bed(tmp, name=name, hosts_n=hosts, prefix=min(24, prefix_for(hosts)),
                       bridge_ports=bridge_ports) as b:
            yield b
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def sh(argv: list[str], env: dict[str, str] | None = None, check: bool = True, timeout: float = 600) -> float:
    """Run ``argv`` (output discarded) and return its wall time; raise when it fails and ``check``."""
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, env=env, timeout=timeout, check=False)
    dt = time.perf_counter() - t0
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} -> {r.returncode}\n{r.stdout.decode()[-2000:]}"
                           f"\n{r.stderr.decode()[-2000:]}")
    return dt


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(title: str, header: list[str], rows: list[list[object]]) -> str:
    """A plain fixed-width table (copy-pasteable into Markdown-ish notes)."""
    cells = [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [f"\n{title}", line, "-" * len(line)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(out)


def env_with(**kv: str) -> dict[str, str]:
    e = dict(os.environ)
    e.update(kv)
    return e


def loadavg() -> str:
    """This machine's load averages (1, 5, 15 min): other work on it skews every timing."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
