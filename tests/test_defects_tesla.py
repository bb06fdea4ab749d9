"""tesla: what goes wrong when the steps run in order on hosts shaped like ecetesla0-4, checked against the real
Scalable_ViT_DT tree (../shared/artifacts; skipped when absent): its committed log/, its code's defaults, the
authors' own logs (NCCL interfaces, DeepSpeed's MPI discovery, run times, GPU names) and setup/ hostfiles."""

from __future__ import annotations

import re
import shlex
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from artifacts import artifact, python_calls, read_parser

from testbed.records import RunPlan
from testbed.run.plan import HostInfo, TestbedInfo, build_plan
from testbed.spec import Hardware, load_testbed
from testbed.suite import expand_matrix, load_suite, resolve_params

SUITE = "tesla"
TRAIN = "deepspeed/run_distributed_training.py"


@pytest.fixture(autouse=True)
def _watid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATID", "jdoe")


def tesla() -> Path:
    return artifact("Scalable_ViT_DT") / "tesla"


def plan(given: dict[str, Any], *, shared_home: bool = False, interface: str | None = None) -> RunPlan:
    s = load_suite(SUITE)
    hosts = [HostInfo(f"ecetesla{i}", f"10.0.0.{i + 2}", ["master"] if i == 0 else ["workers"], {}) for i in range(5)]
    hw = Hardware(shared_home=shared_home, interface=interface).context()
    tb = TestbedInfo("t", "lab", hosts, {"name": "t", "provider": "lab", "subnet": "10.0.0.0/24", "ssh_config": "x",
                                         "hardware": hw})
    return build_plan(s, tb, resolve_params(s, {k: str(v) for k, v in given.items()}))


def points() -> list[dict[str, Any]]:
    return [{}] + [dict(p) for p in expand_matrix(load_suite(SUITE), {})] + [
        {"task": t} for t in ("gpu-check", "nccl-test", "baseline")]


def rank_call(p: RunPlan) -> tuple[str, list[str], str]:
    """(working folder after the rank's own `cd`, argv, the rank's shell text) of the Python program a rank runs."""
    (call,) = python_calls(p.ranks[0].command, p.ranks[0].cwd)
    inner = shlex.split(p.ranks[0].command)[-1]
    return (call.cwd or "").replace("$HOME/", "~/"), call.argv, inner


def save_dir(gpus: int, pct: float, micro: int, epochs: int) -> str:
    """run_distributed_training.py:231-236 (the unpassed --dataset_percentage is its int default 1)."""
    return f"log/{gpus}_{'GPU' if gpus == 1 else 'GPUs'}/p{pct if pct != 1.0 else 1}_b{micro}_e{epochs}"


# --- class 4 / 7: the authors' committed outputs, one shared tree ------------------------------------------------
@pytest.mark.parametrize("given", points(), ids=lambda g: ",".join(f"{k}={v}" for k, v in g.items()) or "defaults")
def test_ranks_work_outside_the_checkout_with_its_committed_logs(given: dict[str, Any]) -> None:
    """Relative to its working folder the training appends to log/<N>_GPUs/p.._b.._e../metrics.csv and
    vit_training_rank_<k>.log, the baseline to metrics.txt: in the checkout those are the authors' files."""
    committed = {p.relative_to(tesla()).as_posix() for p in (tesla() / "log").rglob("*") if p.is_file()}
    p = plan(given)
    params = resolve_params(load_suite(SUITE), {k: str(v) for k, v in given.items()})
    cwd, _, _ = rank_call(p)
    assert not cwd.startswith("~/Scalable_ViT_DT"), f"the ranks write into the checkout: {cwd}"
    if params["task"] == "train":
        sd = save_dir(params["gpus"], params["dataset_percentage"], params["micro_batch"], params["epochs"])
        if given == {}:  # the defaults are one of the authors' own runs: their files are there
            assert f"{sd}/metrics.csv" in committed
    for globs in p.outputs.values():
        assert not [g for g in globs if g.startswith("~/Scalable_ViT_DT")], globs


@pytest.mark.parametrize("given", [{"gpus": 5}, {"gpus": 2, "dataset_percentage": 0.2}, {"gpus": 1}])
def test_every_rank_has_a_folder_and_save_dir_of_its_own(given: dict[str, Any]) -> None:
    """Only rank 0 makes the save_dir (:239-244) and every rank opens its log there (:95); with one working
    folder on a shared home all ranks append to one metrics.csv, whose header is written with 'w' by whichever
    rank finds it missing (:63-66)."""
    src = (tesla() / TRAIN).read_text()
    assert "if rank == 0:" in src and "os.makedirs(save_dir" in src and "open(logfile, 'w')" in src
    params = resolve_params(load_suite(SUITE), {k: str(v) for k, v in given.items()})
    cwd, _, inner = rank_call(plan(given))
    assert "$RANK" in cwd or "OMPI_COMM_WORLD_RANK" in cwd, f"one working folder for all ranks: {cwd}"
    sd = save_dir(params["gpus"], params["dataset_percentage"], params["micro_batch"], params["epochs"])
    mk = re.search(r"mkdir -p (\S+)", inner)
    assert mk and mk[1].replace("$HOME/", "~/") == f"{cwd}/{sd}", inner


# --- class 7: a shared home ---------------------------------------------------------------------------------------
def test_shared_home_steps_write_once_and_outputs_come_from_one_tree() -> None:
    shared = plan({"gpus": 5}, shared_home=True)
    own = plan({"gpus": 5})
    for s in shared.prepare:
        if "check" not in s.name:  # the dataset check only reads
            assert len(s.hosts) == 1, f"'{s.name}' writes under the shared home from {s.hosts} at once"
    assert all(len(s.hosts) == 1 for s in shared.sources)
    assert {len(s.hosts) for s in own.prepare} == {5}
    # outputs: the master's tree, filled by the workers on homes of their own and by NFS on a shared one
    assert [h for h, g in own.outputs.items() if any(x.startswith("out/") for x in g)] == ["ecetesla0"]
    (gather,) = own.post
    assert all("rsync" in c and "10.0.0.2:" in c for c in gather.commands.values())
    assert all(c == "true" for c in shared.post[0].commands.values())


def profile() -> dict[str, Any]:
    return yaml.safe_load((Path(__file__).resolve().parents[1] / "experiments/tesla/profile.yml").read_text())


def ansible_eval(expr: str, variables: dict[str, Any]) -> Any:
    env = jinja2.Environment()
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("true", "yes", "1")
    for _ in range(3):  # variables that are templates themselves
        variables = {k: env.from_string(v).render(**variables) if isinstance(v, str) and "{{" in v else v
                     for k, v in variables.items()}
    return env.compile_expression(expr)(**variables)


@pytest.mark.parametrize("shared", [True, False])
def test_profile_makes_the_home_once_on_a_shared_home(shared: bool) -> None:
    """The venv, the checkout and CIFAR-10 under the NFS home are each made by one host: by the roles themselves,
    through the one testbed_home_writer every set-up hands them (tests/test_setup_local.py runs it on a 3-host
    shared home), not by guards of this profile's own; the MPI folder is one per host."""
    prof = profile()
    hosts = [f"ecetesla{i}" for i in range(5)]
    by_role = {r["role"]: r for r in prof["roles"]}
    assert not any("when" in by_role[r] for r in ("python_env", "source_build", "dataset")), by_role
    assert not any("home_writer" in str(v) for v in prof["vars"].values())
    roles = Path(__file__).resolve().parents[1] / "playbooks" / "roles"
    for role, derived in (("python_env", "python_env_makes_here"), ("source_build", "source_build_here")):
        text = yaml.safe_load((roles / role / "vars" / "main.yml").read_text())[derived]
        assert "testbed_home_writer" in text, (role, text)
    for tasks in ("python_env/tasks/main.yml", "source_build/tasks/main.yml", "dataset/tasks/item.yml"):
        assert "testbed_home_target:" in (roles / tasks).read_text(), tasks  # what the writer is chosen for
    assert "testbed_home_writer" in (roles / "dataset" / "tasks" / "item.yml").read_text()
    dirs = {jinja2.Environment().from_string(by_role["mpi"]["vars"].get("mpi_dir", "{{ ansible_facts.user_dir }}"))
            .render(ansible_facts={"user_dir": "/home/u"}, testbed_hardware={"shared_home": shared},
                    inventory_hostname=h) for h in hosts}
    assert len(dirs) == (5 if shared else 1), dirs


# --- class 2: the data set ----------------------------------------------------------------------------------------
def test_cifar10_is_fetched_once_where_the_ranks_read_it() -> None:
    default = read_parser(tesla() / TRAIN).build().parse_args([]).data_path
    assert default == "./data"  # relative to each rank's folder; only rank 0 downloads (:125-130)
    assert not (tesla() / "data").exists()  # the repository has none
    _, argv, _ = rank_call(plan({"gpus": 3}))
    data_path = argv[argv.index("--data_path") + 1].replace("$HOME/", "~/")
    (ref,) = next(r for r in profile()["roles"] if r["role"] == "dataset")["vars"]["dataset_items"]
    assert ref == "{{ tesla_cifar10 }}"  # the profile's item (a mirror replaces it whole)
    item = profile()["vars"]["tesla_cifar10"]
    assert item["extract_to"] == data_path and item["url"].endswith("/cifar-10-python.tar.gz") and item["sha256"]
    assert item["creates"].startswith(f"{data_path}/cifar-10-batches-py/")  # torchvision's base_folder
    check = next(s for s in plan({"gpus": 3}).prepare if "CIFAR" in s.name)
    assert "cifar-10-batches-py" in next(iter(check.commands.values()))


# --- class 8: DeepSpeed's MPI discovery overrides MASTER_ADDR/MASTER_PORT ----------------------------------------
def test_deepspeed_is_given_the_launcher_variables_so_master_port_counts() -> None:
    log = (tesla() / "log/5_GPUs/p1_b16_e10/all_5_processes.log").read_text()
    assert "attempting to detect MPI environment" in log and "master_port=29500" in log
    assert 'os.environ["MASTER_PORT"] = "29501"' in (tesla() / TRAIN).read_text()  # the script's was ignored
    p = plan({"gpus": 2, "master_port": 29611})
    _, _, inner = rank_call(p)
    # with MASTER_ADDR/PORT, deepspeed's required_env: all five present, no MPI discovery
    for var, ompi in (("RANK", "RANK"), ("WORLD_SIZE", "SIZE"), ("LOCAL_RANK", "LOCAL_RANK")):
        assert re.search(rf"(?<![A-Z_]){var}=\$OMPI_COMM_WORLD_{ompi}\b", inner), var
    assert "-x MASTER_PORT=29611" in p.ranks[0].command


# --- class 3: the authors' hardware --------------------------------------------------------------------------------
def test_inventory_hardware_and_host_order_follow_the_artifact() -> None:
    spec = load_testbed(SUITE)
    assert spec.hardware.shared_home is True and spec.hardware.login_shell == "/bin/tcsh"
    nccl_log = (tesla() / "simple_test/all_hosts_output.txt").read_text()
    nics = set(re.findall(r"NET/Socket : Using \[0\](\w+):", nccl_log))
    assert len(nics) > 1 and spec.hardware.interface is None  # eno1, enp4s0f1, enp0s31f6: no one name
    assert spec.hardware.gpu and "RTX 3070" in spec.hardware.gpu.model
    order = [h.name for h in spec.provider.hosts]  # type: ignore[union-attr]
    for n in range(1, 6):
        f = tesla() / "setup" / (f"{n}_host.txt" if n == 1 else f"{n}_hosts.txt")
        want = {ln.split()[0] for ln in f.read_text().splitlines() if ln.strip()}
        assert set(order[:n]) == want, (n, order[:n], want)


def test_interfaces_come_from_the_testbed_never_from_the_authors_hosts() -> None:
    authors = set(re.findall(r"Using \[0\](\w+):", (tesla() / "simple_test/all_hosts_output.txt").read_text()))
    for task in ("train", "hello"):
        cmd = plan({"task": task, "gpus": 2}, interface="ens5").ranks[0].command
        assert "--mca btl_tcp_if_include ens5" in cmd
        if task == "train":
            assert "NCCL_SOCKET_IFNAME=ens5" in cmd
        plain = plan({"task": task, "gpus": 2}).ranks[0].command
        assert "btl_tcp_if_include" not in plain and not any(n in plain for n in authors)


# --- class 5: the supervisor's run timeout against the authors' own longest run ------------------------------------
def test_run_timeout_covers_the_longest_matrix_point() -> None:
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\]", (
        tesla() / "log/5_GPUs/p1_b16_e10/all_5_processes.log").read_text(), re.M)
    took = (datetime.fromisoformat(stamps[-1]) - datetime.fromisoformat(stamps[0])).total_seconds()
    assert took > 9 * 3600
    assert {"gpus": 5, "dataset_percentage": 1.0, "task": "train"} in [dict(p) for p in load_suite(SUITE).matrix]
    assert load_suite(SUITE).timeouts.run >= 1.15 * took
