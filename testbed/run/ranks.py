"""Host side of a run: upload the run directory, start ranks detached, poll them, signal and stop them.

Each rank runs under a small POSIX-sh wrapper (testbed/scripts/tb-rank.sh) started with ``setsid nohup``, so it
survives SSH drops and the CLI exiting. The wrapper records, in the run dir, ``rank<k>.start``, ``rank<k>.pid``
(the rank's process group), ``rank<k>.out``/``.err`` (appended across attempts), ``rank<k>.end`` and
``rank<k>.exit`` (the exit status; 128+N when killed by signal N). The host-side scripts (unpack, launch, poll,
signal, activate) are package files under testbed/scripts/; every call goes through testbed.remote.
"""

from __future__ import annotations

import io
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from testbed import remote, scripts
from testbed.remote import sh
from testbed.suite import path_word, shell_quote

if TYPE_CHECKING:
    from testbed.records import Rank, RunPlan, RunStep


def cd_run(run_dir: str) -> str:
    return f"cd {path_word(run_dir)}"


ENV_MISSING = 96
"""Exit status of a step or rank whose suite environment does not exist on the host."""


def activate(prefix: str | None) -> list[str]:
    """Shell lines entering the venv or conda env at ``prefix`` (``~/`` allowed), or failing with ENV_MISSING
    (testbed/scripts/activate.sh, its path given as ``tb_env``)."""
    if not prefix:
        return []
    return [f"tb_env={path_word(prefix.rstrip('/') or '/')}", scripts.text("activate.sh").rstrip("\n")]


def step_script(plan: RunPlan, command: str, cwd: str | None = None, environment: str | None = None) -> str:
    lines = [cd_run(plan.run_dir) + " || exit 97", "export PYTHONUNBUFFERED=1", *activate(environment),
             *plan.env]
    if cwd:
        lines.append(f"cd {cwd} || exit 97")
    return "\n".join([*lines, command]) + "\n"


def rank_script(plan: RunPlan, r: Rank) -> str:
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


def upload(plan: RunPlan, hosts: list[str], extra: dict[str, bytes] | None = None,
           timeout: float = 120) -> list[remote.HostResult]:
    """Create the run dir on ``hosts`` and unpack the suite's files, the hostfile and the wrapper into it."""
    files = {name: Path(p).read_bytes() for name, p in plan.files.items()}
    files.update({k: v.encode() for k, v in plan.generated.items()})
    files["tb-rank.sh"] = scripts.text("tb-rank.sh").encode()
    files.update(extra or {})
    return remote.run(plan.testbed, hosts, sh(scripts.program("unpack.sh", plan.run_dir)), timeout=timeout,
                      stdin=_tar(files))


def launch(plan: RunPlan, ranks: list[Rank], attempt: int = 0, timeout: float = 120,
           launchers: dict[str, list[str]] | None = None) -> list[remote.HostResult]:
    """Start ``ranks`` detached on their hosts (one SSH call per host); returns per-host results. ``launchers``:
    host -> the command the rank wrappers start under there (:meth:`Provider.rank_launcher`: a Slurm step)."""
    by_host: dict[str, list[Rank]] = {}
    for r in ranks:
        by_host.setdefault(r.host, []).append(r)
    launchers = launchers or {}
    commands = {h: sh(scripts.program("launch.sh", plan.run_dir, attempt, *(r.rank for r in rs),
                                      *(["--", *launchers[h]] if launchers.get(h) else [])))
                for h, rs in by_host.items()}
    stdin = {h: _tar({f"rank{r.rank}.a{attempt}.sh": rank_script(plan, r).encode() for r in rs})
             for h, rs in by_host.items()}
    return remote.run_each(plan.testbed, commands, stdin=stdin, timeout=timeout)


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
    log_tail: str | None = None  # the end of the rank's stdout asked for with ``tail`` (None: not asked or gone)


def poll_command(run_dir: str, ranks: list[int], patterns: dict[str, tuple[int, str]],
                 tail: tuple[int, int] | None = None) -> str:
    """The command running testbed/scripts/poll.sh: a line per rank, one per matched log pattern (name: (rank,
    extended regex)) and, with ``tail`` (rank, bytes), the end of that rank's stdout; its output is read by
    :func:`parse_poll`."""
    triples = [str(x) for name, (k, pat) in patterns.items() for x in (name, k, pat)]
    opts = ["-t", *tail] if tail is not None else []
    return sh(scripts.program("poll.sh", *opts, run_dir, *ranks, "--", *triples))


def _num(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def parse_poll(res: remote.HostResult) -> HostPoll:
    """One host's answer to :func:`poll_command`."""
    hp = HostPoll(res.host, ok=res.exit_code == 0 and res.error is None)
    if not hp.ok:
        hp.error = res.error or (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
    head, marked, tail = ("\n" + res.stdout).partition("\nTAIL\n")  # the log's end follows the first TAIL line
    if marked and hp.ok:
        hp.log_tail = tail
    for ln in head.splitlines():
        parts = ln.split()
        if parts[:1] == ["R"] and len(parts) == 6:
            k = int(parts[1])
            hp.ranks[k] = RankState(k, int(parts[2]) if parts[2].lstrip("-").isdigit() else None,
                                    None if parts[3] == "-" else parts[3] == "1", _num(parts[4]), _num(parts[5]))
        elif parts[:1] == ["T"] and len(parts) == 2:
            hp.triggers.append(parts[1])
        elif parts == ["NODIR"]:
            hp.no_run_dir = True
    return hp


def poll(plan: RunPlan, want: dict[str, list[int]], patterns: dict[str, dict[str, tuple[int, str]]],
         timeout: float = 10, tails: dict[str, tuple[int, int]] | None = None) -> dict[str, HostPoll]:
    """Poll every host in ``want`` (host -> ranks) in parallel; ``tails``: host -> (rank, bytes) of stdout to read
    in the same call (:attr:`HostPoll.log_tail`)."""
    tails = tails or {}
    commands = {h: poll_command(plan.run_dir, rs, patterns.get(h, {}), tails.get(h)) for h, rs in want.items()}
    return {res.host: parse_poll(res) for res in remote.run_each(plan.testbed, commands, timeout=timeout)}


def signal_ranks(plan: RunPlan, ranks: list[Rank], sig: str = "TERM",
                 timeout: float = 15) -> list[remote.HostResult]:
    """Send ``sig`` (KILL, TERM, SEGV...) to each rank's process group."""
    by_host: dict[str, list[int]] = {}
    for r in ranks:
        by_host.setdefault(r.host, []).append(r.rank)
    sig = sig.removeprefix("SIG")
    commands = {h: sh(scripts.program("signal.sh", plan.run_dir, sig, *ks)) for h, ks in by_host.items()}
    return remote.run_each(plan.testbed, commands, timeout=timeout)


def run_step(plan: RunPlan, step: RunStep, timeout: float) -> list[remote.HostResult]:
    """A synchronous step on its hosts in parallel, each in the run dir (its own command per host)."""
    envs = step.environments or {}
    commands = {h: sh(step_script(plan, step.commands[h], step.cwd, envs.get(h))) for h in step.hosts}
    return remote.run_each(plan.testbed, commands, timeout=step.timeout or timeout)
