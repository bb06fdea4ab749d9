"""Host side of a run: upload the run directory, start ranks detached, poll them, signal and stop them.

Each rank runs under a small POSIX-sh wrapper (``tb-rank.sh``) started with ``setsid nohup``, so it survives
SSH drops and the CLI exiting. The wrapper records, in the run dir, ``rank<k>.start``, ``rank<k>.pid`` (the
rank's process group), ``rank<k>.out``/``.err`` (appended across attempts), ``rank<k>.end`` and
``rank<k>.exit`` (the exit status; 128+N when killed by signal N).
"""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from testbed import remote

if TYPE_CHECKING:
    from testbed.run.models import Plan, Rank, RunStep

WRAPPER = """#!/bin/sh
# testbed rank wrapper: tb-rank.sh K SCRIPT -- runs one rank detached and records how it ended
k=$1; script=$2
cd "$(dirname "$0")" || exit 1
rm -f "rank$k.exit" "rank$k.end" "rank$k.pid"
date +%s.%N > "rank$k.start"
setsid sh "./$script" >> "rank$k.out" 2>> "rank$k.err" < /dev/null &
pid=$!
echo "$pid" > "rank$k.pid"
wait "$pid"
rc=$?
date +%s.%N > "rank$k.end"
echo "$rc" > "rank$k.exit.tmp" && mv "rank$k.exit.tmp" "rank$k.exit"
"""


def sh(script: str) -> str:
    """A one-line command running ``script`` with /bin/sh whatever the login shell is (bash, zsh, tcsh, fish).

    A script of several lines travels base64-encoded and is ``eval``'d by sh: a quoted newline is a syntax
    error for csh-family login shells (tcsh says "Unmatched quote" and runs the rest itself), and stdin stays
    free for the script (``tar xzf -``).
    """
    if "\n" not in script.strip("\n"):
        return "sh -c " + shlex.quote(script)
    import base64

    b64 = base64.b64encode(script.encode()).decode()
    return f"sh -c 'eval \"$(echo {b64} | base64 -d)\"'"


def cd_run(run_dir: str) -> str:
    from testbed.suite import path_word

    return f"cd {path_word(run_dir)}"


ENV_MISSING = 96
"""Exit status of a step or rank whose suite environment does not exist on the host."""


def activate(prefix: str | None) -> list[str]:
    """Shell lines entering the venv or conda env at ``prefix`` (``~/`` allowed), or failing clearly.

    A venv is entered with its own ``bin/activate``; a conda env (no ``bin/activate`` of its own) by putting its
    ``bin`` first on PATH, setting ``CONDA_PREFIX`` and sourcing its ``etc/conda/activate.d`` scripts, which is
    what ``conda activate`` does without needing conda's shell hook on the host.
    """
    if not prefix:
        return []
    from testbed.suite import path_word

    return [
        f"tb_env={path_word(prefix.rstrip('/') or '/')}",
        'if [ ! -d "$tb_env/bin" ]; then '
        'echo "testbed: the suite\'s environment $tb_env does not exist on $(hostname); apply the suite\'s profile '
        f'(testbed setup ... --suite ...) or fix \'environment:\' in the suite" >&2; exit {ENV_MISSING}; fi',
        'if [ -f "$tb_env/bin/activate" ] && [ ! -d "$tb_env/conda-meta" ]; then . "$tb_env/bin/activate"; else '
        'PATH="$tb_env/bin:$PATH"; CONDA_PREFIX="$tb_env"; CONDA_DEFAULT_ENV="$tb_env"; '
        'export PATH CONDA_PREFIX CONDA_DEFAULT_ENV; '
        'for tb_f in "$tb_env"/etc/conda/activate.d/*.sh; do [ -f "$tb_f" ] && . "$tb_f"; done; fi',
    ]


def step_script(plan: Plan, command: str, cwd: str | None = None, environment: str | None = None) -> str:
    lines = [cd_run(plan.run_dir) + " || exit 97", "export PYTHONUNBUFFERED=1", *activate(environment),
             *plan.env]
    if cwd:
        lines.append(f"cd {cwd} || exit 97")
    return "\n".join([*lines, command]) + "\n"


def rank_script(plan: Plan, r: Rank) -> str:
    from testbed.suite import shell_quote

    env = [f"export {k}={shell_quote(v)}" for k, v in r.env.items()]
    body = [cd_run(plan.run_dir) + " || exit 97", "export PYTHONUNBUFFERED=1", *activate(r.environment),
            *plan.env, *env]
    if r.cwd:
        body.append(f"cd {r.cwd} || exit 97")
    return "\n".join([*body, r.command]) + "\n"


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name.endswith(".sh") else 0o644
            info.mtime = int(time.time())
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def upload(plan: Plan, hosts: list[str], extra: dict[str, bytes] | None = None,
           timeout: float = 120) -> list[remote.HostResult]:
    """Create the run dir on ``hosts`` and unpack the suite's files, the hostfile and the wrapper into it."""
    files = {name: Path(p).read_bytes() for name, p in plan.files.items()}
    files.update({k: v.encode() for k, v in plan.generated.items()})
    files["tb-rank.sh"] = WRAPPER.encode()
    files.update(extra or {})
    rd = plan.run_dir
    from testbed.suite import path_word

    mk = f"mkdir -p {path_word(rd)}"
    return remote.run(plan.testbed, hosts, sh(f"{mk} && {cd_run(rd)} && tar xzf -"), timeout=timeout,
                      stdin=_tar(files))


def launch(plan: Plan, ranks: list[Rank], attempt: int = 0,
           timeout: float = 120) -> list[remote.HostResult]:
    """Start ``ranks`` detached on their hosts (one SSH call per host); returns per-host results."""
    by_host: dict[str, list[Rank]] = {}
    for r in ranks:
        by_host.setdefault(r.host, []).append(r)

    async def go() -> list[remote.HostResult]:
        import asyncio

        coros = []
        for host, rs in by_host.items():
            files = {f"rank{r.rank}.a{attempt}.sh": rank_script(plan, r).encode() for r in rs}
            starts = " ".join(f"setsid nohup sh ./tb-rank.sh {r.rank} rank{r.rank}.a{attempt}.sh "
                              f">/dev/null 2>&1 </dev/null &" for r in rs)
            cmd = sh(f"{cd_run(plan.run_dir)} && tar xzf - || exit 1\n{starts} true")
            coros.append(remote.run_async(plan.testbed, [host], cmd, timeout=timeout, stdin=_tar(files)))
        return [x for res in await asyncio.gather(*coros) for x in res]

    import asyncio

    return asyncio.run(go())


@dataclass
class RankState:
    rank: int
    exit_code: int | None = None  # set once rank<k>.exit exists
    alive: bool | None = None  # pid still running (None: no pid file yet)
    started: float | None = None
    ended: float | None = None


@dataclass
class HostPoll:
    host: str
    ok: bool
    error: str | None = None
    ranks: dict[int, RankState] = field(default_factory=dict)
    triggers: list[str] = field(default_factory=list)
    no_run_dir: bool = False  # the host answered, but the run folder is gone (deleted behind the run's back)


def poll_script(plan: Plan, ranks: list[int], patterns: dict[str, tuple[int, str]]) -> str:
    """One sh script: a line per rank (``R k exit alive start end``) and ``T name`` per matched log pattern."""
    lines = [cd_run(plan.run_dir) + " 2>/dev/null || { echo NODIR; exit 0; }"]
    for k in ranks:
        lines.append(
            f'e=-; [ -f rank{k}.exit ] && e=$(cat rank{k}.exit); p=$(cat rank{k}.pid 2>/dev/null); a=-; '
            f'if [ -n "$p" ]; then if kill -0 "$p" 2>/dev/null; then a=1; else a=0; fi; fi; '
            f's=$(cat rank{k}.start 2>/dev/null); n=$(cat rank{k}.end 2>/dev/null); '
            f'echo "R {k} ${{e:--}} $a ${{s:--}} ${{n:--}}"')
    for name, (k, pat) in patterns.items():
        lines.append(f"grep -E -q -e {shlex.quote(pat)} rank{k}.out rank{k}.err 2>/dev/null && "
                     f"echo {shlex.quote('T ' + name)}")
    lines.append("true")
    return "\n".join(lines)


def _num(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def poll(plan: Plan, want: dict[str, list[int]], patterns: dict[str, dict[str, tuple[int, str]]],
         timeout: float = 10) -> dict[str, HostPoll]:
    """Poll every host in ``want`` (host -> ranks) in parallel."""
    import asyncio

    async def go() -> list[remote.HostResult]:
        coros = [remote.run_async(plan.testbed, [h], sh(poll_script(plan, rs, patterns.get(h, {}))),
                                  timeout=timeout) for h, rs in want.items()]
        return [x for res in await asyncio.gather(*coros) for x in res]

    out: dict[str, HostPoll] = {}
    for res in asyncio.run(go()):
        hp = HostPoll(res.host, ok=res.exit_code == 0 and res.error is None)
        if not hp.ok:
            hp.error = res.error or (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
        for ln in res.stdout.splitlines():
            parts = ln.split()
            if parts[:1] == ["R"] and len(parts) == 6:
                k = int(parts[1])
                hp.ranks[k] = RankState(k, int(parts[2]) if parts[2].lstrip("-").isdigit() else None,
                                        None if parts[3] == "-" else parts[3] == "1", _num(parts[4]),
                                        _num(parts[5]))
            elif parts[:1] == ["T"] and len(parts) == 2:
                hp.triggers.append(parts[1])
            elif parts == ["NODIR"]:
                hp.no_run_dir = True
        out[res.host] = hp
    return out


def signal_ranks(plan: Plan, ranks: list[Rank], sig: str = "TERM",
                 timeout: float = 15) -> list[remote.HostResult]:
    """Send ``sig`` (KILL, TERM, SEGV...) to each rank's process group."""
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(r.host, []).append(r.rank)
    sig = sig.removeprefix("SIG")

    async def go() -> list[remote.HostResult]:
        import asyncio

        coros = []
        for host, ks in by_host.items():
            body = "; ".join(f'p=$(cat rank{k}.pid 2>/dev/null); [ -n "$p" ] && kill -s {sig} -- "-$p" 2>/dev/null'
                             for k in ks)
            coros.append(remote.run_async(plan.testbed, [host],
                                          sh(f"{cd_run(plan.run_dir)} || exit 0; {body}; true"), timeout=timeout))
        return [x for res in await asyncio.gather(*coros) for x in res]

    import asyncio

    return asyncio.run(go())


def run_step(plan: Plan, step: RunStep, timeout: float) -> list[remote.HostResult]:
    """A synchronous step on its hosts in parallel, each in the run dir (its own command per host)."""
    import asyncio

    async def go() -> list[remote.HostResult]:
        envs = step.environments or {}
        coros = [remote.run_async(plan.testbed, [h],
                                  sh(step_script(plan, step.commands[h], step.cwd, envs.get(h))),
                                  timeout=step.timeout or timeout) for h in step.hosts]
        return [x for res in await asyncio.gather(*coros) for x in res]

    return asyncio.run(go())
