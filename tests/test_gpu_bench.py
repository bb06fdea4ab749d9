"""bench/gpu (the GPU machine's bench), what a CPU machine can check: the CIFAR-10 maker, the driver without a GPU."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GPU = REPO / "bench" / "gpu"
sys.path.insert(0, str(GPU))
import make_cifar  # noqa: E402


def test_made_cifar_loads_like_torchvision(tmp_path):
    md5 = make_cifar.make(tmp_path, per_batch=20, test=10, seed=1)
    folder = tmp_path / "cifar-10-batches-py"
    assert sorted(md5) == sorted([*make_cifar.TRAIN, "test_batch", "batches.meta"])
    assert json.loads((folder / "bench-md5.json").read_text()) == md5
    with open(folder / "data_batch_1", "rb") as f:  # torchvision's read: str keys under encoding="latin1"
        entry = pickle.load(f, encoding="latin1")
    assert set(entry) >= {"data", "labels"} and len(entry["labels"]) == 20
    try:
        import torchvision  # noqa: F401
    except Exception:  # not in this venv: torchvision's own reading, as CIFAR10.__init__ does it
        pytest.importorskip("numpy")
        data, targets, classes = make_cifar.load(tmp_path)
        assert data.shape == (100, 32, 32, 3) and str(data.dtype) == "uint8"
        assert targets[:12] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1] and len(classes) == 10
        test, ttargets, _ = make_cifar.load(tmp_path, train=False)
        assert test.shape == (10, 32, 32, 3) and len(ttargets) == 10
        return
    from torchvision.datasets import CIFAR10

    # download=False still checks every file's MD5 against the real data set's: made files cannot pass
    with pytest.raises(RuntimeError, match="Dataset not found or corrupted"):
        CIFAR10(str(tmp_path), train=True, download=False)
    saved = CIFAR10.train_list, CIFAR10.test_list, CIFAR10.meta
    try:
        make_cifar.use_made_md5(tmp_path)
        train = CIFAR10(str(tmp_path), train=True, download=True)  # passes the check: no download attempted
        test = CIFAR10(str(tmp_path), train=False, download=False)
        assert len(train) == 100 and len(test) == 10 and train.classes[0] == "airplane"
        img, label = train[3]
        assert img.size == (32, 32) and label == 3
    finally:
        CIFAR10.train_list, CIFAR10.test_list, CIFAR10.meta = saved


def test_cli_makes_the_dataset(tmp_path):
    r = subprocess.run([sys.executable, str(GPU / "make_cifar.py"), str(tmp_path), "--per-batch", "5", "--test", "3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "cifar-10-batches-py" / "data_batch_5").stat().st_size > 5 * 3072


def test_without_nvidia_smi_every_step_is_skipped(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("BENCH_FORCE", "ARTIFACTS")}
    env.update(OUT=str(tmp_path / "out"), BENCH_WORK=str(tmp_path / "work"), PATH="/usr/bin:/bin",
               ARTIFACTS=str(tmp_path / "none"))
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in env["PATH"].split(":")):
        pytest.skip("this machine has nvidia-smi")
    r = subprocess.run([sys.executable, str(GPU / "gpu_bench.py")], env=env, cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    steps = summary["steps"]
    assert list(steps) == ["gpu_check", "torch_gpu", "tesla_train", "jitc_build", "jitc_run_1rank",
                           "jitc_run_2ranks", "nccl_build"]
    assert all(s["status"] == "skipped" and s["reason"] == "no nvidia-smi" for s in steps.values())
    assert summary["skipped"] == list(steps) and summary["gpu"]["reason"] == "no nvidia-smi"
    assert "no nvidia-smi" in (tmp_path / "out" / "table.txt").read_text()
    assert summary["seconds"] < 60


def test_gpu_check_role_runs_with_ansible(tmp_path):
    """The role really runs under ansible-playbook here (no GPU: reported, and with required=false not failed)."""
    pytest.importorskip("ansible")
    import gpu_bench

    ctx = gpu_bench.Ctx(tmp_path, tmp_path, tmp_path)
    r = gpu_bench.step_gpu_check(ctx, required=False)
    log = "".join(ctx.logs.get("gpu_check", []))
    assert r["mode"].startswith("ansible-playbook"), r
    assert "TASK [gpu_check : Ask nvidia-smi for the GPUs]" in log
    if not any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in os.environ["PATH"].split(":")):
        assert r["status"] == "pass", (r, log[-2000:])
        assert "has no usable NVIDIA GPU" in log


@pytest.mark.parametrize("summary", sorted((GPU / "ran").glob("*.json")), ids=lambda p: p.stem)
def test_real_gpu_metrics_go_through_teslas_reporter(tmp_path, summary):
    """Each GPU run's metrics.csv (real, in the recorded summary), laid out as a rank leaves it, reported by
    tesla's report.py as testbed loads it: one row per epoch, the GPU that ran it named, the 1-GPU scaling point."""
    from testbed import results
    from testbed.report.model import Report
    from testbed.report.rundir import RunDir

    step = json.loads(summary.read_text())["steps"]["tesla_train"]
    assert step["status"] == "pass", step["reason"]
    run = tmp_path / "run"
    log = run / "node0" / "out" / "rank0" / Path(step["log_dir"].split("/out/rank0/", 1)[1])
    log.mkdir(parents=True)
    (log / "metrics.csv").write_text(step["metrics_csv"])
    (run / "manifest.json").write_text('{"suite": "tesla", "run_id": "r1", "status": "succeeded"}')
    own = results.load(REPO / "experiments" / "tesla" / "report.py")
    assert own.reporter is not None
    rep = Report(tmp_path / "out", "t")
    own.reporter.fn(RunDir.open(run), rep)
    assert not rep.skipped
    metrics = next(t for t in rep.tables if t.name == "metrics")
    assert [r[4] for r in metrics.rows] == list(range(1, step["epochs"] + 1))
    assert {r[7] for r in metrics.rows} == {step["gpu_in_metrics"]}
    assert [r[5] for r in metrics.rows] == pytest.approx(step["epoch_seconds"], abs=1e-3)
    scaling = next(t for t in rep.tables if t.name == "scaling")
    assert [r[:5] for r in scaling.rows] == [["weak", 16, 10, 1, 0.1]]
