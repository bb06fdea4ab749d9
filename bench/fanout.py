"""Fan-out: ``testbed exec <bed> -- true`` against parallel-ssh and ansible (-m raw, -m command).

Run by hand as root:  .venv/bin/python bench/fanout.py [--hosts 8,16,32] [--cold 5] [--warm 9]

One local testbed of max(hosts) hosts; each size uses its first N hosts. Per size:
- cold rounds: before every measured command the multiplexed masters are closed (testbed's control
  sockets via ``ssh -O exit``; ansible gets a fresh ControlPath directory), so each call handshakes;
- warm rounds: the same commands repeated with masters alive.
Tools are alternated round by round (rotated order); the table shows medians and ratios to parallel-ssh.
``testbed exec (CLI)`` is the console script as a subprocess (Python start-up included); ``testbed lib``
is ``testbed.remote.run`` called in this process. parallel-ssh is run as users run it: a plain ssh per
host with the testbed's ssh_config (no multiplexing: ``ControlPath=none``); ``pssh+mux`` reuses
testbed's live masters (warm only) to show what multiplexing alone buys.
Targets printed at the end: the CLI cold at most 1.0x parallel-ssh, the CLI warm at most 1.0x pssh+mux (at or
under parallel-ssh, cold and warm).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from _common import bed, env_with, loadavg, median, sh, table, timed, tool

HEADER = ["hosts", "tool", "cold med", "cold/pssh", "warm med", "warm/pssh", "warm/pssh+mux", "spread (s)"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="8,16,32")
    ap.add_argument("--cold", type=int, default=5, help="cold rounds per size")
    ap.add_argument("--warm", type=int, default=9, help="warm rounds per size")
    ap.add_argument("--no-ansible", action="store_true")
    a = ap.parse_args()
    sizes = [int(x) for x in a.hosts.split(",")]
    with bed(max(sizes), name="fan") as b:
        from testbed import remote

        cfg = str(b.ssh_config)
        inv = str(b.home / "testbeds" / b.name / "inventory.yml")
        env = env_with(TESTBED_HOME=str(b.home))
        tmp = Path(tempfile.mkdtemp(prefix="fanout-"))
        rows: list[list[object]] = []
        verdicts: list[str] = []
        for n in sizes:
            names = [h.name for h in b.hosts[:n]]
            hostfile = tmp / f"hosts{n}"
            hostfile.write_text("\n".join(names) + "\n")
            cp_warm = tmp / f"cp-warm-{n}"
            cp_warm.mkdir()
            pssh_base = [tool("parallel-ssh"), "-h", str(hostfile), "-p", str(n), "-t", "120"]

            def tb_cli(names: list[str] = names) -> float:
                return sh([tool("testbed"), "exec", b.name, "--hosts", ",".join(names), "--", "true"], env=env)

            def tb_lib(names: list[str] = names) -> float:
                def go() -> None:
                    rs = remote.run(b.name, names, "true", timeout=120)
                    bad = [r for r in rs if not r.ok]
                    if bad:
                        raise RuntimeError(f"remote.run failed: {bad[0]}")
                return timed(go)

            def pssh(base: list[str] = pssh_base) -> float:
                return sh([*base, "-x", f"-F {cfg} -o ControlMaster=no -o ControlPath=none", "true"])

            def pssh_mux(base: list[str] = pssh_base) -> float:
                return sh([*base, "-x", f"-F {cfg} -o ControlMaster=no", "true"])

            def ansible(module: str, cp: Path, n: int = n, names: list[str] = names) -> float:
                args = ["-a", "true"]
                return sh([tool("ansible"), "all", "-i", inv, "-l", ",".join(names), "-f", str(n), "-m", module,
                           *args], env=env_with(ANSIBLE_SSH_CONTROL_PATH_DIR=str(cp), ANSIBLE_HOST_KEY_CHECKING="False",
                                                ANSIBLE_STDOUT_CALLBACK="minimal"))

            def close_masters(names: list[str] = names) -> None:
                remote.close_connections(b.name, names)

            def fresh_cp() -> Path:
                return Path(tempfile.mkdtemp(dir=tmp, prefix="cp-"))

            tools: dict[str, Callable[[], float]] = {
                "testbed exec (CLI)": tb_cli, "testbed lib": tb_lib, "parallel-ssh": pssh}
            if not a.no_ansible:
                tools["ansible -m raw"] = lambda: ansible("raw", fresh_cp())
                tools["ansible -m command"] = lambda: ansible("command", fresh_cp())
            cold: dict[str, list[float]] = {k: [] for k in tools}
            for r in range(a.cold):
                order = list(tools)[r % len(tools):] + list(tools)[:r % len(tools)]
                for k in order:
                    close_masters()
                    cold[k].append(tools[k]())
            warm_tools: dict[str, Callable[[], float]] = {
                "testbed exec (CLI)": tb_cli, "testbed lib": tb_lib, "parallel-ssh": pssh, "pssh+mux": pssh_mux}
            if not a.no_ansible:
                warm_tools["ansible -m raw"] = lambda cp=cp_warm: ansible("raw", cp)
                warm_tools["ansible -m command"] = lambda cp=cp_warm: ansible("command", cp)
            for f in warm_tools.values():  # prime: masters up, caches warm
                f()
            warm: dict[str, list[float]] = {k: [] for k in warm_tools}
            for r in range(a.warm):
                order = list(warm_tools)[r % len(warm_tools):] + list(warm_tools)[:r % len(warm_tools)]
                for k in order:
                    warm[k].append(warm_tools[k]())
            pc, pw, pm = median(cold["parallel-ssh"]), median(warm["parallel-ssh"]), median(warm["pssh+mux"])
            for k in warm_tools:
                c = median(cold[k]) if k in cold else float("nan")
                w = median(warm[k])
                spread = (f"{min(cold[k]):.2f}-{max(cold[k]):.2f}" if k in cold else "-") + \
                    f" / {min(warm[k]):.2f}-{max(warm[k]):.2f}"
                rows.append([n, k, c, c / pc if k in cold else "-", w, w / pw, w / pm, spread])
            print(table(f"fan-out of 'true' ({n} hosts; cold {a.cold} rounds, warm {a.warm} rounds; seconds; "
                        f"load {loadavg()})", HEADER, [r for r in rows if r[0] == n]), flush=True)
            cli_cold = median(cold["testbed exec (CLI)"]) / pc
            cli_warm = median(warm["testbed exec (CLI)"]) / pm
            verdicts.append(f"{n} hosts: CLI cold/pssh {cli_cold:.2f} (target <= 1.0: "
                            f"{'MET' if cli_cold <= 1.0 else 'MISSED'}); CLI warm/pssh+mux {cli_warm:.2f} "
                            f"(target <= 1.0: {'MET' if cli_warm <= 1.0 else 'MISSED'})")
        print(table("fan-out summary (medians; spread = min-max cold / warm)", HEADER, rows))
        print("\n".join(["", *verdicts]))
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
        os.sync()


if __name__ == "__main__":
    main()
