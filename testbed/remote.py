"""Run one command on many hosts in parallel over OpenSSH, reusing multiplexed connections.

The first call to a host opens a master connection that persists (ControlPersist), so repeated calls
cost one local socket round trip instead of a new SSH handshake. Output goes to temporary files (not
pipes) so a master connection lingering in the background never holds a call open.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import signal
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from testbed import ssh
from testbed.errors import UsageError
from testbed.hosts import Host


@dataclass
class HostResult:
    host: str
    exit_code: int | None
    stdout: str
    stderr: str
    error: str | None = None  # set when the host could not be reached or the command timed out
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


SSH_ERRORS = ("Permission denied", "Connection refused", "Connection timed out", "No route to host",
              "Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED", "Could not resolve",
              "Connection closed by", "Network is unreachable", "kex_exchange_identification",
              "Operation timed out", "port 22: Connection")


def select_hosts(hosts: list[Host], pattern: str | None) -> list[Host]:
    """Hosts matching a comma-separated list of names, groups or globs (``node[12]``, ``workers``)."""
    if not pattern:
        return hosts
    wanted = [p.strip() for p in pattern.split(",") if p.strip()]
    picked = [h for h in hosts if any(fnmatch.fnmatchcase(h.name, w) or w in h.groups for w in wanted)]
    if not picked:
        raise UsageError(f"no host matches '{pattern}'", where="--hosts",
                         fix=f"hosts: {', '.join(h.name for h in hosts)}; groups: "
                             f"{', '.join(sorted({g for h in hosts for g in h.groups})) or 'none'}")
    return picked


async def _run_one(testbed: str, host: str, command: str, timeout: float | None, stdin: bytes | None,
                   sem: asyncio.Semaphore, workdir: Path) -> HostResult:
    async with sem:
        t0 = time.monotonic()
        out_p, err_p = workdir / f"{host}.out", workdir / f"{host}.err"
        with open(out_p, "wb") as out, open(err_p, "wb") as err:
            argv = ssh.ssh_argv(testbed, host, command, mux="auto")
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=out, stderr=err, start_new_session=True)
            try:
                if stdin is not None:
                    assert proc.stdin is not None
                    proc.stdin.write(stdin)
                    await proc.stdin.drain()
                    proc.stdin.close()
                rc = await asyncio.wait_for(proc.wait(), timeout)
                error = None
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                rc, error = None, f"timed out after {timeout:g} s"
        stdout = out_p.read_text(errors="replace")
        stderr = err_p.read_text(errors="replace")
        if rc == 255 and any(e in stderr for e in SSH_ERRORS):
            error = ssh.describe_ssh_failure(stderr, host, testbed)
        return HostResult(host, rc, stdout, stderr, error, round(time.monotonic() - t0, 3))


async def run_async(testbed: str, hosts: list[str], command: str, *, timeout: float | None = None,
                    stdin: bytes | None = None, concurrency: int = 64) -> list[HostResult]:
    sem = asyncio.Semaphore(concurrency)
    with tempfile.TemporaryDirectory(prefix="testbed-exec-") as d:
        return list(await asyncio.gather(*(_run_one(testbed, h, command, timeout, stdin, sem, Path(d))
                                           for h in hosts)))


def run(testbed: str, hosts: list[str], command: str, *, timeout: float | None = None,
        stdin: bytes | None = None, concurrency: int = 64) -> list[HostResult]:
    """Run ``command`` (a shell command line) on every host in parallel; results in host order."""
    return asyncio.run(run_async(testbed, hosts, command, timeout=timeout, stdin=stdin, concurrency=concurrency))
