"""Run the GPU parts of the tesla, jitc and neuronabox suites for real on one GPU machine, and record them.

    OUT=/some/dir ARTIFACTS=bench/gpu/carry/artifacts python3 bench/gpu/gpu_bench.py [STEP ...]

From the repository root. Steps (all by default, in this order; the NCCL build runs beside the GPU steps):
  gpu_check        the gpu_check role (ansible-playbook on localhost if ansible imports, else the role's commands)
  torch_gpu        tesla: script/test_torch_gpu.py (the suite's task=gpu-check)
  tesla_train      tesla: deepspeed/run_distributed_training.py, 1 GPU, dataset_percentage 0.1 (the matrix's row)
  jitc_build       jitc: UserLevel/CUDATracePreload tracer.so against this torch's libtorch_cuda.so
  jitc_run_1rank   jitc: main.py under the tracer, --num-nodes 1 (what one GPU allows for certain)
  jitc_run_2ranks  jitc: main.py under the tracer, the suite's --num-nodes 2, both ranks on GPU 0
  nccl_build       neuronabox: NeuronaBox-NCCL (branch emu) make src.build for sm_90
Writes $OUT/summary.json, $OUT/steps.log (every step's command and output), $OUT/nvidia-smi.txt and
$OUT/table.txt, and prints the table. Env: OUT (./gpu-out), ARTIFACTS (bench/gpu/carry/artifacts), BENCH_BUDGET_S
(480: every step's timeout is cut to what is left of it), BENCH_WORK (a temp folder), BENCH_WHEELS (.whl),
BENCH_TESLA_EPOCHS (10, the suite's default), BENCH_JITC_STOP_ITER (10), BENCH_NCCL_JOBS (16),
BENCH_NCCL_PARALLEL (1: build NCCL beside the GPU steps; 0: after them), BENCH_FORCE (1: run the steps even
without nvidia-smi, to exercise them on a CPU machine, where they fail).
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import make_cifar  # noqa: E402

STEPS = ["gpu_check", "torch_gpu", "tesla_train", "jitc_build", "jitc_run_1rank", "jitc_run_2ranks", "nccl_build"]
START = time.monotonic()
BUDGET = float(os.environ.get("BENCH_BUDGET_S", "480"))
PY = sys.executable or "python3"
LOG_CAP = 400_000  # characters of one command's output kept in steps.log (head and tail)


def left() -> float:
    return BUDGET - (time.monotonic() - START)


class Ctx:
    def __init__(self, out: Path, artifacts: Path, work: Path):
        self.out, self.artifacts, self.work = out, artifacts, work
        self.logs: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.env = dict(os.environ)
        self.env.setdefault("PYTHONUNBUFFERED", "1")

    def log(self, step: str, text: str) -> None:
        with self.lock:
            self.logs.setdefault(step, []).append(text)

    def sh(self, step: str, cmd, timeout: float, cwd=None, env=None, shell=False, quiet=False) -> dict:
        """Run one command in its own process group, bounded by min(timeout, budget left); log it."""
        t = max(1.0, min(timeout, left() - 5))
        e = dict(self.env)
        e.update(env or {})
        shown = cmd if isinstance(cmd, str) else " ".join(map(str, cmd))
        t0 = time.monotonic()
        try:
            p = subprocess.Popen(cmd, cwd=cwd, env=e, shell=shell, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        except OSError as ex:
            self.log(step, f"$ {shown}\n(could not start: {ex})\n")
            return {"rc": 127, "out": str(ex), "seconds": 0.0, "timed_out": False}
        try:
            out, _ = p.communicate(timeout=t)
            timed_out = False
        except subprocess.TimeoutExpired:
            _killpg(p)
            out, _ = p.communicate()
            timed_out = True
        dt = time.monotonic() - t0
        rc = p.returncode if not timed_out else 124
        kept = out if len(out) <= LOG_CAP else out[: LOG_CAP // 4] + "\n[... cut ...]\n" + out[-3 * LOG_CAP // 4:]
        note = f" (timed out after {t:.0f} s)" if timed_out else ""
        self.log(step, f"$ {shown}\n[cwd {cwd or os.getcwd()}; rc {rc}; {dt:.1f} s{note}]\n{kept}\n")
        if not quiet:
            print(f"  [{step}] rc {rc} in {dt:.1f} s{note}: {shown[:110]}", flush=True)
        return {"rc": rc, "out": out, "seconds": round(dt, 2), "timed_out": timed_out, "timeout": round(t)}


def _killpg(p: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def why(out: str, default: str = "") -> str:
    """The most telling line of a failed command's output."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    pats = [r"Duplicate GPU", r"\berror\b.*:", r"Error:", r"Error\b", r"FAILED", r"fatal", r"Traceback"]
    for pat in pats:
        hits = [ln for ln in lines if re.search(pat, ln, re.I)]
        if hits:
            return hits[-1][:300] if pat != r"\berror\b.*:" else hits[0][:300]
    return (lines[-1][:300] if lines else default) or default


def result(status: str, reason: str = "", **kw) -> dict:
    return {"status": status, "reason": reason, **kw}


def unpack(ctx: Ctx, name: str) -> Path | None:
    """ARTIFACTS/NAME.tar.gz unpacked once under the work folder; None if the archive is not there."""
    dest = ctx.work / "src" / name
    if dest.is_dir():
        return dest
    tgz = ctx.artifacts / f"{name}.tar.gz"
    if not tgz.is_file():
        return None
    with tarfile.open(tgz) as tf:
        try:
            tf.extractall(ctx.work / "src", filter="data")
        except TypeError:  # Python < 3.12 without the filter argument
            tf.extractall(ctx.work / "src")
    return dest if dest.is_dir() else None


def need_artifact(ctx: Ctx, name: str):
    d = unpack(ctx, name)
    if d is None:
        return None, result("skipped", f"no {name}.tar.gz in {ctx.artifacts} (carry it: bench/gpu/README.md)")
    return d, None


# ---------------------------------------------------------------------------------------------- environment
def install_wheels(ctx: Ctx) -> dict:
    """.whl/*.whl (and *.tar.gz sdists) into /tmp/site, put on PYTHONPATH for this process and the steps."""
    wdir = Path(os.environ.get("BENCH_WHEELS", REPO / ".whl"))
    if not wdir.is_dir():
        return result("skipped", f"no {wdir} folder")
    target = os.environ.get("BENCH_SITE", "/tmp/site")
    wheels, sdists = sorted(glob.glob(str(wdir / "*.whl"))), sorted(glob.glob(str(wdir / "*.tar.gz")))
    base = [PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
            "--upgrade", "--target", target]
    rcs = []
    if wheels:
        rcs.append(ctx.sh("wheels", base + wheels, 180)["rc"])
    if sdists:  # e.g. GPUtil's sdist: built here, offline, with this Python's setuptools
        rcs.append(ctx.sh("wheels", [*base, "--no-build-isolation", *sdists], 180)["rc"])
    pp = [target] + [p for p in ctx.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    ctx.env["PYTHONPATH"] = os.pathsep.join(pp)
    os.environ["PYTHONPATH"] = ctx.env["PYTHONPATH"]
    sys.path.insert(0, target)
    bindir = Path(target) / "bin"
    if bindir.is_dir():
        ctx.env["PATH"] = f"{bindir}{os.pathsep}{ctx.env.get('PATH', '')}"
    names = [Path(w).name for w in wheels + sdists]
    bad = [rc for rc in rcs if rc != 0]
    return result("fail" if bad else "pass", "pip install failed (steps.log)" if bad else "", files=names,
                  target=target)


def versions(ctx: Ctx) -> dict:
    v: dict = {"python": platform.python_version(), "platform": platform.platform(), "host": platform.node()}
    probe = (
        "import json, importlib\n"
        "r = {}\n"
        "for m in ['torch', 'torchvision', 'numpy', 'deepspeed', 'ansible', 'mpi4py', 'GPUtil', 'pydantic']:\n"
        "    try:\n"
        "        mod = importlib.import_module(m if m != 'ansible' else 'ansible.release')\n"
        "        r[m] = getattr(mod, '__version__', '?')\n"
        "    except Exception as e:\n"
        "        r[m] = 'not importable: ' + type(e).__name__ + ': ' + str(e)[:120]\n"
        "try:\n"
        "    import torch\n"
        "    r['torch.version.cuda'] = torch.version.cuda\n"
        "    r['torch.cuda.is_available'] = torch.cuda.is_available()\n"
        "    if torch.cuda.is_available():\n"
        "        r['nccl'] = '.'.join(map(str, torch.cuda.nccl.version()))\n"
        "        r['gpu'] = torch.cuda.get_device_name(0)\n"
        "        r['capability'] = '.'.join(map(str, torch.cuda.get_device_capability(0)))\n"
        "except Exception as e:\n"
        "    r['torch.cuda'] = repr(e)[:200]\n"
        "print(json.dumps(r))\n"
    )
    r = ctx.sh("env", [PY, "-c", probe], 120, quiet=True)
    try:
        v.update(json.loads(r["out"].strip().splitlines()[-1]))
    except (ValueError, IndexError):
        v["probe_error"] = why(r["out"])
    nvcc = find_nvcc()
    if nvcc:
        out = ctx.sh("env", [nvcc, "--version"], 30, quiet=True)["out"]
        v["nvcc"] = (re.findall(r"release [^\n]+", out) or [out.strip()[-80:]])[0]
        v["nvcc_path"] = nvcc
        v["cuda_home"] = cuda_home()
    for tool, args in (("gcc", ["--version"]), ("cmake", ["--version"]), ("ninja", ["--version"]),
                       ("mpirun", ["--version"])):
        if shutil.which(tool):
            out = ctx.sh("env", [tool, *args], 30, quiet=True)["out"].strip()
            v[tool] = out.splitlines()[0] if out else "?"
        else:
            v[tool] = "not found"
    return v


def find_nvcc() -> str | None:
    env_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    for c in (shutil.which("nvcc"), f"{env_home}/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


_CUDA_HOME: list = []


def cuda_home() -> str | None:
    """CUDA_HOME if it holds bin/nvcc, else the TOP nvcc itself reports (right through wrapper scripts)."""
    if _CUDA_HOME:
        return _CUDA_HOME[0]
    home = os.environ.get("CUDA_HOME")
    if not (home and os.path.isfile(f"{home}/bin/nvcc")):
        home = None
        nvcc = find_nvcc()
        if nvcc:
            try:
                out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-E", "/dev/null"], capture_output=True,
                                     text=True, timeout=60).stderr
                top = re.search(r"TOP=(\S+)", out)
                home = os.path.realpath(top[1]) if top else None  # TOP is <cuda>/bin/..
            except (OSError, subprocess.TimeoutExpired):
                pass
            home = home or str(Path(os.path.realpath(nvcc)).parent.parent)
    _CUDA_HOME.append(home)
    return home


def smi(ctx: Ctx) -> dict:
    if not shutil.which("nvidia-smi"):
        return result("skipped", "no nvidia-smi")
    full = ctx.sh("nvidia-smi", ["nvidia-smi"], 60)
    (ctx.out / "nvidia-smi.txt").write_text(full["out"])
    q = ctx.sh("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id,compute_cap",
                              "--format=csv,noheader"], 60)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", full["out"])
    gpus = [ln.strip() for ln in q["out"].splitlines() if ln.strip()] if q["rc"] == 0 else []
    first = [f.strip() for f in gpus[0].split(",")] if gpus else []
    return result("pass" if full["rc"] == 0 and gpus else "fail", "" if full["rc"] == 0 else why(full["out"]),
                  gpus=gpus, gpu_model=first[0] if first else None, driver=first[1] if len(first) > 1 else None,
                  driver_cuda=cuda[1] if cuda else None)


# ---------------------------------------------------------------------------------------------- 1. gpu_check
def ansible_importable(ctx: Ctx) -> str | None:
    r = ctx.sh("gpu_check", [PY, "-c", "import ansible.release as r; print(r.__version__)"], 60, quiet=True)
    return r["out"].strip().splitlines()[-1] if r["rc"] == 0 else None


def step_gpu_check(ctx: Ctx, required: bool = True) -> dict:
    """The role as the tesla/jitc profiles apply it: gpu_check_python = this Python, gpu_check_min_gpus 1."""
    nvcc = find_nvcc() or "nvcc"
    role_vars = {"gpu_check_required": required, "gpu_check_python": PY, "gpu_check_min_gpus": 1,
                 "gpu_check_nvcc": nvcc}
    ver = ansible_importable(ctx)
    if ver:
        d = ctx.work / "ansible"
        d.mkdir(parents=True, exist_ok=True)
        (d / "gpu_check.yml").write_text(
            "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles:\n"
            f"    - role: gpu_check\n      vars: {json.dumps(role_vars)}\n")
        env = {"ANSIBLE_ROLES_PATH": str(REPO / "playbooks" / "roles"), "ANSIBLE_HOME": str(d / "home"),
               "ANSIBLE_LOCAL_TEMP": str(d / "tmp"), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0",
               "ANSIBLE_FORCE_COLOR": "0", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        cmd = [PY, "-m", "ansible", "playbook", "-i", "localhost,", "-e", f"ansible_python_interpreter={PY}",
               str(d / "gpu_check.yml")]
        r = ctx.sh("gpu_check", cmd, 180, env=env)
        report = re.findall(r'"msg": "([^"]*)"', r["out"])
        recap = re.search(r"localhost\s*:\s*(ok=\d+.*)", r["out"])
        ok = r["rc"] == 0
        return result("pass" if ok else "fail", "" if ok else why(r["out"], f"rc {r['rc']}"),
                      mode=f"ansible-playbook (ansible-core {ver}), connection local", seconds=r["seconds"],
                      report=report[-1] if report else None, recap=recap[1].strip() if recap else None,
                      vars=role_vars)
    # ansible is not importable: the role's own checks, by the commands its tasks run (tasks/main.yml)
    t0 = time.monotonic()
    mode = "role's commands (ansible not importable: carry it as wheels, bench/gpu/README.md)"
    s = ctx.sh("gpu_check", "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader", 60,
               shell=True, env={"SHELL": "/bin/bash"})
    gpus = [ln for ln in s["out"].splitlines() if ln.strip()] if s["rc"] == 0 else []
    if not gpus:
        w = "nvidia-smi is not installed" if s["rc"] == 127 else f"nvidia-smi failed: {s['out'].strip()}"
        return result("fail" if required else "pass", f"no usable NVIDIA GPU ({w})", mode=mode)
    if len(gpus) < role_vars["gpu_check_min_gpus"]:
        return result("fail", f"{len(gpus)} GPUs: {'; '.join(gpus)}", mode=mode)
    n = ctx.sh("gpu_check", [nvcc, "--version"], 60)
    torch_snip = ("import torch\nprint(torch.__version__)\nprint(torch.cuda.is_available())\n"
                  "print('.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-')\n")
    t = ctx.sh("gpu_check", [PY, "-c", torch_snip], 120)
    tl = t["out"].strip().splitlines()[-3:] if t["rc"] == 0 else []
    ok = n["rc"] == 0 and t["rc"] == 0 and len(tl) == 3 and tl[1] == "True"
    report = f"{'; '.join(gpus)}; {(n['out'].strip().splitlines() or ['nvcc: -'])[-1]}; torch {' / '.join(tl) or '-'}"
    reason = "" if ok else ("nvcc failed" if n["rc"] else why(t["out"], "torch.cuda.is_available() is not True"))
    return result("pass" if ok else "fail", reason, mode=mode, report=report,
                  seconds=round(time.monotonic() - t0, 2), vars=role_vars)


# ---------------------------------------------------------------------------------------------- 2./3. tesla
def tesla_prepare(ctx: Ctx, run_dir: Path, gpus: int = 1, micro_batch: int = 16) -> Path:
    """experiments/tesla/suite.yml steps.prepare: a valid deepspeed_config.json in the run, the MASTER_ADDR/PORT
    repair."""
    tesla = ctx.work / "src" / "Scalable_ViT_DT" / "tesla"
    cfg = {"train_batch_size": micro_batch * gpus, "train_micro_batch_size_per_gpu": micro_batch,
           "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0}, "wall_clock_breakdown": True}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "deepspeed_config.json").write_text(json.dumps(cfg) + "\n")
    pat = re.compile(r"""^(\s*)os\.environ\[(['"])(MASTER_ADDR|MASTER_PORT)\2\]\s*=\s*(['"][^'"]*['"])""", re.M)
    for p in ["deepspeed/run_distributed_training.py", "simple_test/test_nccl.py", "script/baseline_measure.py"]:
        f = tesla / p
        if f.is_file():
            f.write_text(pat.sub(r"\1os.environ.setdefault(\2\3\2, \4)", f.read_text()))
    return tesla


def step_torch_gpu(ctx: Ctx) -> dict:
    src, skip = need_artifact(ctx, "Scalable_ViT_DT")
    if skip:
        return skip
    # the suite: cwd ~/Scalable_ViT_DT/tesla, `python3 script/test_torch_gpu.py` (one rank per GPU under mpirun)
    r = ctx.sh("torch_gpu", [PY, "script/test_torch_gpu.py"], 120, cwd=src / "tesla",
               env={"CUDA_VISIBLE_DEVICES": "0"})
    ok = r["rc"] == 0 and "GPU 0:" in r["out"] and "No GPU found" not in r["out"]
    return result("pass" if ok else "fail", "" if ok else why(r["out"], "no 'GPU 0:' line"),
                  seconds=r["seconds"], output=r["out"].strip()[-1500:],
                  command="cd tesla && python3 script/test_torch_gpu.py (experiments/tesla/suite.yml task=gpu-check)")


def step_tesla_train(ctx: Ctx) -> dict:
    """The matrix row {task: train, gpus: 1, dataset_percentage: 0.1} as the suite launches it: the rank works in
    its own folder RUN/out/rank0 (the training writes log/1_GPU/p0.1_b16_e10/ under its working folder; in the
    checkout that is the authors' committed log/, whose metrics.csv would hold their rows and ours), the config
    in the run folder, --data_path the dataset; under `mpirun -np 1` when mpirun is there, else one process."""
    _src, skip = need_artifact(ctx, "Scalable_ViT_DT")
    if skip:
        return skip
    epochs = int(os.environ.get("BENCH_TESLA_EPOCHS", "10"))
    pct = 0.1
    run_dir = ctx.work / "tesla-run"
    tesla = tesla_prepare(ctx, run_dir)
    data = ctx.work / "tesla-data"
    md5 = make_cifar.make(data, per_batch=1000, test=1000)
    dep = ctx.sh("tesla_train", [PY, "-c", "import deepspeed, GPUtil, tqdm; print(deepspeed.__version__)"], 120)
    if dep["rc"] != 0:
        return result("fail", "the script's imports fail: " + why(dep["out"]) +
                      " (carry deepspeed, its needs and GPUtil as wheels: bench/gpu/README.md)")
    save = f"log/1_GPU/p{pct}_b16_e{epochs}"
    script = tesla / "deepspeed" / "run_distributed_training.py"
    args = ["--deepspeed_config", str(run_dir / "deepspeed_config.json"), "--epochs", str(epochs),
            "--dataset_percentage", str(pct), "--data_path", str(data)]
    env = {"NCCL_IB_DISABLE": "1", "NCCL_NET_GDR_LEVEL": "0", "NCCL_SOCKET_IFNAME": "^docker,lo",
           "NCCL_PROTO": "simple", "CUDA_VISIBLE_DEVICES": "0", "DS_ACCELERATOR": "cuda",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    inner = (f"export RANK=${{OMPI_COMM_WORLD_RANK:-0}} WORLD_SIZE=${{OMPI_COMM_WORLD_SIZE:-1}} "
             f"LOCAL_RANK=${{OMPI_COMM_WORLD_LOCAL_RANK:-0}} && mkdir -p {run_dir}/out/rank$RANK/{save} && "
             f"cd {run_dir}/out/rank$RANK && exec {PY} {HERE / 'cifar_run.py'} {data} {script} {' '.join(args)}")
    mpirun = shutil.which("mpirun")
    if mpirun:
        xs = [a for k in env for a in ("-x", k)]
        cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "1", *xs, "sh", "-c", inner]
        launcher = "mpirun -np 1 ... sh -c (the suite's launch; RANK/WORLD_SIZE/LOCAL_RANK from OMPI_COMM_WORLD_*)"
    else:
        cmd = ["sh", "-c", inner]
        launcher = "sh -c, one process (no mpirun): RANK/WORLD_SIZE/LOCAL_RANK 0/1/0"
    r = ctx.sh("tesla_train", cmd, 300, cwd=run_dir, env=env)
    logdir = run_dir / "out" / "rank0" / save
    extra = {}
    for name in ("metrics.csv", "vit_training_rank_0.log"):
        f = logdir / name
        if f.is_file():
            ctx.log("tesla_train", f"--- {f}\n{f.read_text()[-20000:]}\n")
            extra[name] = f.read_text()[-3000:]
    rows = [ln.split(",") for ln in extra.get("metrics.csv", "").splitlines()[1:] if ln.count(",") >= 5]
    ep_times = [round(float(row[3]), 3) for row in rows]  # Computation_Time
    ok = r["rc"] == 0 and len(ep_times) == epochs
    short = f"{len(ep_times)} of {epochs} epochs in metrics.csv"
    reason = "" if ok else (why(r["out"], f"rc {r['rc']}") if r["rc"] else short)
    return result("pass" if ok else "fail", reason, seconds=r["seconds"], epochs=epochs, dataset_percentage=pct,
                  train_images=int(5000 * pct), epoch_seconds=ep_times, deepspeed=dep["out"].strip().splitlines()[-1],
                  gpu_in_metrics=rows[0][5] if rows else None, launcher=launcher,
                  command=f"cd RUN/out/rank0 && python3 {script.relative_to(ctx.work / 'src')} {' '.join(args)}",
                  dataset={"root": str(data), "md5": md5}, log_dir=str(logdir),
                  **{k.replace(".", "_"): v for k, v in extra.items()})


# ---------------------------------------------------------------------------------------------- 4. jitc
def libtorch_cuda(ctx: Ctx) -> str | None:
    r = ctx.sh("jitc_build", [PY, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"], 60, quiet=True)
    if r["rc"] != 0:
        return None
    so = Path(r["out"].strip().splitlines()[-1]) / "lib" / "libtorch_cuda.so"
    return str(so) if so.is_file() else None


def include_dir(header: str, candidates: list[str]) -> str | None:
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, header)):
            return c
    return None


def step_jitc_build(ctx: Ctx) -> dict:
    src, skip = need_artifact(ctx, "open-jitc")
    if skip:
        return skip
    so = libtorch_cuda(ctx)
    if not so:
        return result("fail", "no libtorch_cuda.so next to this torch (a CPU-only torch?)")
    home = cuda_home() or "/usr/local/cuda"
    site = [str(Path(p)) for p in sys.path if p.endswith("-packages")]
    cuda_inc = include_dir("cuda_runtime.h", [f"{home}/include", f"{home}/targets/x86_64-linux/include",
                                              "/usr/local/cuda/include",
                                              *[f"{s}/nvidia/cuda_runtime/include" for s in site]])
    nccl_inc = include_dir("nccl.h", ["/usr/local/nccl2/include", f"{home}/include", "/usr/include",
                                      *[f"{s}/nvidia/nccl/include" for s in site]])
    # the jitc profile's source_build step: TRACK_CUDA=1 TRACK_NCCL=0 make -C UserLevel/CUDATracePreload
    args = [f"LIBTORCH_CUDA_SO={so}", f"CUDA_INCLUDE_PATH={cuda_inc or home + '/include'}",
            f"NCCL_INCLUDE_PATH={nccl_inc or '/usr/local/nccl2/include'}", "TRACK_CUDA=1", "TRACK_NCCL=0"]
    r = ctx.sh("jitc_build", ["make", "-C", "UserLevel/CUDATracePreload", *args], 180, cwd=src,
               env={"CUDA_HOME": home})
    tracer = src / "UserLevel" / "CUDATracePreload" / "tracer.so"
    ok = r["rc"] == 0 and tracer.is_file()
    return result("pass" if ok else "fail", "" if ok else why(r["out"], f"rc {r['rc']}"), seconds=r["seconds"],
                  libtorch_cuda=so, cuda_home=home, cuda_include=cuda_inc, nccl_include=nccl_inc,
                  tracer=str(tracer) if ok else None, tracer_bytes=tracer.stat().st_size if ok else None)


JITC_REPAIR = '''
import re
p, old = "main.py", "client_socket.connect((args.master_ip, 18080))"
s = open(p).read()
if "tb_connect_try" not in s:
    m = re.search(r"^( *)" + re.escape(old) + r"$", s, re.M)
    assert m, "main.py no longer has the connect line this step repairs"
    i = m[1]
    new = (f"{i}for tb_connect_try in range(300):  # testbed: retry while rank 0 is not listening yet\\n"
           f"{i}    try:\\n{i}        {old}\\n{i}        break\\n{i}    except ConnectionRefusedError:\\n"
           f"{i}        client_socket.close()\\n"
           f"{i}        client_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\\n"
           f"{i}        time.sleep(1)\\n{i}else:\\n{i}    {old}")
    open(p, "w").write(s[:m.start()] + new + s[m.end():])
'''


def jitc_run(ctx: Ctx, step: str, nodes: int) -> dict:
    src, skip = need_artifact(ctx, "open-jitc")
    if skip:
        return skip
    tracer = src / "UserLevel" / "CUDATracePreload" / "tracer.so"
    if not tracer.is_file():
        return result("skipped", "no tracer.so (jitc_build failed or did not run)")
    ul = src / "UserLevel"
    # experiments/jitc/suite.yml steps.prepare: clear /tmp/jit_checkpoints, the connect-retry repair; data: the jitc
    # profile's dataset role puts CIFAR-10 in UserLevel/data (main.py: CIFAR10('./data', download=True))
    shutil.rmtree("/tmp/jit_checkpoints", ignore_errors=True)
    rep = ctx.sh(step, [PY, "-c", JITC_REPAIR], 30, cwd=ul)
    if rep["rc"] != 0:
        return result("fail", "the suite's connect-retry repair failed: " + why(rep["out"]))
    if not (ul / "data" / make_cifar.BASE / make_cifar.MD5_FILE).is_file():
        make_cifar.make(ul / "data", per_batch=1000, test=1000)
    stop_iter = int(os.environ.get("BENCH_JITC_STOP_ITER", "10"))
    # CUDA_VISIBLE_DEVICES stays unset, as experiments/jitc/suite.yml leaves it: main.py:342-349 hands its entries to
    # DDP as strings ('0'), which torch 2.11 refuses ("Invalid device string: '0'"; seen on an H100)
    env = {"LD_PRELOAD": str(tracer), "MASTER_ADDR": "127.0.0.1"}
    procs, logs = [], []
    t0 = time.monotonic()
    for rank in range(nodes):
        argv = ["main.py", "--master-ip", "127.0.0.1", "--all_reduce_timeout", "100", "--num-nodes", str(nodes),
                "--rank", str(rank), "--epoch", "1", "--stop_iter", str(stop_iter), "--total_batch_size", "256",
                "--model", "VGG11"]
        lf = open(ctx.work / f"{step}_rank{rank}.log", "w+")  # noqa: SIM115 (read back and closed below)
        logs.append(lf)
        e = {k: v for k, v in {**ctx.env, **env}.items() if k != "CUDA_VISIBLE_DEVICES"}
        procs.append(subprocess.Popen([PY, str(HERE / "cifar_run.py"), str(ul / "data"), *argv], cwd=ul, env=e,
                                      stdout=lf, stderr=subprocess.STDOUT, start_new_session=True))
        if rank == 0:
            time.sleep(2)  # rank 0 first, as the README starts them
    deadline = time.monotonic() + max(1.0, min(150.0, left() - 5))
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        for p in procs:
            _killpg(p)
    dt = round(time.monotonic() - t0, 2)
    outs, rcs = [], []
    cmd = (f"LD_PRELOAD={tracer} python3 main.py --master-ip 127.0.0.1 --all_reduce_timeout 100 --num-nodes {nodes}"
           f" --rank R --epoch 1 --stop_iter {stop_iter} --total_batch_size 256 --model VGG11")
    for rank, (p, lf) in enumerate(zip(procs, logs, strict=True)):
        lf.seek(0)
        out = lf.read()
        lf.close()
        rc = 124 if timed_out and p.returncode in (None, -9, -15) else p.returncode
        rcs.append(rc)
        outs.append(out)
        ctx.log(step, f"$ [rank {rank}] {cmd.replace('--rank R', f'--rank {rank}')}\n[rc {rc}; {dt} s]\n"
                      f"{out[-LOG_CAP:]}\n")
    print(f"  [{step}] rcs {rcs} in {dt} s", flush=True)
    batches = re.findall(r"\| Batch (\d+) \|", outs[0])
    ok = all(rc == 0 for rc in rcs) and "Test set:" in outs[0] and bool(batches)
    reason = ""
    if not ok:
        bad = next((i for i, rc in enumerate(rcs) if rc != 0), 0)
        reason = (f"timed out after {dt} s; " if timed_out else "") + f"rank {bad} rc {rcs[bad]}: " + why(
            outs[bad], "no 'Test set:' line")
        if "Caught exception" in outs[0] and not reason.strip():
            reason = why(outs[0])
    caught = [ln.strip() for o in outs for ln in o.splitlines() if "Caught exception" in ln]
    return result("pass" if ok else "fail", reason, seconds=dt, ranks=nodes, rcs=rcs, batches_logged=len(batches),
                  caught=caught[:4], test_line=(re.findall(r"Test set:[^\n]*", outs[0]) or [None])[-1],
                  iter_times=re.findall(r"Avg Iter Time ([\d.]+)", outs[0])[:50], command=cmd)


# ---------------------------------------------------------------------------------------------- 5. NCCL emu
def step_nccl_build(ctx: Ctx) -> dict:
    src, skip = need_artifact(ctx, "NeuronaBox-NCCL")
    if skip:
        return skip
    home = cuda_home()
    if not home:
        return result("fail", "no nvcc (CUDA_HOME unknown)")
    jobs = os.environ.get("BENCH_NCCL_JOBS", "16")
    build = src / "build"
    build.mkdir(exist_ok=True)  # the profile's source_build_pre_steps: mkdir -p build
    gencode = "-gencode=arch=compute_90,code=sm_90"
    cmd = ["nice", "-n", "5", "make", f"-j{jobs}", "src.build", f"BUILDDIR={build}", f"CUDA_HOME={home}",
           f"NVCC_GENCODE={gencode}"]
    r = ctx.sh("nccl_build", cmd, 360, cwd=src, env={"CUDA_HOME": home})
    libs = sorted(glob.glob(str(build / "lib" / "libnccl.so*")))
    objs = len(glob.glob(str(build / "obj" / "**" / "*.o"), recursive=True))
    ok = r["rc"] == 0 and bool(libs)
    reason = "" if ok else (f"timed out after {r['timeout']} s ({objs} objects built)" if r["timed_out"]
                            else why(r["out"], f"rc {r['rc']}"))
    return result("pass" if ok else "fail", reason, seconds=r["seconds"], jobs=int(jobs), nvcc_gencode=gencode,
                  cuda_home=home, libs=[Path(x).name for x in libs], objects=objs,
                  command=f"make -j{jobs} src.build BUILDDIR=build NVCC_GENCODE=\"{gencode}\" CUDA_HOME={home}")


RUNNERS = {
    "gpu_check": step_gpu_check,
    "torch_gpu": step_torch_gpu,
    "tesla_train": step_tesla_train,
    "jitc_build": step_jitc_build,
    "jitc_run_1rank": lambda ctx: jitc_run(ctx, "jitc_run_1rank", 1),
    "jitc_run_2ranks": lambda ctx: jitc_run(ctx, "jitc_run_2ranks", 2),
    "nccl_build": step_nccl_build,
}


def guarded(ctx: Ctx, name: str, gpu: bool) -> dict:
    if not gpu:
        return result("skipped", "no nvidia-smi")
    if left() < 10:
        return result("skipped", f"out of time (BENCH_BUDGET_S={BUDGET:.0f})")
    print(f"== {name}", flush=True)
    t0 = time.monotonic()
    try:
        r = RUNNERS[name](ctx)
    except Exception as ex:  # one step's bug must not stop the others
        import traceback

        ctx.log(name, traceback.format_exc())
        r = result("fail", f"bench error: {type(ex).__name__}: {ex}")
    r.setdefault("seconds", round(time.monotonic() - t0, 2))
    r["wall_seconds"] = round(time.monotonic() - t0, 2)
    return r


def table(summary: dict) -> str:
    rows = [("step", "status", "seconds", "reason / note")]
    for name, r in summary["steps"].items():
        note = r.get("reason") or r.get("report") or r.get("mode") or ""
        rows.append((name, r["status"], f"{r.get('seconds', '')}", str(note)[:100]))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:>{w[2]}}  {d}" for a, b, c, d in rows]
    g = summary.get("gpu", {})
    head = (f"GPU: {g.get('gpu_model') or '-'}; driver {g.get('driver') or '-'}; driver CUDA "
            f"{g.get('driver_cuda') or '-'}; torch {summary['versions'].get('torch', '-')} (CUDA "
            f"{summary['versions'].get('torch.version.cuda', '-')}, NCCL {summary['versions'].get('nccl', '-')}); "
            f"nvcc {summary['versions'].get('nvcc', '-')}; total {summary['seconds']} s")
    return head + "\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    want = list(argv if argv is not None else sys.argv[1:]) or STEPS
    unknown = [s for s in want if s not in STEPS]
    if unknown:
        print(f"unknown steps {unknown}; choose from {STEPS}", file=sys.stderr)
        return 2
    out = Path(os.environ.get("OUT") or "./gpu-out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    artifacts = Path(os.environ.get("ARTIFACTS") or REPO / "bench" / "gpu" / "carry" / "artifacts").resolve()
    work = Path(os.environ.get("BENCH_WORK") or tempfile.mkdtemp(prefix="gpu-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(out, artifacts, work)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    # BENCH_FORCE=1 runs the steps without nvidia-smi too (to exercise them on a CPU machine: they fail there)
    gpu = shutil.which("nvidia-smi") is not None or os.environ.get("BENCH_FORCE") == "1"
    found = "found" if shutil.which("nvidia-smi") else "NOT found"
    print(f"gpu bench: OUT={out} ARTIFACTS={artifacts} work={work} budget={BUDGET:.0f} s; "
          f"nvidia-smi {found}{'' if gpu else ': every GPU step is skipped'}", flush=True)
    summary: dict = {"started": started, "repo": str(REPO), "out": str(out), "artifacts": str(artifacts),
                     "artifacts_present": sorted(p.name for p in artifacts.glob("*.tar.gz")) if artifacts.is_dir()
                     else [], "budget_s": BUDGET, "steps": {}}
    # without a GPU nothing would use them (and /tmp/site is shared on a CPU machine): left alone
    summary["wheels"] = install_wheels(ctx) if shutil.which("nvidia-smi") else result("skipped", "no nvidia-smi")
    summary["gpu"] = smi(ctx)
    summary["versions"] = versions(ctx)
    steps = [s for s in STEPS if s in want]
    parallel = os.environ.get("BENCH_NCCL_PARALLEL", "1") == "1" and "nccl_build" in steps and gpu
    bg: dict = {}
    th = None
    if parallel:  # CPU-bound: build beside the GPU steps so that the whole run stays short
        steps.remove("nccl_build")
        th = threading.Thread(target=lambda: bg.update(nccl_build=guarded(ctx, "nccl_build", gpu)), daemon=True)
        th.start()
    for name in steps:
        summary["steps"][name] = guarded(ctx, name, gpu)
    if th is not None:
        th.join(timeout=max(1.0, left() + 30))
        r = bg.get("nccl_build") or result("fail", "the build thread did not finish in the budget")
        r["concurrent_with_gpu_steps"] = True
        summary["steps"]["nccl_build"] = r
    summary["steps"] = {s: summary["steps"][s] for s in STEPS if s in summary["steps"]}
    summary["seconds"] = round(time.monotonic() - START, 1)
    summary["passed"] = [s for s, r in summary["steps"].items() if r["status"] == "pass"]
    summary["failed"] = [s for s, r in summary["steps"].items() if r["status"] == "fail"]
    summary["skipped"] = [s for s, r in summary["steps"].items() if r["status"] == "skipped"]
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    with open(out / "steps.log", "w") as f:
        for name in ["wheels", "nvidia-smi", "env", *STEPS]:
            for chunk in ctx.logs.get(name, []):
                f.write(f"===== {name}\n{chunk}\n")
    t = table(summary)
    (out / "table.txt").write_text(t)
    print(t, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
