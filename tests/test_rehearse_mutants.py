"""Every rehearsed point proves what it produced (issue 37, items 2 and 7).

Unit level: failure signatures read from log text, interfaces read from launch lines and ``ip -o link``, tracked
files read from ``git status --porcelain``, outputs judged from collect's per-host notes. Then mutants: one
textual edit each to a copy of a shipped suite (experiments/*/suite.yml), each rehearsed on a local replica, each
ending non-zero with a reason naming its defect, beside the same suites unmutated, rehearsed green.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from artifacts import artifact
from localbed import free_subnet

from testbed import proof
from testbed import rehearse as rh
from testbed.collect.transfer import HostCollect
from testbed.errors import UsageError
from testbed.run import runner
from testbed.suite import load_suite

EXPERIMENTS = Path(rh.__file__).parents[1] / "experiments"


# --- failure signatures in logs -------------------------------------------------------------------------------------
OMPI_WARNING = """--------------------------------------------------------------------------
WARNING: An invalid value was given for btl_tcp_if_include.  This
value will be ignored.

  Local host: node0
  Value:      eth7
  Message:    Unknown interface name
--------------------------------------------------------------------------
Hello world from processor node0, rank 0 out of 1 processors
"""


@pytest.mark.parametrize(("text", "signature", "quoted"), [
    ("compiling\ncat: data/x.csv: No such file or directory\ndone\n", "a missing file",
     "cat: data/x.csv: No such file or directory"),
    ("rsync: [sender] link_stat \"/a\" failed\ncp: unable to stat 'out/b'\n", "a missing file",
     "cp: unable to stat 'out/b'"),
    (OMPI_WARNING, "OpenMPI was given an interface the host lacks",
     "WARNING: An invalid value was given for btl_tcp_if_include.  This"),
    ("bash: line 1: /root/.testbed-runs/x/run.sh: Permission denied\n", "permission denied",
     "bash: line 1: /root/.testbed-runs/x/run.sh: Permission denied"),
    ("epoch 1\nTraceback (most recent call last):\n  File \"main.py\", line 3, in <module>\n    f()\n"
     "KeyError: 'RANK'\nepoch 2\n", "a Python traceback", "KeyError: 'RANK'"),
    ("bash: line 1: grepp: command not found\n", "a command not found", "bash: line 1: grepp: command not found"),
    ("x\nsh: 4: eval: grepp: not found\n", "a command not found", "sh: 4: eval: grepp: not found"),  # dash
])
def test_a_failure_signature_is_found_and_its_line_quoted(text: str, signature: str, quoted: str) -> None:
    found = [f for f in proof.scan(text) if f.signature == signature]
    assert len(found) == 1 and found[0].line == quoted, proof.scan(text)
    assert text.splitlines()[found[0].line_no - 1] == quoted
    assert found[0].verdict("node0/rank0.err") == \
        f"node0/rank0.err, line {found[0].line_no}: {signature}: \"{quoted.strip()}\""


def test_clean_logs_and_the_rehearsals_own_lines_carry_no_signature() -> None:
    clean = ("Hello world from processor node0, rank 0 out of 4 processors\nCloning into 'x'...\n"
             "testbed probe: train.py (in /src) replaced by the probe on node0; 0 problems\n"
             "testbed rehearse: skipped: needs cuda, which the replica lacks (No such file or directory)\n"
             # OpenMPI's race with its child, recovered from (seen in a clean mpi-hello rehearsal)
             "[node0:00048] plm:rsh: Warning: setpgid(61,61) failed in parent with errno=Permission denied(13)\n")
    assert proof.scan(clean) == []
    long = "x" * 500 + " No such file or directory"
    q = proof.scan(long)[0].verdict("f")
    assert len(q) < 220 and q.endswith('…"'), q  # bounded


# --- interfaces given to a launcher ---------------------------------------------------------------------------------
def test_on_a_replica_not_set_up_only_what_set_up_installs_is_excused(tb_home: Path) -> None:
    """--no-setup: a command the profile's set-up names (conda, for neuronabox) missing from the replica is a note,
    never "would fail"; a misspelt command (grepp) is a failure all the same; on a set-up replica both fail."""
    from types import SimpleNamespace

    folder = tb_home / "results" / "run"
    (folder / "gpu1").mkdir(parents=True)
    (folder / "gpu1" / "rank0.err").write_text("./run.sh: line 18: conda: command not found\n")
    (folder / "gpu1" / "rank1.err").write_text("sh: 4: eval: grepp: not found\n")
    plan = SimpleNamespace(run_id="r-no-setup")
    installs = rh.set_up_names("neuronabox")
    failures, notes = rh.log_signatures(plan, [], folder, set_up=False, installs=installs)  # type: ignore[arg-type]
    assert [f for f in failures if "grepp" in f] and not [f for f in failures if "conda" in f], failures
    assert len(notes) == 1 and "conda" in notes[0] and "not set up (--no-setup)" in notes[0], notes
    failures, notes = rh.log_signatures(plan, [], folder, set_up=True, installs=installs)  # type: ignore[arg-type]
    assert len(failures) == 2 and not notes


def test_interfaces_are_read_from_launch_lines_and_environments() -> None:
    tesla = ("mpirun -np 5 --hostfile h --mca btl_tcp_if_include eno1 --mca oob_tcp_if_include eno1 "
             "-x NCCL_SOCKET_IFNAME=eno1 -x MASTER_ADDR=10.0.0.1 sh -c '. ~/env/bin/activate && "
             "GLOO_SOCKET_IFNAME=ib0,eth1 python3 train.py'")
    got = {(g.name, g.how, g.prefix) for g in proof.interfaces_given(tesla)}
    assert got == {("eno1", "--mca btl_tcp_if_include", False), ("eno1", "--mca oob_tcp_if_include", False),
                   ("eno1", "NCCL_SOCKET_IFNAME", True), ("ib0", "GLOO_SOCKET_IFNAME", False),
                   ("eth1", "GLOO_SOCKET_IFNAME", False)}, got
    # subnets, exclusions, shell variables and templates name no interface; '=' makes NCCL's name exact
    assert proof.interfaces_given("mpirun -mca btl_tcp_if_include 10.219.0.0/24 -x NCCL_SOCKET_IFNAME=^docker,lo "
                                  "-x NCCL_SOCKET_IFNAME=$NIC ./a") == []
    assert proof.interfaces_given("true", {"NCCL_SOCKET_IFNAME": "=eth0", "OMPI_MCA_oob_tcp_if_include": "ens5"}) \
        == [proof.Given("eth0", "NCCL_SOCKET_IFNAME"), proof.Given("ens5", "OMPI_MCA_oob_tcp_if_include")]
    assert proof.interfaces_given("export NCCL_SOCKET_IFNAME=enp1s0f0") == [
        proof.Given("enp1s0f0", "NCCL_SOCKET_IFNAME", prefix=True)]


def test_an_interface_a_host_lacks_is_named_with_what_the_host_has() -> None:
    links = ("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\\    link/loopback 00:00\n"
             "2: eno1@if17: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP\\    link/ether 02\n")
    have = {"node0": proof.link_names(links), "node1": ["lo", "eth0"]}
    assert have["node0"] == ["lo", "eno1"]
    given = [proof.Given("eno1", "--mca btl_tcp_if_include"), proof.Given("en", "NCCL_SOCKET_IFNAME", prefix=True)]
    assert proof.missing_interfaces(given, have) == [
        "interface eno1 given by --mca btl_tcp_if_include: node1 has no interface eno1 (it has lo, eth0)",
        "interface en given by NCCL_SOCKET_IFNAME: node1 has no interface named en* (it has lo, eth0)"]


def test_the_shipped_suites_interfaces_come_from_the_testbed(tb_home: Path) -> None:
    """tesla and neuronabox name the interface the testbed declares (never one host's own NIC name)."""
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "pair.yml").write_text(
        "provider: {kind: lab, hosts: [{name: a, address: 10.0.0.2}, {name: b, address: 10.0.0.3}]}\n"
        "user: u\nhardware: {interface: eno1, gpu: {model: NVIDIA A100, count: 1}}\n")
    plan = runner.plan_run("tesla", "pair", {"task": "train", "gpus": 2}, dry_run=True)
    names = {g.name for r in plan.ranks for g in proof.interfaces_given(r.command, r.env)}
    assert names == {"eno1"}, names
    plan = runner.plan_run("neuronabox", "pair", {"experiment": "cnn"}, dry_run=True)
    names = {g.name for r in plan.ranks for g in proof.interfaces_given(r.command, r.env)}
    assert names == {"eno1"}, names


# --- tracked files of a source checkout -----------------------------------------------------------------------------
def test_changed_tracked_files_beyond_the_declared_edits() -> None:
    porcelain = " M technique/replay/replay.py\nM  a b.py\nR  old.py -> new.py\n?? made.txt\n M \"sp ace.py\"\n"
    changed = proof.changed_tracked(porcelain)
    assert changed == ["technique/replay/replay.py", "a b.py", "new.py", "sp ace.py"], changed
    assert proof.undeclared_edits(changed, ["technique/replay/replay.py", "*.py"]) == []
    assert proof.undeclared_edits(changed, ["technique/"]) == ["a b.py", "new.py", "sp ace.py"]


def test_the_shipped_suites_declare_the_checkout_files_their_steps_edit() -> None:
    from testbed.suite import load_suite

    assert load_suite("isca-resnet18").sources[0].edits == ["technique/replay/replay.py"]
    assert load_suite("jitc").sources[0].edits == ["UserLevel/main.py"]
    assert "tesla/setup/hello_mpi" in load_suite("tesla").sources[0].edits


# --- outputs: per point, judged from collect's notes ----------------------------------------------------------------
def test_an_output_that_matched_nothing_fails_the_point_unless_a_probe_stood_in(tb_home: Path) -> None:
    plan = runner.plan_run("mpi-hello", None, {}, dry_run=True)
    plan.rehearsal = {"probed_ranks": [], "skipped_ranks": {}, "skipped": {}}
    hosts = plan.host_names
    seen = [HostCollect(h, notes=["no file matches 'hostfile'"] if h != hosts[0] else []) for h in hosts]
    produced, failed, unjudged = rh.outputs_made(plan, seen)
    assert produced == {"hostfile": [hosts[0]]} and failed == [] and unjudged == []
    none = [HostCollect(h, notes=["no file matches 'hostfile'"]) for h in hosts]
    produced, failed, unjudged = rh.outputs_made(plan, none)
    assert failed == [f"output hostfile matched no file on {', '.join(hosts)}: the point did not produce it"]
    plan.rehearsal["probed_ranks"] = [0]  # the probe made nothing: not judged, said so
    produced, failed, unjudged = rh.outputs_made(plan, none)
    assert failed == [] and unjudged and "probed or skipped" in unjudged[0]


def test_an_output_template_is_rendered_per_point(tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tesla's hello writes only its logs: the training's and the baseline's outputs are declared per task."""
    monkeypatch.setenv("WATID", "jdoe")  # tesla's spec needs it, and a dry run reads the spec as a run does
    outs = {t: runner.plan_run("tesla", None, {"task": t}, dry_run=True).outputs for t in ("hello", "train",
                                                                                            "baseline")}
    assert all(not any(g.startswith("out/") for g in globs) for globs in outs["hello"].values())
    assert "out/rank*/log/**" in next(iter(outs["train"].values()))
    assert "out/rank*/metrics.txt" in next(iter(outs["baseline"].values()))
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "bad.yml").write_text(
        "name: bad\nparameters: {p: {type: str, default: /}}\nsteps: {launch: {command: 'true'}}\n"
        "outputs: ['{{ p }}']\n")
    with pytest.raises(UsageError, match="cannot be collected: it is too broad"):
        runner.plan_run("bad", None, {}, dry_run=True)


# --- faults: the commands they run (item 3) -------------------------------------------------------------------------
def test_the_commands_a_fault_runs_are_read_from_its_shell_line() -> None:
    jitc = load_suite("jitc").faults
    assert proof.commands_called(jitc["shred-libtorch"].command or "") == ["cp", "sudo", "shred"]
    assert proof.commands_called(jitc["shred-libtorch"].restore or "") == ["sudo", "cp"]
    assert proof.commands_called(jitc["setpci-gpu"].command or "") == ["nvidia-smi", "lspci", "sudo", "setpci"]
    # built-ins, keywords, assignments, paths, shell variables and a wrapper's options are not commands to find
    assert proof.commands_called("for i in $(seq 3); do X=1 timeout -s KILL 5 tc qdisc; [ -f a ] && kill -9 1; "
                                 "\"$HOME\"/env/bin/python x.py; /usr/sbin/ip link; done 2>&1 | tee -a log") == \
        ["seq", "timeout", "tc", "tee"]


def test_a_fault_command_is_excused_only_by_its_needs_or_what_set_up_installs() -> None:
    installs = rh.set_up_names("jitc")  # packages_system: [..., pciutils]
    assert rh.fault_command_excused("nvidia-smi", ["gpu", "nvidia-driver"], "") == "the fault's needs: declare gpu"
    assert rh.fault_command_excused("tc", ["tc"], "") == "the fault's needs: declare tc"
    assert rh.fault_command_excused("setpci", [], installs) is not None  # pciutils, on a replica not set up
    assert rh.fault_command_excused("setpci", [], "") is None  # set up: it must be there
    assert rh.fault_command_excused("wipe", ["gpu"], installs) is None  # nothing installs it


# --- static checks before any host (item 5) -------------------------------------------------------------------------
def _mutant(tmp_path: Path, suite: str, old: str, new: str) -> Any:
    from testbed.suite import load_suite as load

    _copy_suite(tmp_path, suite, old, new)
    return load(str(tmp_path / "experiments" / suite / "suite.yml"))


def test_the_shipped_suites_have_no_static_finding() -> None:
    from testbed import lint
    from testbed.suite import list_suites

    for name in list_suites():
        assert lint.lint_suite(load_suite(name)) == [], name


def test_fault_timing_reads_every_timeout_the_artifact_keeps(tmp_path: Path) -> None:
    """By class, not by suite: parameters, vars, environment variables and launch options named *timeout*, in
    seconds, minutes or milliseconds, against the grace plus a checkpoint interval given in seconds."""
    from testbed import lint

    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "t.yml").write_text(
        "name: t\nparameters: {ckpt_interval_s: {type: int, default: 30}, dl_timeout: {type: str, default: 2m}}\n"
        "vars: {nccl_timeout: '{{ 40 }}'}\nenv: {GLOO_TIMEOUT_MS: '45000'}\n"
        "steps: {launch: {command: 'python3 a.py --collective-timeout 50 --io_timeout=5'}, "
        "recovery: [{relaunch: true}]}\ntimeouts: {grace: 60}\n")
    s = load_suite(str(tmp_path / "experiments" / "t.yml"))
    found = [f.what for f in lint.lint_suite(s)]
    assert len(found) == 4 and all("plus a checkpoint interval of 30 s (ckpt_interval_s)" in f for f in found), found
    assert [f.split(" cannot cover the artifact's ")[1].split(" plus")[0] for f in found] == [
        "parameter dl_timeout 120 s", "var nccl_timeout 40 s", "environment variable GLOO_TIMEOUT_MS 45 s",
        "launch option --collective-timeout 50 s"], found
    s.faults, s.steps.recovery = {}, []  # nothing fails on purpose, nothing recovers: the grace stops no checkpoint
    assert lint.lint_suite(s) == []


def test_a_reference_is_producible_when_a_point_has_its_values_numbers_compared_as_numbers(tmp_path: Path) -> None:
    from testbed import lint

    (tmp_path / "experiments").mkdir()
    ref = ("  - {{metric: m{i}, table: t, column: c, value: 1, tolerance: {{exact: true, why: w}}, source: s, "
           "where: {where}}}\n")
    wheres = ["{share: 1, mode: fast}", "{share: 0.5}", "{mode: slow}", "{run: slow}", "{run: other}",
              "{workers: 7}"]
    (tmp_path / "experiments" / "r.yml").write_text(
        "name: r\nparameters: {share: {type: float, default: 1.0}, workers: {type: int},\n"
        "  mode: {type: str, default: fast, choices: [fast, slow]}}\nmatrix: [{share: 0.25}]\n"
        "steps: {launch: {command: 'true'}}\nreferences:\n  metrics:\n"
        + "".join(ref.format(i=i, where=w) for i, w in enumerate(wheres)))
    found = lint.lint_suite(load_suite(str(tmp_path / "experiments" / "r.yml")))
    # share 1 is 1.0 (the default point); a workers left unset may be any; 'other' is no declared value
    assert [f.what.split("'")[1] for f in found] == ["m1", "m2", "m3"], found
    assert "needs a run with share=0.5" in found[0].what and "needs a run with mode=slow" in found[1].what
    assert "reads rows of run 'slow', made by a run with mode=slow" in found[2].what


@pytest.mark.parametrize("argv", [["run", "isca-resnet18", "--dry-run"], ["run", "isca-resnet18", "--matrix",
                                                                          "--dry-run", "--json"],
                                  ["show", "isca-resnet18"]], ids=["dry-run", "matrix-dry-run", "show"])
def test_a_dry_run_and_show_print_the_static_findings_as_warnings(tmp_path: Path, argv: list[str]) -> None:
    _copy_suite(tmp_path, "isca-resnet18", "ref: 177a2b3", "ref: main")
    r = subprocess.run([sys.executable, "-m", "testbed", *argv], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "TESTBED_HOME": str(tmp_path / ".testbed"), "COLUMNS": "400"})
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: ")]
    assert len(warned) == 1 and "isca-resnet18/suite.yml:10: source isca follows ref 'main'" in warned[0], r.stderr
    assert r.returncode == 0, r.stderr  # a warning: the command itself goes on


# --- mutants of the shipped suites, rehearsed ------------------------------------------------------------------------
VARIANTS = {  # a shipped suite as another testbed would run it, before its mutation: suite:variant
    # mpi-hello's ranks as a GPU suite's compiled ranks (tesla's hello, neuronabox's collectives): their binary
    # needs what the replica lacks, so a rehearsal stands in an MPI program under the real mpirun line
    # (on a replica of GPU_QUAD, four GPU hosts as root, a testbed that declares GPUs as the hardware check asks)
    "compiled": [("  launch:\n    on: master\n",
                  "  launch:\n    on: master\n    needs: [gpu]\n    probe: [./hello_mpi]\n"),
                 ("testbed: local\n", "testbed: gpu-quad\n")],
    "kill-rank": [],  # jitc with its kill-rank fault (-p fault=kill-rank): fired on a probed rank
    # fault-drill's ranks probed (a launch that needs the network, which a replica lacks), as a suite on a testbed
    # that can power a host off: its kill-host fault fires on the probed rank's host
    "probed": [("  launch:\n    command: >-\n",
                "  launch:\n    needs: [network]\n    probe: [fault_drill.py]\n    command: >-\n")],
}


GPU_QUAD = """description: four one-GPU hosts of a lab, logged in as root (the local testbed's shape, with GPUs)
provider: {kind: lab, hosts: [{name: node0, address: 10.0.0.2}, {name: node1, address: 10.0.0.3},
                              {name: node2, address: 10.0.0.4}, {name: node3, address: 10.0.0.5}]}
user: root
hardware: {gpu: {model: NVIDIA GeForce RTX 3090, count: 1}}
"""


def _copy_suite(tmp_path: Path, suite: str, old: str | None, new: str) -> None:
    """experiments/<suite>/ (its suite.yml and the workloads it names) in ``tmp_path``, ``old`` replaced by ``new``
    once in its suite.yml (``suite:variant``: the variant's edits first, ``VARIANTS``)."""
    suite, _, variant = suite.partition(":")
    dest = tmp_path / "experiments" / suite
    shutil.copytree(EXPERIMENTS / suite, dest, dirs_exist_ok=True)
    text = (EXPERIMENTS / suite / "suite.yml").read_text()
    if variant == "compiled":
        (tmp_path / "inventories").mkdir(exist_ok=True)
        (tmp_path / "inventories" / "gpu-quad.yml").write_text(GPU_QUAD)
    for a, b in VARIANTS.get(variant, []):
        assert text.count(a) == 1, f"the variant's text must occur once in {suite}/suite.yml: {a!r}"
        text = text.replace(a, b)
    if old is not None:
        assert text.count(old) == 1, f"the mutant's text must occur once in {suite}/suite.yml: {old!r}"
        text = text.replace(old, new)
    (dest / "suite.yml").write_text(text)


def _rehearse(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "testbed", "rehearse", *args, "--subnet", free_subnet(), "--json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
                       env={**os.environ, "TESTBED_HOME": str(tmp_path / ".testbed"), **(env or {})})
    assert r.stdout.strip(), r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    out["_rc"] = r.returncode
    return out


ISCA_REPAIR = "|| sed -i '1i import tensorflow as tf' technique/replay/replay.py"
MUTANTS = [  # (id, suite, text, its mutant, what the verdict must name)
    ("output-nomatch", "mpi-hello", "outputs: [hostfile]", "outputs: [hostfiles]",
     "output hostfiles matched no file on node0, node1, node2, node3: the point did not produce it"),
    ("interface-missing", "mpi-hello", "--mca oob_tcp_if_include {{ testbed.subnet }}",
     "--mca oob_tcp_if_include enp1s0f0",
     "interface enp1s0f0 given by --mca oob_tcp_if_include: node0 has no interface enp1s0f0 (it has lo, eth0)"),
    ("edits-checkout", "isca-resnet18", ISCA_REPAIR,
     "|| sed -i '1i import tensorflow as tf' technique/detection/detection.py",
     "source isca: the run changed tracked files of ~/ISCA_AE that the suite does not declare it edits: "
     "technique/detection/detection.py"),
    ("missing-file", "isca-resnet18", "grep -q '^import tensorflow as tf' technique/replay/replay.py",
     "grep -q '^import tensorflow as tf' technique/replay/replay_.py",
     "a missing file: \"grep: technique/replay/replay_.py: No such file or directory\""),
    ("command-not-found", "isca-resnet18", "grep -q '^import tensorflow as tf'", "grepp -q '^import tensorflow as tf'",
     "a command not found: \"sh: 4: eval: grepp: not found\""),
    # item 3: faults are checked, not dropped, though jitc's ranks are probed
    ("fault-command-absent", "jitc", '&& sudo shred "$lib"', '&& sudo wipe -f "$lib"',
     "fault shred-libtorch: wipe is not found on ecetesla2 (command -v), and neither the fault's needs: nor the "
     "profile's set-up installs it"),
    ("grace-below-timeout", "jitc", "grace: 420}", "grace: 90}",
     "timeouts.grace 90 s cannot cover the artifact's parameter all_reduce_timeout 100 s plus a checkpoint"),
    ("grace-below-timeout-local", "fault-drill", "grace: 12,", "grace: 8,",
     "timeouts.grace 8 s cannot cover the artifact's parameter timeout 8 s plus a checkpoint"),
    # item 5: static checks, before any host
    ("branch-head", "isca-resnet18", "ref: 177a2b3", "ref: main",
     "source isca follows ref 'main', a branch or tag of https://github.com/YLab-UChicago/ISCA_AE.git that can move"),
    ("reference-unproducible", "isca-resnet18",
     "  experiment: [inj_immediate_infs_nans, inj_masked, inj_slow_degrade, detection, replay]",
     "  experiment: [inj_immediate_infs_nans, inj_slow_degrade, detection, replay]",
     "reference 'masked outcome' reads rows of run 'inj_masked', made by a run with experiment=inj_masked, which "
     "neither the default point nor any matrix point enables"),
    ("no-gpu-testbed", "jitc", "providers: [lab, chameleon]", "providers: [chameleon]",
     "suite jitc needs a GPU, and no shipped testbed spec it may run on (provider kinds: chameleon; specs: "
     "chameleon) declares one"),
    # a probed rank still acts as its program would (issue 37 item 1)
    ("argv-input-missing", "isca-resnet18", "fault_injection && python3 reproduce_injections.py --file injections/",
     "fault_injection && python3 reproduce_injections.py --file injection/",
     "reproduce_injections.py: --file names injection/inj_immediate_infs_nans.csv, an input that does not exist in "),
    ("grace-below-own-timeout", "jitc:kill-rank", "--all_reduce_timeout {{ all_reduce_timeout }}",
     "--all_reduce_timeout {{ all_reduce_timeout * 5 }}",
     "timeouts.grace 420 s cannot cover main.py's own all_reduce_timeout 500 s (as its parser reads this argv"),
    ("interface-missing-compiled", "mpi-hello:compiled", "--mca btl_tcp_if_include {{ testbed.subnet }}",
     "--mca btl_tcp_if_include eth7",
     "interface eth7 given by --mca btl_tcp_if_include: node0 has no interface eth7 (it has lo, eth0)"),
    # item 4: two hosts writing one path of a shared home in one step (tesla's lab: an NFS home)
    ("home-race", "tesla", "per: home   # one output file on a shared home: compiled once, not by five hosts at once",
     "per: host", "step 'compile hello_mpi' wrote ~/Scalable_ViT_DT/tesla/setup/hello_mpi from ecetesla0, "
     "ecetesla1, ecetesla2, ecetesla3 and ecetesla4 at once on the shared home: mark it `per: home`, or write "
     "per-host paths"),
    ("login-path-only", "isca-resnet18", '|| PATH="$HOME/.local/bin:$PATH" gdown', "|| gdown",
     "calls gdown, which only a login shell's PATH has (the profile installs it in ~/.local/bin"),
    # a verdict that needs another point's run: slow-degrade (README Example 3: lower than the error-free run's)
    # without the fault-free run of its own, as inj_masked keeps it
    ("cross-point-verdict", "isca-resnet18", "{% if experiment in ('inj_masked', 'inj_slow_degrade') %}cd ~",
     "{% if experiment == 'inj_masked' %}cd ~",
     "reference 'slow-degrade outcome' is judged on the run of experiment=inj_slow_degrade against 'error-free run', "
     "which only experiment=inj_masked makes"),
]
STATIC = {"grace-below-timeout", "grace-below-timeout-local", "branch-head", "reference-unproducible",
          "no-gpu-testbed", "login-path-only", "cross-point-verdict"}
"""Mutants the static checks (testbed.lint) name before any host is made."""


def _args(suite: str, request: pytest.FixtureRequest | None = None) -> tuple[list[str], dict[str, str]]:
    if suite == "jitc:kill-rank":  # the ranks start: their dependency check imports torch (the stock pair)
        assert request is not None
        return (["jitc", "--like", "chameleon", "-p", "fault=kill-rank", "--source", f"jitc={artifact('open-jitc')}",
                 "--no-setup", "--site", request.getfixturevalue("torch_pair")], {})
    args, env = _args_of(suite.partition(":")[0])
    return [suite.partition(":")[0], *args], env


def _args_of(suite: str) -> tuple[list[str], dict[str, str]]:
    if suite in ("mpi-hello", "fault-drill"):
        return ["--no-setup"], {}
    if suite == "jitc":  # a fault that runs a command (shred-libtorch), on a replica of a GPU testbed that has it
        return (["--like", "tesla", "-p", "fault=shred-libtorch", "--source", f"jitc={artifact('open-jitc')}",
                 "--no-setup"], {"WATID": "h3trinh"})
    if suite == "tesla":  # its hello on the five-host replica of the lab, whose home is shared
        return ["-p", "task=hello", "--source", f"vit={artifact('Scalable_ViT_DT')}", "--no-setup"], {"WATID": "jdoe"}
    return ["--source", f"isca={artifact('ISCA_AE')}", "--no-setup"], {"GOOGLE_CLOUD_PROJECT": "rehearsal"}


@pytest.mark.slow
@pytest.mark.parametrize("suite", ["mpi-hello", "isca-resnet18", "jitc"])
def test_the_shipped_suite_unmutated_rehearses_green(tmp_path: Path, need_local: None, suite: str,
                                                     request: pytest.FixtureRequest) -> None:
    _copy_suite(tmp_path, suite, None, "")
    args, env = _args(suite)
    if suite == "jitc":  # its dependency check imports torch: a stand-in environment that sees the stock pair
        args += ["--site", request.getfixturevalue("torch_pair")]
    out = _rehearse(tmp_path, *args, env=env)
    point = out["points"][0]
    assert out["ok"] and out["_rc"] == 0 and point["failures"] == [] and out["findings"] == [], \
        json.dumps(out, indent=1)
    if suite == "mpi-hello":
        assert point["produced"] == {"hostfile": ["node0", "node1", "node2", "node3"]}, point


@pytest.mark.slow
def test_a_compiled_rank_under_mpirun_runs_a_stand_in_through_the_real_launcher(tmp_path: Path,
                                                                                need_local: None) -> None:
    """mpi-hello's ranks as a GPU suite's compiled ranks: the binary is replaced by an MPI stand-in built with the
    replica's mpicc, the mpirun line (hostfile, --mca ..._if_include, plm_rsh_args) runs for real across the four
    hosts, and the check that reads the real binary's lines is not rehearsed (never "would fail")."""
    _copy_suite(tmp_path, "mpi-hello:compiled", None, "")
    args, env = _args("mpi-hello:compiled")
    out = _rehearse(tmp_path, *args, env=env)
    point = out["points"][0]
    assert out["ok"] and out["_rc"] == 0 and point["failures"] == [], json.dumps(out, indent=1)
    said = (Path(point["folder"]) / "node0" / "rank0.out").read_text()
    hosts = sorted(ln.rsplit(" on ", 1)[1] for ln in said.splitlines() if "MPI stand-in rank" in ln)
    assert hosts == ["node0", "node1", "node2", "node3"], said
    assert "Hello world" not in said  # the real binary never ran
    nr = point["not_rehearsed"]
    assert any(n.startswith("rank 0: ./hello_mpi stood in by an MPI program under the real mpirun line") for n in nr)
    assert any(n.startswith("check every rank said hello: reads rank0.out") for n in nr), nr
    assert {s["name"]: s["status"] for s in point["steps"]}["rehearse: build the MPI stand-in"] == "ran"


@pytest.mark.slow
def test_a_kill_host_fault_fires_on_a_probed_rank_and_the_lost_host_is_repaired_and_relaunched(
        tmp_path: Path, need_local: None) -> None:
    """Item 3: a host fault on a probed rank fires through the real supervisor (``rehearse --fault``, as run takes
    it): the probed rank's host is powered off, judged lost, repaired by the suite's recovery, and the ranks
    relaunched; what the probe cannot stand in for (the checkpoint, the training log) is named, never failed."""
    _copy_suite(tmp_path, "fault-drill:probed", None, "")
    out = _rehearse(tmp_path, "fault-drill", "--fault", "kill-host", "--no-setup", "-p", "python=python3")
    point = out["points"][0]
    assert out["ok"] and out["_rc"] == 0 and point["failures"] == [], json.dumps(out, indent=1)
    told = point["faults"][0]
    assert told.startswith("fault kill-host: fired (kill-host on node2 rank 2), detected ") and \
        "node2 rank 2: host unreachable" in told and told.endswith("ranks relaunched (attempt 1)"), told
    kinds = {e["kind"]: e for e in json.loads((Path(point["folder"]) / "manifest.json").read_text())["events"]}
    assert kinds["repaired"]["host"] == "node2" and kinds["repaired"]["detail"]["replaced"] == ["node2"], kinds
    assert kinds["resumed"]["detail"]["hosts_repaired"] == ["node2"]  # repaired, then every rank relaunched
    nr = point["not_rehearsed"]
    assert any(n.startswith("fault kill-host: fired when rank 2's probe was ready") for n in nr), nr
    assert any(n.startswith("checkpoint ckpt.pt: a probe writes none") for n in nr), nr
    unknown = subprocess.run([sys.executable, "-m", "testbed", "rehearse", "fault-drill", "--fault", "kill-hots"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
                             env={**os.environ, "TESTBED_HOME": str(tmp_path / ".testbed")})
    assert unknown.returncode == 2 and "kill-hots" in unknown.stderr and "Traceback" not in unknown.stderr, \
        unknown.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("mutant", "suite", "old", "new", "named"), MUTANTS, ids=[m[0] for m in MUTANTS])
def test_a_mutant_of_a_shipped_suite_fails_its_rehearsal_naming_the_defect(
        tmp_path: Path, need_local: None, mutant: str, suite: str, old: str, new: str, named: str,
        request: pytest.FixtureRequest) -> None:
    _copy_suite(tmp_path, suite, old, new)
    args, env = _args(suite, request)
    out = _rehearse(tmp_path, *args, env=env)
    assert out["_rc"] != 0 and not out["ok"], json.dumps(out, indent=1)
    if mutant in STATIC:  # found in the files: no replica was made, no point ran
        assert out["points"] == [] and out["replica"] == "", json.dumps(out, indent=1)
        assert any(named in f for f in out["findings"]), json.dumps(out["findings"], indent=1)
        return
    point = out["points"][0]
    found = point["failures"] + [p for pr in point["probes"] for p in pr["problems"]]  # a probe names its own
    assert not point["ok"] and any(named in f for f in found), json.dumps(point, indent=1)
    if mutant == "grace-below-own-timeout":  # judged once the fault fired on the probed victim and the ranks relaunched
        assert point["faults"][0].startswith("fault kill-rank: fired (signal on ") and \
            point["faults"][0].endswith("ranks relaunched (attempt 1)"), point["faults"]


@pytest.mark.parametrize(("mutant", "suite", "old", "new", "named"),
                         [m for m in MUTANTS if m[0] in STATIC], ids=[m[0] for m in MUTANTS if m[0] in STATIC])
def test_a_static_mutant_is_found_with_its_file_and_line(tmp_path: Path, mutant: str, suite: str, old: str,
                                                         new: str, named: str) -> None:
    """Each static mutant is one finding's class, named, at the line of the suite that shows it."""
    from testbed import lint

    s = _mutant(tmp_path, suite, old, new)
    found = lint.lint_suite(s)
    assert len({f.kind for f in found}) == 1 and any(named in f.what for f in found), found
    text = (tmp_path / "experiments" / suite / "suite.yml").read_text().splitlines()
    edited = next(i for i, ln in enumerate(text, 1) if new.strip().splitlines()[0] in ln)
    for f in found:
        path, line = f.where.rsplit(":", 1)
        assert path.endswith(f"{suite}/suite.yml"), f
        if f.kind == "reference":  # at the reference that no point can produce
            assert "where:" in text[int(line) - 1], (f, text[int(line) - 1])
        elif f.kind == "cross-point":  # at the reference judged on the point that lacks the run
            assert "metric: slow-degrade outcome" in text[int(line) - 1], (f, text[int(line) - 1])
        elif f.kind == "login-path":  # at the step's command
            assert "run:" in text[int(line) - 1] and 0 < edited - int(line) < 4, (f, edited)
        else:
            assert int(line) == edited, (f, edited)
