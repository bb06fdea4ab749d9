"""Suites without hosts: every shipped suite loads, bad files fail with file:line, values are shell-quoted, and
the artifact suites' dry runs hold the artifacts' documented commands."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import pytest

from testbed import suite
from testbed.errors import UsageError
from testbed.records import RunPlan
from testbed.run import runner
from testbed.run.plan import dry_run_lines

ARTIFACTS = ["tesla", "jitc", "datastall-emulator", "isca-resnet18", "neuronabox"]


@pytest.fixture(autouse=True)
def _env(tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATID", "jdoe")


def commands(plan: RunPlan, phase: str | None = None) -> list[str]:
    return [ln["command"] for ln in dry_run_lines(plan) if phase is None or ln["phase"] == phase]


def test_every_shipped_suite_loads() -> None:
    names = suite.list_suites()
    for n in [*ARTIFACTS, "mpi-hello", "matmul-baseline", "fault-drill"]:
        assert n in names
        s = suite.load_suite(n)
        assert s.name == n and s.steps.launch.command


def test_unknown_key_has_file_line_and_hint(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "bad.yml").write_text(textwrap.dedent("""\
        name: bad
        steps:
          launch:
            comand: echo hi
        """))
    with pytest.raises(UsageError) as e:
        suite.load_suite("bad")
    assert e.value.where and e.value.where.endswith("bad.yml:4")
    assert "comand" in e.value.what and "command" in (e.value.fix or "")


def test_undefined_template_name_is_refused(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "undef.yml").write_text("steps:\n  launch:\n    command: echo {{ nope }}\n")
    with pytest.raises(UsageError) as e:
        runner.plan_run("undef", None, {}, dry_run=True)
    assert "nope" in e.value.what


def test_parameters_typed_and_checked() -> None:
    s = suite.load_suite("tesla")
    with pytest.raises(UsageError, match="must be int"):
        suite.resolve_params(s, {"gpus": "many"})
    with pytest.raises(UsageError, match="not allowed"):
        suite.resolve_params(s, {"gpus": "7"})
    with pytest.raises(UsageError) as e:
        suite.resolve_params(s, {"gpu": "2"})
    assert "did you mean 'gpus'" in (e.value.fix or "")
    assert suite.resolve_params(s, {"gpus": "3"})["gpus"] == 3


def test_matrix_expansion_and_filter() -> None:
    s = suite.load_suite("tesla")
    assert len(suite.expand_matrix(s, {})) == 10
    weak = suite.expand_matrix(s, {"dataset_percentage": "0.3"})
    assert [p["gpus"] for p in weak] == [3]


def test_shell_metacharacters_are_quoted() -> None:
    evil = "x'; touch /tmp/pwned; echo $(id) `id` && rm -rf ~ | cat > /etc/passwd"
    out = suite.render("echo {{ msg }} {{ n }}", {"msg": evil, "n": 3})
    assert shlex.split(out) == ["echo", evil, "3"]
    assert suite.render("ls {{ p }}", {"p": "~/a b"}) == "ls ~/'a b'"


def test_tesla_dry_run_documented_commands() -> None:
    plan = runner.plan_run("tesla", "tesla", {"gpus": "5"}, dry_run=True)
    assert [h.name for h in plan.hosts] == ["ecetesla1", "ecetesla2", "ecetesla4", "ecetesla0", "ecetesla3"]
    cmds = commands(plan)
    assert "mpicc -o setup/hello_mpi setup/hello_mpi.c" in cmds
    launch = commands(plan, "launch")
    assert len(launch) == 1
    assert launch[0].startswith("NCCL_IB_DISABLE=1 ") is False  # env goes through -x and the rank script
    assert "mpirun -np 5 --hostfile" in launch[0]
    assert "-x MASTER_ADDR=ecetesla1.uwaterloo.ca" in launch[0]
    assert "deepspeed/run_distributed_training.py --deepspeed_config $HOME/.testbed-runs/" in launch[0]
    assert "/deepspeed_config.json --epochs 10 --data_path $HOME/datasets/cifar10'" in launch[0]
    weak = commands(runner.plan_run("tesla", "tesla", {"gpus": "3", "dataset_percentage": "0.3"}, dry_run=True),
                    "launch")[0]
    assert "--epochs 10 --dataset_percentage 0.3 --data_path" in weak  # log/3_GPUs/p0.3_b16_e10, as the artifact's
    assert plan.generated["hostfile"].splitlines()[0] == "ecetesla1 slots=1"
    cfg = next(c for c in cmds if "deepspeed_config.json" in c and c.startswith("printf"))
    import json

    assert json.loads(shlex.split(cfg)[2])["train_batch_size"] == 80  # valid JSON, 16 per GPU at 5 GPUs
    hello = runner.plan_run("tesla", "tesla", {"task": "hello", "gpus": "5"}, dry_run=True)
    assert "mpirun -np 5 --hostfile ~/.testbed-runs/" in commands(hello, "launch")[0]
    assert commands(hello, "launch")[0].endswith("./setup/hello_mpi")


def test_jitc_dry_run_documented_commands() -> None:
    plan = runner.plan_run("jitc", None, {"fault": "error-before-opt-step"}, dry_run=True)
    launch = commands(plan, "launch")
    assert launch[0].startswith("LD_PRELOAD=$HOME/open-jitc/UserLevel/CUDATracePreload/tracer.so python3 main.py "
                                "--master-ip host0 --all_reduce_timeout 100 --num-nodes 2 --rank 0")
    assert "--rank 1" in launch[1] and launch[1].endswith("--error_before_opt_step")
    assert "--error_before_opt_step" not in launch[0]
    assert any("test -f tracer.so" in c for c in commands(plan, "prepare"))
    assert "rm -rf /tmp/jit_checkpoints" in commands(plan, "prepare")
    recovery = commands(plan, "recovery")
    assert len(recovery) == 2 and all(c.endswith("--from_checkpoint") and "--error" not in c for c in recovery)
    shred = runner.plan_run("jitc", None, {"fault": "shred-libtorch"}, dry_run=True)
    fault = commands(shred, "fault")[0]
    assert "cp \"$lib\" /tmp/libtorch_cuda.so.bak" in fault and "sudo shred \"$lib\"" in fault
    assert commands(shred, "restore")[0].startswith("sudo cp /tmp/libtorch_cuda.so.bak")
    assert runner.plan_run("jitc", None, {}, dry_run=True).faults == []  # the no-fault baseline


def test_datastall_dry_run_documented_commands() -> None:
    s = suite.load_suite("datastall-emulator")
    fig3 = suite.expand_matrix(s, {"figure": "3"})
    assert [p["model"] for p in fig3] == ["shufflenet_v2_x0_5", "resnet18", "squeezenet1_1", "vgg11", "alexnet",
                                           "mobilenet_v2", "resnet50", "squeezenet1_0"]
    assert [p["mem_limit"] for p in fig3] == ["8g", "8g", "7g", "9g", "8g", "8g", "8g", "8g"]
    plan = runner.plan_run(s, None, fig3[1], dry_run=True)
    script = commands(plan, "launch")[0].splitlines()
    assert script[0] == "set -e" and "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches >/dev/null" in script
    # as figure3.sh: --profile-batches -1 and --emulator-version=1, stdout and stderr into the output file; run in
    # the run folder (the checkout's outputsfig3/ holds the authors' committed outputs) with profile.csv copied in
    assert plan.ranks[0].cwd is None and "cp ~/gpufs/emulator/datastall/profile.csv profile.csv" in script
    assert ("cgexec -g memory:myGroup python ~/gpufs/emulator/datastall/main-measure-time-emulator.py -a resnet18 "
            "-j 8 --epoch 2 -b 256 --profile-batches -1 --gpu-type p100 --gpu-count 8 --emulator-version=1 "
            "~/data/imagenette2 > outputsfig3/outputresnet18.txt 2>&1") in script
    assert "vmtouch ~/data/imagenette2/train/ > outputsfig3/cache_resultresnet18.txt 2>&1" in script
    fig4 = suite.expand_matrix(s, {"figure": "4"})
    assert [p["mem_limit"] for p in fig4] == ["6g", "8g", "10g", "12g", "14g", "16g"]
    fig5 = runner.plan_run(s, None, suite.expand_matrix(s, {"figure": "5"})[3], dry_run=True)
    launch5 = commands(fig5, "launch")[0]
    assert "--gpu-count 1 --emulator-version=1 ~/data/imagenette2 > outputsfig5/output_alexnet6.txt 2>&1" in launch5
    assert "cgexec" not in launch5 and "output_fill_cache.txt" in launch5  # figure5.sh: no cgroup, a fill epoch


def test_isca_dry_run_documented_commands() -> None:
    s = suite.load_suite("isca-resnet18")
    expected = {
        "inj_immediate_infs_nans": "cd ~/ISCA_AE/fault_injection && python3 reproduce_injections.py --file "
                                   "injections/inj_immediate_infs_nans.csv",
        "inj_masked": "python3 reproduce_injections.py --file injections/inj_masked.csv",
        "detection": "cd ~/ISCA_AE/technique/detection && python3 detection.py && python3 detection.py --check && "
                     "python3 calc_overhead.py",
        "replay": "cd ~/ISCA_AE/technique/replay && python3 replay.py && python3 replay.py --rerun && "
                  "python3 calc_overhead.py",
    }
    for exp, want in expected.items():
        plan = runner.plan_run(s, "tpu", {"experiment": exp}, dry_run=True)
        assert want in commands(plan, "launch")[0]
    plan = runner.plan_run(s, "tpu", {}, dry_run=True)
    assert any("gdown --folder https://drive.google.com/drive/folders/1HVRFWY7NI5xr5qzR8yNeSKCRVnJNnqFf" in c
               for c in commands(plan, "prepare"))
    assert len(suite.expand_matrix(s, {})) == 5


def test_neuronabox_dry_run_documented_commands() -> None:
    plan = runner.plan_run("neuronabox", None, {"experiment": "coll"}, dry_run=True)
    prep = commands(plan, "prepare")
    # each host's own env (emu on the master, ori on the peer) at one host-local path for mpirun --prefix, and the
    # gitignored config.sh written once per home; NCCL itself is built by the profile (no build_nccl.sh in the nccl
    # checkout); emu and ori binaries under their README names (a shared home holds both)
    assert any("ln -sfn $HOME/neurona/emu /tmp/neuronabox-env" in c for c in prep)
    assert any("ln -sfn $HOME/neurona/ori /tmp/neuronabox-env" in c for c in prep)
    assert any("> ~/NeuronaBox/config.sh" in c for c in prep)
    assert not any("build_nccl" in c for c in prep)
    assert any("nvcc -lmpi -lnccl -lcudart -O3 eval/coll/all_reduce.cu -o build/all_reduce " in c for c in prep)
    assert any("eval/coll/all_reduce_ori.cu -o build/all_reduce_ori" in c for c in prep)
    launch = commands(plan, "launch")
    # no testbed: no interface or subnet known, so no btl_tcp_if_include (never the authors' enp1s0f0)
    assert ("mpirun -x NCCL_PROTO -x NCCL_ALGO --prefix /tmp/neuronabox-env -np 2 -H host0:1,host1:1 --mca pml ob1 "
            "--mca btl tcp,self sh -c '/tmp/ex 67108864 100'") in launch[1]
    cnn = commands(runner.plan_run("neuronabox", None, {"experiment": "cnn"}, dry_run=True), "launch")
    assert ("CUDA_VISIBLE_DEVICES=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0 "
            "MOD_KERNEL_BYPASS=1 python main.py -a resnet152 --lr 0.1 --world-size 2 --rank 0 --dist-url "
            "tcp://$MASTER_ADDR:$MASTER_PORT --dist-backend nccl ./dataset/") in cnn[0]
    assert "MOD_KERNEL_BYPASS=0" in cnn[1] and "--rank 1" in cnn[1]
    vgg = commands(runner.plan_run("neuronabox", None, {"experiment": "cnn", "model": "vgg19"}, dry_run=True),
                   "launch")
    assert "-a vgg19 --lr 0.01" in vgg[0]
    dl = commands(runner.plan_run("neuronabox", None, {"experiment": "deeplight"}, dry_run=True), "launch")
    assert "python main_all.py -l2 6e-7 -n_epochs 2 -warm 2 -prune 1 -sparse 0.90" in dl[0]


def test_requirements_are_checked_unless_dry_run(tb_home: Path) -> None:
    with pytest.raises(Exception, match="not provisioned"):
        runner.plan_run("tesla", "tesla", {}, dry_run=False)


def test_dry_run_without_a_loadable_spec_has_as_many_stand_ins_as_the_suite_asks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """tesla's spec needs $WATID; without it a dry run refuses as a real run does (issue 51: a dry run checks what a
    real run checks before renting, the spec included); with it, the plan has the five hosts the point asks for."""
    monkeypatch.delenv("WATID", raising=False)
    with pytest.raises(UsageError, match="WATID"):
        runner.plan_run("tesla", None, {"gpus": "5"}, dry_run=True)
    monkeypatch.setenv("WATID", "jdoe")
    assert len(runner.plan_run("tesla", None, {"gpus": "5"}, dry_run=True).hosts) == 5


def test_a_point_sets_up_only_the_roles_it_needs() -> None:
    """tesla's hello needs no CUDA wheels, dataset or GPU check (setup_roles); its training needs the profile."""
    from testbed import services
    from testbed.setup import resolve_plan

    hello = runner.plan_run("tesla", "tesla", {"task": "hello", "gpus": "2"}, dry_run=True)
    train = runner.plan_run("tesla", "tesla", {"task": "train", "gpus": "2"}, dry_run=True)
    assert hello.setup_roles == ["ssh_mesh", "shell", "packages", "mpi"] and train.setup_roles is None
    assert services.needed_roles([hello]) == hello.setup_roles and services.needed_roles([hello, train]) is None
    plan = resolve_plan(profile="tesla", only=hello.setup_roles)
    assert plan.roles == ["ssh_mesh", "shell", "packages", "mpi"] and plan.vars["shell_name"] == "tcsh"
    assert "python_env" not in plan.roles and "(roles ssh_mesh, shell, packages, mpi)" in plan.name
    with pytest.raises(UsageError, match="not a role of profile"):
        resolve_plan(profile="tesla", only=["nope"])


def test_setup_roles_naming_what_the_profile_lacks_is_refused_at_its_line(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "roles.yml").write_text(textwrap.dedent("""\
        profile: base
        parameters: {quick: {type: bool, default: false}}
        setup_roles: "{{ 'ssh_mesh shel' if quick else '' }}"
        steps: {launch: {command: echo hi}}
        """))
    assert runner.plan_run("roles", None, {}, dry_run=True).setup_roles is None
    with pytest.raises(UsageError) as e:
        runner.plan_run("roles", None, {"quick": "true"}, dry_run=True)
    assert "'shel' is not a role of profile 'base'" in e.value.what and e.value.where.endswith("roles.yml:3")
    assert "ssh_mesh, shell, packages" in (e.value.fix or "")
