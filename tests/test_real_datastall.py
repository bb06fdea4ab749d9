"""The datastall-emulator and jitc scripts' own parsers, on local hosts, with the argv lists the suites render.

The datastall profile is applied with ``datastall_stack: check``: the artifact's own C extensions (mlock, minio)
are built from their real sources (``--source``) on the hosts, into a venv at the suite's environment path
whose torch, torchvision, pandas and Pillow come from a stock pair on this machine (torch 2.14.1 with
torchvision 0.29.1: PyPI's torchvision loads only with PyPI's torch, not with the CPU build testbed's own env
holds). The emulator cannot train with it (it needs the pytorch-meng/torchvision-meng forks of torch 1.x, which
need an older Python): what runs is the real script, imported with all its imports, up to its own
``parse_args`` (``artifacts.PARSE_ONLY``), for every argv the suite renders over its matrix and choices.
The same host then checks open-jitc's ``main.py`` (torch, torchvision, numpy, psutil and its own model.py).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from artifacts import PARSE_ONLY, artifact, rendered_argvs
from localbed import can_raise_memlock

pytestmark = [pytest.mark.local, pytest.mark.slow]

ENV = "~/miniforge3/envs/datastall"  # the suite's environment: (a venv there with datastall_stack: check)


def _cli(bed: Any, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *args], cwd=bed.cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TESTBED_HOME": str(bed.home)}, check=False)


def _parse_on_host(bed: Any, host: str, cwd: str, python: str, script: str,
                   argvs: list[list[str]]) -> list[dict[str, Any]]:
    code = base64.b64encode(PARSE_ONLY.encode()).decode()
    cmd = f'cd {cwd} && {python} -c "$(echo {code} | base64 -d)" {script}'
    r = subprocess.run(["ssh", "-F", str(bed.ssh_config), host, "--", cmd], input=json.dumps(argvs),
                       capture_output=True, text=True, timeout=600, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("@RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-3000:]
    return list(json.loads(lines[-1][8:]))


@pytest.mark.timeout(1500)
def test_real_extensions_built_and_every_rendered_argv_parsed_by_the_real_scripts(local_testbed: Any,
                                                                                  torch_pair: str) -> None:
    gpufs, mlock, minio, jitc = (artifact(n) for n in ("gpufs", "mlock", "minio", "open-jitc"))
    bed = local_testbed(hosts=2, name="stall", vars={
        "datastall_stack": "check",
        "python_env_shared_site_packages": [torch_pair],  # local hosts see this machine's files
        "python_env_pip_packages": [],
        "memlock_limit": "unlimited" if can_raise_memlock() else "4096",  # no CAP_SYS_RESOURCE: lower it instead
    })
    r = _cli(bed, "setup", "stall", "--profile", "datastall-emulator", "--source", f"gpufs={gpufs}",
             "--source", f"mlock={mlock}", "--source", f"minio={minio}")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    for h in ("node0", "node1"):  # built once, installed on both; the emulator's own C extensions import
        out = bed.ssh(h, f"{ENV}/bin/python -c 'import minio, mlock; print(minio.PyCache, mlock.PyBalloon)'")
        assert out.returncode == 0 and "minio.PythonCache" in out.stdout, out.stderr

    argvs = rendered_argvs("datastall-emulator", "main-measure-time-emulator.py")
    assert len(argvs) >= 40  # Figures 3-6: models x memory limits x workers, and the fill-cache runs
    res = _parse_on_host(bed, "node0", "~/gpufs/emulator/datastall", f"{ENV}/bin/python",
                         "main-measure-time-emulator.py", argvs)
    assert [x["argv"] for x in res] == argvs
    refused = [f"{' '.join(x['argv'])}: {x['error']}" for x in res if "error" in x]
    assert not refused, "\n".join(refused)
    archs = {x["args"]["arch"].strip("'") for x in res}
    assert {"resnet18", "alexnet", "shufflenet_v2_x0_5", "squeezenet1_1"} <= archs, archs  # torchvision's names
    assert all(x["args"]["emulator_version"] == "1" and x["args"]["profile_batches"] == "-1" for x in res)

    # a wrong flag is refused by the same harness (the check can fail)
    bad = _parse_on_host(bed, "node0", "~/gpufs/emulator/datastall", f"{ENV}/bin/python",
                         "main-measure-time-emulator.py", [["-a", "resnet19", "/data"], ["--emulator", "/data"]])
    assert all("error" in x for x in bad), bad

    # open-jitc's main.py, on the same host: its checkout placed as the suite's sources: would place it
    rs = subprocess.run(["rsync", "-a", "-e", f"ssh -F {bed.ssh_config}", f"{jitc}/", "node0:open-jitc/"],
                        capture_output=True, text=True, check=False, timeout=300)
    assert rs.returncode == 0, rs.stderr
    argvs = rendered_argvs("jitc", "main.py")
    res = _parse_on_host(bed, "node0", "~/open-jitc/UserLevel", f"{ENV}/bin/python", "main.py", argvs)
    refused = [f"{' '.join(x['argv'])}: {x['error']}" for x in res if "error" in x]
    assert not refused, "\n".join(refused)
    assert {x["args"]["rank"] for x in res} == {"0", "1"}
    assert any(x["args"]["from_checkpoint"] == "True" for x in res)


def test_jitc_connect_repair_lets_a_rank_start_before_the_master(torch_pair: str, tmp_path: Path) -> None:
    """The suite's repair of open-jitc's one-shot connect, applied to the real main.py, then run as rank 1 before
    anything listens on the master's port: it waits and connects once the port opens (unrepaired: it dies)."""
    import shutil
    import socket
    import time

    from artifacts import plan_for

    user_level = tmp_path / "UserLevel"
    shutil.copytree(artifact("open-jitc") / "UserLevel", user_level)
    step = next(s for s in plan_for("jitc", {}).prepare if s.name.startswith("repair"))
    cmd = next(iter(step.commands.values()))
    for _ in range(2):  # idempotent: a second run changes nothing
        subprocess.run(["bash", "-c", cmd], cwd=user_level, check=True, timeout=60)
    assert (user_level / "main.py").read_text().count("tb_connect_try in range") == 1
    py = str(Path(torch_pair).parents[2] / "bin" / "python")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    main = (user_level / "main.py").read_text().replace("18080", str(port))  # a free port, not the real one
    # main.py makes /tmp/jit_checkpoints and /tmp/app_0.log as it starts (lines 35-41): nothing of them is left on
    # this machine, whose /tmp local hosts see through their copy-on-write roots (another user's root-owned files
    # there stop a rehearsal's ranks)
    main = main.replace("/tmp/jit_checkpoints", str(tmp_path / "jit_checkpoints"))
    main = main.replace("/tmp/app_0.log", str(tmp_path / "app_0.log"))  # opened at import, whatever the rank
    (user_level / "main.py").write_text(main)
    proc = subprocess.Popen([py, "main.py", "--master-ip", "127.0.0.1", "--num-nodes", "2", "--rank", "1"],
                            cwd=user_level, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = ""
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            out += line
            if "Connecting to master" in line:  # torch imported; nothing listens yet: its connects are refused
                break
        time.sleep(3)
        assert proc.poll() is None, out + proc.communicate()[0]  # unrepaired, it died of ConnectionRefusedError
        with socket.create_server(("127.0.0.1", port)) as srv:
            srv.settimeout(30)
            conn, _ = srv.accept()
            conn.close()
        for line in proc.stdout:  # type: ignore[union-attr]
            out += line
            if "Connected to master" in line:
                break
        assert "Connected to master at 127.0.0.1" in out, out
    finally:
        proc.kill()
        proc.wait()
