"""neuronabox against the real NeuronaBox and NeuronaBox-NCCL trees: defects that show only when the steps run in
order on real two-host testbeds (the authors' NIC, a shared home, gitignored folders, the builds' environment).

Facts come from the unpacked artifacts (``artifact()``; skipped when ../shared is absent), never from copies.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from artifacts import artifact

from testbed.records import RunPlan, RunStep
from testbed.run.plan import HostInfo, TestbedInfo, build_plan
from testbed.suite import load_suite, resolve_params

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "experiments" / "neuronabox" / "profile.yml"


def plan(hardware: dict[str, Any] | None = None, subnet: str = "0.0.0.0/0", **given: Any) -> RunPlan:
    s = load_suite("neuronabox")
    hw = {"shared_home": False, "interface": None, "gpu_model": None, "gpus": 0, "login_shell": None,
          **(hardware or {})}
    hosts = [HostInfo("gpu1", "10.1.0.5", ["master"], {}), HostInfo("gpu2", "10.1.0.6", ["workers"], {})]
    tb = TestbedInfo("lab2", "lab", hosts, {"name": "lab2", "provider": "lab", "subnet": subnet, "ssh_config": "x",
                                             "hardware": hw})
    return build_plan(s, tb, resolve_params(s, {k: str(v) for k, v in given.items()}))


def step_named(p: RunPlan, word: str) -> RunStep:
    return next(s for s in p.prepare if word in s.name)


# --- class 3: the authors' NIC ---------------------------------------------------------------------------------
def authors_nic() -> str:
    nics = set(re.findall(r"btl_tcp_if_include (\S+)", (artifact("NeuronaBox") / "eval/coll/README.md").read_text()))
    assert len(nics) == 1, nics
    return nics.pop()


def test_btl_interface_comes_from_the_testbed_never_the_authors_nic() -> None:
    nic = authors_nic()  # enp1s0f0
    declared = plan({"interface": "eno1"}, experiment="coll").ranks[1].command
    assert "--mca btl_tcp_if_include eno1 " in declared and nic not in declared
    assert "NCCL_SOCKET_IFNAME=eno1" in declared and "-x NCCL_SOCKET_IFNAME" in declared
    cidr = plan(subnet="10.1.0.0/24", experiment="coll").ranks[1].command
    assert "--mca btl_tcp_if_include 10.1.0.0/24 " in cidr and nic not in cidr
    unknown = plan(experiment="coll").ranks[1].command  # lab/chameleon: no subnet known, OpenMPI picks (not lo)
    assert "btl_tcp_if_include" not in unknown and nic not in unknown and "NCCL_SOCKET_IFNAME" not in unknown


# --- class 7: a home shared over NFS ---------------------------------------------------------------------------
_WRITE = re.compile(r"(?:>\s*|-o\s+|ln -sfn \S+\s+)(\S+)")


def _home_writes(cmd: str) -> set[str]:
    """Paths under ~ a command writes (``> f``, ``-o f``, ``ln -sfn x f``), relative ones after its ``cd``."""
    out, here = set(), None
    for part in re.split(r"&&|;", cmd):
        if m := re.match(r"\s*cd (\S+)", part):
            here = m[1]
        for t in _WRITE.findall(part):
            path = t if t.startswith(("/", "~", "$HOME")) else f"{here}/{t}" if here else t
            path = path.replace("$HOME/", "~/")
            if path.startswith("~/"):
                out.add(path)
    return out


def test_shared_home_no_two_hosts_write_one_file_differently() -> None:
    for exp in ("coll", "cnn", "bert", "deeplight", "fsdp"):
        p = plan({"shared_home": True}, experiment=exp)
        for st in p.prepare:
            seen: dict[str, tuple[str, str]] = {}
            for h in st.hosts:
                for path in _home_writes(st.commands[h]):
                    if path in seen and seen[path][1] != st.commands[h]:
                        pytest.fail(f"{exp}: '{st.name}' writes {path} on {seen[path][0]} and {h} differently in "
                                    "one shared home")
                    seen[path] = (h, st.commands[h])


def test_mpirun_prefix_is_host_local_and_per_host() -> None:
    p = plan({"shared_home": True}, experiment="coll")
    prefix = re.search(r"--prefix (\S+)", p.ranks[1].command)[1]
    assert not prefix.startswith(("~", "$HOME")), "a prefix under a shared home names one env for both hosts"
    links = {h: c for h, c in step_named(p, "mpirun --prefix").commands.items()}
    assert links["gpu1"] != links["gpu2"] and all(c.endswith(prefix) for c in links.values())


def test_each_rank_results_file_is_collected_from_its_own_host_only() -> None:
    main = (artifact("NeuronaBox") / "eval/CNN/main.py").read_text()
    m = re.search(r'open\(f"(\w+)\{args\.rank\}(\.\w+)", "w"\)', main)  # main.py:364 results{rank}.txt
    assert m
    p = plan({"shared_home": True}, experiment="cnn")
    for r in p.ranks:
        name = f"~/NeuronaBox/eval/CNN/{m[1]}{r.rank}{m[2]}"
        holders = [h for h, globs in p.outputs.items() if any(fnmatch.fnmatch(name, g) for g in globs)]
        assert holders == [r.host], f"{name} collected from {holders}"


# --- class 2: folders the repository ignores or never creates --------------------------------------------------
def _ignored(rel: str) -> bool:
    nb = artifact("NeuronaBox")
    pats = [ln.strip() for ln in (nb / "eval/.gitignore").read_text().splitlines() if ln.strip()]
    return any(rel.split("/")[0] + "/" == p for p in pats)


def test_bert_results_folder_is_made_on_rank0_host() -> None:
    run_sh = (artifact("NeuronaBox") / "eval/BERT/run.sh").read_text()
    folder = re.search(r"--json-summary=(\w+)/", run_sh)[1]  # results/BERT_..json, rank 0 only (run_squad.py:889)
    assert _ignored(folder + "/x") and not (artifact("NeuronaBox") / "eval/BERT" / folder).exists()
    p = plan(experiment="bert")
    data = step_named(p, "a host folder")  # needs no network: a rehearsal makes it too
    cmd = data.commands[p.ranks[0].host]
    assert "cd ~/NeuronaBox/eval/BERT" in cmd and re.search(rf"mkdir -p [^&]*\b{folder}\b", cmd)


def test_every_eval_gets_the_data_it_reads() -> None:
    nb = artifact("NeuronaBox")
    run_sh = (nb / "eval/BERT/run.sh").read_text()
    bert = [re.search(rf'^{v}="\./(\S+)"', run_sh, re.M)[1] for v in ("init_checkpoint", "vocab_file", "CONFIG_FILE")]
    bert.append(re.search(r'^squad_dir="\./(\S+)"', run_sh, re.M)[1] + "/train-v1.1.json")
    deeplight = re.findall(r"\{datadir\}/(\w+\.\w+)", (nb / "eval/DeepLight/main_all.py").read_text())
    main = (nb / "eval/CNN/main.py").read_text()
    cnn = ["dataset/" + d for d in re.findall(r"os\.path\.join\(args\.data\[0\], '(\w+)'\)", main)
           if f"#valdir = os.path.join(args.data[0], '{d}')" not in main]
    fsdp_urls = re.findall(r"wget -P data (\S+)", (nb / "eval/FSDP/download_dataset.sh").read_text())
    wants = {"cnn": cnn, "bert": bert, "deeplight": deeplight[-1:],
             "fsdp": [u.rsplit("/", 1)[1] for u in fsdp_urls] + [fsdp_urls[0].rsplit("/", 1)[0]]}
    assert set(cnn) == {"dataset/train", "dataset/validation"} and len(bert) == 4 and fsdp_urls
    for exp, files in wants.items():
        for f in files:
            if not f.startswith("https:"):
                assert not (nb / "eval" / exp.upper().replace("DEEPLIGHT", "DeepLight") / f).exists()
        for shared in (False, True):
            p = plan({"shared_home": shared}, experiment=exp, deeplight_data="/data/criteo-tiny")
            datas = [st for st in p.prepare if "data" in st.name]  # from a host folder or made here; downloaded
            assert len(datas) == 2 and all(d.hosts == (["gpu1"] if shared else ["gpu1", "gpu2"]) for d in datas)
            for f in files:
                assert any(f in d.commands["gpu1"] for d in datas), f"{exp}: nothing prepares {f}"
    fsdp = step_named(plan(experiment="fsdp"), "downloaded").commands["gpu1"]
    assert "download_dataset.sh" not in fsdp and "[ -s data/$f ]" in fsdp  # wget -P again writes *.csv.1 copies


def test_fsdp_requirements_are_pinned_where_its_imports_need_it() -> None:
    nb = artifact("NeuronaBox") / "eval/FSDP"
    assert "load_metric" in (nb / "summarization_dataset.py").read_text()  # gone in datasets 3
    assert "from pkg_resources import packaging" in (nb / "utils/environment.py").read_text()  # setuptools < 70
    assert re.search(r"^datasets$", (nb / "requirements.txt").read_text(), re.M)  # unpinned upstream
    cmd = step_named(plan(experiment="fsdp"), "requirements").commands["gpu1"]
    assert "'datasets>=2.16,<3'" in cmd and "'setuptools<70'" in cmd and "requirements.txt" in cmd


def test_steps_declare_what_they_need() -> None:
    s = load_suite("neuronabox")
    for st in s.steps.prepare:
        if "nvcc" in st.run or "cuda_ext" in st.run:
            assert "cuda" in st.needs, st.name
        if re.search(r"\bcurl\b|pip install|git clone", st.run):
            assert "network" in st.needs, st.name
    assert {"gpu", "cuda"} <= set(plan(experiment="cnn").ranks[0].needs)


# --- the profile: build environment, set-up vs the suite's checkout, shared home ------------------------------
def _profile_roles(shared_home: bool, flavor: str, facts: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    prof = yaml.safe_load(PROFILE.read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    ctx: dict[str, Any] = {"ansible_facts": {"user_dir": "/home/u", "distribution": "Ubuntu",
                                             "distribution_version": "22.04", "architecture": "x86_64"},
                           "testbed_hardware": {"shared_home": shared_home}, "neuronabox_flavor": flavor,
                           **(facts or {})}

    def r(v: Any) -> Any:
        if isinstance(v, str):
            for _ in range(4):
                v = env.from_string(v).render(**ctx).strip()
            return v
        if isinstance(v, dict):
            return {k: r(x) for k, x in v.items()}
        if isinstance(v, list):
            return [r(x) for x in v]
        return v

    for k in ("neuronabox_env", "neuronabox_nccl_src"):
        if k in prof["vars"]:
            ctx[k] = r(prof["vars"][k])
    return [{"role": x["role"], **r(x.get("vars", {}))} for x in prof["roles"]]


def test_setup_does_not_fill_the_suites_checkout() -> None:
    suite_src = [s.path.replace("~", "/home/u") for s in load_suite("neuronabox").sources]
    for role in _profile_roles(False, "emu"):
        if role["role"] == "source_build":
            dest = role.get("source_build_dest", f"/home/u/src/{role['source_build_name']}")
            assert not any(dest == p or dest.startswith(p + "/") for p in suite_src), dest


def test_builds_use_the_envs_cuda_nccl_and_requirements() -> None:
    common = (artifact("NeuronaBox-NCCL") / "makefiles/common.mk").read_text()
    assert re.search(r"^CUDA_HOME \?= /usr/local/cuda", common, re.M)
    build_pt = (artifact("NeuronaBox") / "scripts/build_pytorch.sh").read_text()
    wanted = re.findall(r"export (NCCL_\w+_DIR)=", build_pt)
    assert wanted and "pip install -r requirements.txt" in build_pt
    roles = [x for x in _profile_roles(False, "ori") if x["role"] == "source_build"]
    nccl = next(x for x in roles if x["source_build_name"] == "nccl-ori")
    torch = next(x for x in roles if x["source_build_name"] == "pytorch-ori")
    env = "/home/u/neurona/ori"
    assert nccl["source_build_env"]["CUDA_HOME"] == env and nccl["source_build_env"]["CUDA_LIB"] == f"{env}/lib"
    assert torch["source_build_env"]["CUDA_HOME"] == env
    assert all(torch["source_build_env"][k].startswith(env) for k in wanted)
    assert any("requirements.txt" in s for s in torch.get("source_build_pre_steps", []))


def test_profile_shared_home_keeps_hosts_apart_and_installs_as_the_user() -> None:
    roots = {f: next(x for x in _profile_roles(True, f) if x["role"] == "python_env")["python_env_conda_root"]
             for f in ("emu", "ori")}
    assert roots["emu"] != roots["ori"]
    alone = next(x for x in _profile_roles(False, "emu") if x["role"] == "python_env")
    assert alone.get("python_env_conda_root", "/home/u/miniforge3") == "/home/u/miniforge3"
    nccl = next(x for x in _profile_roles(True, "emu") if x.get("source_build_name") == "nccl-emu")
    assert nccl["source_build_install_become"] is False  # a stage under ~ on root_squash NFS


def test_the_torch_check_expects_the_commit_each_flavor_built_never_the_authors_hash() -> None:
    """Class: a set-up check that a build cannot pass. torch names the commit it was built from (+git<7 of HEAD>);
    the emu and ori branches are two commits, so the README's one hash (the authors' build) failed at least one
    host at the last role, after hours of builds. The check now expects the commit source_build resolved there."""
    readme = (artifact("NeuronaBox") / "README.md").read_text()
    authors = re.search(r"torch.__version__ # expect (\S+)", readme)
    assert authors, "the README's expected torch version"
    sb = (ROOT / "playbooks/roles/source_build/tasks/main.yml").read_text()
    assert "source_build_commits:" in sb and "combine({source_build_name: source_build_commit})" in sb
    commits = {"pytorch-emu": "1234567" + "0" * 33, "pytorch-ori": "89abcde" + "f" * 33}
    for flavor in ("emu", "ori"):
        check = next(x for x in _profile_roles(False, flavor, {"source_build_commits": commits})
                     if x["role"] == "gpu_check")
        assert check["gpu_check_expect_torch"] == "2.2.0a0+git" + commits[f"pytorch-{flavor}"][:7]
        assert check["gpu_check_expect_torch"] != authors[1]
        assert check["gpu_check_expect_nccl"] == "2.19.4"
    unbuilt = next(x for x in _profile_roles(False, "emu") if x["role"] == "gpu_check")
    assert unbuilt["gpu_check_expect_torch"] == ""  # a host that built nothing here: reported, not judged


def test_a_fixed_built_torch_hash_against_a_branch_build_is_a_static_finding(tb_home: Path) -> None:
    """The class as testbed.lint reads it before any host: a mutant of the profile expecting the authors' hash."""
    from testbed import lint

    text = PROFILE.read_text()
    start = text.index("      gpu_check_expect_torch: >-\n")
    end = text.index("\n", text.index("source_build_commits | default({})", start)) + 1
    dest = tb_home / "experiments" / "neuronabox"
    dest.mkdir(parents=True)
    (dest / "suite.yml").write_text((PROFILE.parent / "suite.yml").read_text())
    (dest / "profile.yml").write_text(text[:start] + "      gpu_check_expect_torch: 2.2.0a0+git8ac9b20\n" + text[end:])
    found = lint.built_version_checks("neuronabox")
    assert len(found) == 1, found
    assert found[0].kind == "built-version" and found[0].what.startswith(
        "gpu_check expects torch 2.2.0a0+git8ac9b20, the build of commit 8ac9b20, and the profile builds "
        "pytorch-{{ neuronabox_flavor }} at \"{{ 'emu' if "), found[0].what
    assert found[0].where.startswith(str(dest / "profile.yml") + ":")
    (dest / "profile.yml").write_text(text)
    assert lint.built_version_checks("neuronabox") == []
