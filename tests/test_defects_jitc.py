"""jitc's defects that only show when the steps run in order on hosts shaped like the real ones, checked against
open-jitc's real code at its pinned commit (../shared/artifacts; skipped when absent). Static: plans, no hosts."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.records import RelaunchStep, RunStep
from testbed.run.plan import HostInfo, TestbedInfo, build_plan
from testbed.spec import Hardware
from testbed.suite import load_suite, resolve_params
from tests.artifacts import artifact, plan_for, read_parser

PROFILE = Path(__file__).resolve().parents[1] / "experiments" / "jitc" / "profile.yml"


def _main() -> Path:
    return artifact("open-jitc") / "UserLevel" / "main.py"


def _plan(hardware: dict | None = None, **given: str):  # type: ignore[no-untyped-def]
    s = load_suite("jitc")
    hosts = [HostInfo(f"host{i}", f"10.0.0.{i + 2}", ["master"] if i == 0 else ["workers"], {}) for i in range(4)]
    hw = {**Hardware().context(), **(hardware or {})}
    tb = TestbedInfo("lab", "lab", hosts, {"name": "lab", "provider": "lab", "subnet": "10.0.0.0/24",
                                           "ssh_config": "x", "hardware": hw})
    return build_plan(s, tb, resolve_params(s, given))


def _build_vars() -> dict:
    roles = yaml.safe_load(PROFILE.read_text())["roles"]
    return next(r for r in roles if r["role"] == "source_build")["vars"]


# --- class 8: faults ----------------------------------------------------------------------------------------------
def test_shred_libtorch_shreds_the_library_the_ranks_load_not_the_first_of_find() -> None:
    readme = (artifact("open-jitc") / "UserLevel" / "README.md").read_text()
    assert "find / -name 'libtorch_cuda.so'" in readme  # the README's way: the first copy anywhere on the disk
    s = load_suite("jitc")
    cmd = plan_for("jitc", {"fault": "shred-libtorch"}).faults[0].command or ""
    assert "find /" not in cmd
    env_python = (s.environment or "").replace("~/", '"$HOME"/') + "/bin/python"
    assert cmd.startswith(f"lib=$({env_python} -c ") and "find_spec(\"torch\")" in cmd
    assert 'sudo shred "$lib"' in cmd


def test_no_fault_needs_a_tool_nothing_installs_or_that_the_workload_ignores() -> None:
    main = _main().read_text()
    assert "dcgm" not in main.lower()  # UserLevel's watchdog reads its sockets and the all-reduce time only
    s = load_suite("jitc")
    profile = PROFILE.read_text()
    for name, f in s.faults.items():
        cmd = f"{f.command or ''} {f.restore or ''}"
        if "dcgmi" in cmd:
            assert "datacenter-gpu-manager" in profile, f"{name}: dcgmi, which nothing installs"
        if re.search(r"\b(setpci|lspci)\b", cmd):
            assert "pciutils" in profile, f"{name}: pciutils is not installed"
    assert "dcgmi-inject" not in (s.parameters["fault"].choices or [])


def test_setpci_disables_the_gpu_the_rank_uses_and_recovery_waits_for_it_back() -> None:
    main = _main().read_text()
    assert 'torch.device(f"cuda:0"' in main  # every rank trains on CUDA device 0
    plan = _plan(fault="setpci-gpu", victim="2", nodes="3")
    f = plan.faults[0]
    assert "grep -i nvidia" not in (f.command or "")  # the first NVIDIA PCI function is not always GPU 0
    assert "nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0" in (f.command or "")
    assert f.restore == "sudo reboot"
    steps = f.recovery["1"]
    wait = steps[0]
    assert isinstance(wait, RunStep) and wait.hosts == ["host0"]
    assert "10.0.0.4 nvidia-smi" in wait.commands["host0"]  # the victim (rank 2) by the address the mesh knows
    assert isinstance(steps[-1], RelaunchStep)


# --- class 5: the supervisor's grace against main.py's own timeout --------------------------------------------
def test_grace_outlasts_the_all_reduce_timeout_and_a_checkpoint() -> None:
    main = _main().read_text()
    assert "args.all_reduce_timeout" in main and "checkpoint_state()" in main
    default = next(a for a in read_parser(_main()).arguments if "--all_reduce_timeout" in a[0])[1]["default"]
    s = load_suite("jitc")
    p = s.parameters["all_reduce_timeout"]
    assert p.default == default
    assert p.max is not None, "an unbounded all_reduce_timeout outlasts any grace: survivors stopped uncheckpointed"
    assert p.max < 600  # torch's own NCCL timeout (init_process_group sets none) would end them first
    assert s.timeouts.grace >= p.max + 60


# --- class 5: rank 0's port after a recovery --------------------------------------------------------------------
def test_relaunched_rank0_can_bind_its_port_while_the_old_one_is_in_time_wait(tmp_path: Path) -> None:
    src = _main().read_text()
    assert "server_socket.bind((args.master_ip, 18080))" in src and "SO_REUSEADDR" not in src
    (tmp_path / "main.py").write_text(src)
    step = next(x for x in plan_for("jitc", {}).prepare if x.name and x.name.startswith("repair"))
    script = next(iter(step.commands.values()))
    body = script.split("<<'TB_EOF'\n", 1)[1].rsplit("TB_EOF", 1)[0]
    subprocess.run([sys.executable, "-"], input=body, text=True, cwd=tmp_path, check=True)
    tree = ast.parse((tmp_path / "main.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "server_socket"]
    reuse = [c.lineno for c in calls if c.func.attr == "setsockopt" and "SO_REUSEADDR" in ast.unparse(c)]
    bind = [c.lineno for c in calls if c.func.attr == "bind"]
    assert reuse and bind and reuse[0] < bind[0]


# --- class 7: a shared home ---------------------------------------------------------------------------------------
def test_main_py_is_patched_once_on_a_shared_home() -> None:
    def repair(plan):  # type: ignore[no-untyped-def]
        return next(x for x in plan.prepare if x.name and x.name.startswith("repair"))

    assert repair(_plan({"shared_home": True}, nodes="4")).hosts == ["host0"]
    assert repair(_plan({"shared_home": False}, nodes="4")).hosts == ["host0", "host1", "host2", "host3"]


# --- class 3: the testbed's interface, not a guess -------------------------------------------------------------
def test_nccl_interface_comes_from_the_testbed() -> None:
    assert "NCCL_SOCKET_IFNAME" not in _main().read_text()  # main.py leaves it to NCCL
    with_if = _plan({"interface": "enp65s0f0"})
    assert all(r.command.startswith("NCCL_SOCKET_IFNAME=enp65s0f0 ") for r in with_if.ranks)
    assert all("NCCL_SOCKET_IFNAME" not in r.command for r in _plan().ranks)


def test_more_gpus_per_host_than_the_authors_is_not_refused() -> None:
    main = _main().read_text()
    assert 'os.environ["CUDA_VISIBLE_DEVICES"].split(",")' in main  # only a CUDA_VISIBLE_DEVICES of many is refused
    gpu = next(r for r in yaml.safe_load(PROFILE.read_text())["roles"] if r["role"] == "gpu_check")["vars"]
    assert gpu.get("gpu_check_max_gpus", 0) in (0, None)
    assert all("CUDA_VISIBLE_DEVICES" not in r.command and "CUDA_VISIBLE_DEVICES" not in r.env
               for r in plan_for("jitc", {}).ranks)


# --- still open: the tracer build ---------------------------------------------------------------------------------
def test_tracer_build_uses_the_venvs_torch_and_no_authors_paths() -> None:
    make = (artifact("open-jitc") / "UserLevel" / "CUDATracePreload" / "Makefile").read_text()
    authors = dict(re.findall(r"^(\w+) \?= (.+)$", make, re.M))
    v = _build_vars()
    env = v["source_build_env"]
    text = yaml.safe_dump(v)
    for key in ("CUDA_INCLUDE_PATH", "NCCL_INCLUDE_PATH"):
        assert authors[key] not in text and key not in env  # /usr/local/cuda/include is only one candidate
    assert "find /" not in text and "find ~" not in text  # not the first libtorch_cuda.so of a search
    build = env["JITC_BUILD"]
    assert "torch.__file__" in build and 'LIBTORCH_CUDA_SO="$torch_dir/lib/libtorch_cuda.so"' in build
    assert 'grep -aqF "$LIBTORCH_CUDA_SO"' in build  # the path baked into tracer.so is that torch's
    assert "crt/host_config.h" in build  # what cuda_runtime.h includes: a header set that cannot compile is refused
    assert v["source_build_steps"] == ['bash -c "$JITC_BUILD"']


@pytest.mark.parametrize("fault", ["none", "kill-rank"])
def test_steps_that_need_cuda_say_so(fault: str) -> None:
    plan = plan_for("jitc", {"fault": fault})
    tracer = next(x for x in plan.prepare if "tracer.so" in next(iter(x.commands.values())))
    assert "cuda" in tracer.needs
    assert 'grep -aqF "$lib" tracer.so' in next(iter(tracer.commands.values()))
    assert all({"gpu", "cuda"} <= set(r.needs) for r in plan.ranks)
    assert all(not x.needs for x in plan.prepare if x is not tracer)  # the rest runs on a CPU replica
