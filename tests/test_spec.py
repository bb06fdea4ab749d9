"""Testbed specs (testbed/spec.py + yamlfile.py): good files of every provider kind load; bad ones are refused
with the right file:line, the field, and the closest valid key."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from testbed import paths
from testbed.errors import UsageError
from testbed.providers.chameleon.settings import ChameleonSettings
from testbed.providers.gcp_tpu.settings import TpuSettings
from testbed.providers.lab.settings import LabSettings
from testbed.providers.local.settings import LocalSettings
from testbed.spec import inventory_path, load_testbed

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parent.parent


def write(tmp: Path, text: str, name: str = "tb.yml") -> Path:
    p = tmp / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def refused(path: Path) -> UsageError:
    with pytest.raises(UsageError) as ei:
        load_testbed(str(path))
    assert ei.value.code == 2 and ei.value.where and ei.value.fix
    return ei.value


# good specs ----------------------------------------------------------------------------------------
GOOD = {
    "local-minimal": ("provider: {kind: local}", LocalSettings, {"hosts": 4, "subnet": "10.213.0.0/24"}),
    "local-full": ("""
        description: eight hosts
        provider:
          kind: local
          hosts: 8
          name_prefix: vm
          subnet: 10.213.77.0/26
          bridge: br-test
        user: alice
        profile: null
        groups:
          workers: [vm1, vm2]
          gpu_nodes: [vm7]
        vars: {mpi: true, n: 3}
        """, LocalSettings, {"hosts": 8, "name_prefix": "vm", "bridge": "br-test"}),
    "lab": ("""
        provider:
          kind: lab
          key: ~/.ssh/id_ed25519
          proxy_jump: gw.example.org
          connect_timeout: 5
          hosts:
            - {name: a1, address: 192.0.2.1}
            - {name: a2, port: 2222, user: bob, key: /k, groups: [gpu]}
        user: carol
        groups: {homo: [a1]}
        """, LabSettings, {"connect_timeout": 5, "proxy_jump": "gw.example.org"}),
    "chameleon": ("""
        provider: {kind: chameleon, site: CHI@TACC, node_type: compute_zen3, count: 2, hours: 6,
                   start: now, floating_ips: false}
        user: cc
        """, ChameleonSettings, {"count": 2, "site": "CHI@TACC", "floating_ips": False}),
    "gcp-tpu": ("""
        provider:
          kind: gcp-tpu
          project: p
          accelerator_type: v4-32
          spot: true
          queued_resource: true
          endpoint: http://127.0.0.1:8080
        """, TpuSettings, {"accelerator_type": "v4-32", "spot": True, "queued_resource": True}),
    "env-default": ("""
        provider: {kind: lab, hosts: [{name: h, address: "${TB_SPEC_UNSET_ADDR:-127.0.0.1}"}]}
        user: "${TB_SPEC_UNSET_USER:-root}"
        """, LabSettings, {}),
}


@pytest.mark.parametrize("case", list(GOOD))
def test_good_spec_loads(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TB_SPEC_UNSET_ADDR", raising=False)
    monkeypatch.delenv("TB_SPEC_UNSET_USER", raising=False)
    text, cls, fields = GOOD[case]
    p = write(tmp_path, text, "my-bed.yml")
    spec = load_testbed(str(p))
    assert spec.name == "my-bed" and spec.source == str(p)  # the name defaults to the file's stem
    assert isinstance(spec.provider, cls) and spec.kind == spec.provider.kind
    for k, v in fields.items():
        assert getattr(spec.provider, k) == v


def test_env_expansion_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TB_SPEC_USER", "dora")
    monkeypatch.delenv("TB_SPEC_UNSET_ADDR", raising=False)
    p = write(tmp_path, """
        provider: {kind: lab, hosts: [{name: h, address: "${TB_SPEC_UNSET_ADDR:-10.0.0.1}"}]}
        user: ${TB_SPEC_USER}
        """)
    spec = load_testbed(str(p))
    assert spec.user == "dora"
    assert isinstance(spec.provider, LabSettings) and spec.provider.hosts[0].address == "10.0.0.1"


def test_host_names_and_default_groups(tmp_path: Path) -> None:
    spec = load_testbed(str(write(tmp_path, "provider: {kind: local, hosts: 3}\ngroups: {gpu: [node2]}")))
    assert spec.host_names() == ["node0", "node1", "node2"]
    assert spec.groups_for("node0", 0) == ["master"]
    assert spec.groups_for("node2", 2) == ["gpu", "workers"]
    explicit = load_testbed(str(write(tmp_path, "provider: {kind: local, hosts: 3}\n"
                                                "groups: {master: [node1], workers: [node0]}", "x.yml")))
    assert explicit.groups_for("node0", 0) == ["workers"] and explicit.groups_for("node1", 1) == ["master"]
    cloud = load_testbed(str(write(tmp_path, "provider: {kind: chameleon}", "c.yml")))
    assert cloud.host_names() is None


def test_shipped_inventories_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATID", "jdoe")
    monkeypatch.chdir(REPO)
    kinds = {}
    for name in ("local", "tesla", "chameleon", "tpu"):
        spec = load_testbed(name)
        kinds[name] = spec.kind
        assert spec.name == name
    assert kinds == {"local": "local", "tesla": "lab", "chameleon": "chameleon", "tpu": "gcp-tpu"}


def test_cwd_inventory_overrides_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "inventories").mkdir()
    write(tmp_path / "inventories", "provider: {kind: local, hosts: 2}", "local.yml")
    monkeypatch.chdir(tmp_path)
    assert inventory_path("local") == tmp_path / "inventories" / "local.yml"
    assert load_testbed("local").provider.hosts == 2  # type: ignore[union-attr]
    assert "local" in paths.list_resources("inventories")


# bad specs: (yaml, fragments of the message, expected line) ----------------------------------------
BAD: dict[str, tuple[str, list[str], int | None]] = {
    "syntax-tab": ("provider:\n\tkind: local\n", ["not valid YAML"], 2),
    "syntax-colon": ("provider:\n  kind: local\n  hosts 4\n  user: x\n", ["not valid YAML"], 4),
    "syntax-flow": ("a: [1, 2\nb: 3\n", ["not valid YAML"], 2),
    "duplicate": ("provider:\n  kind: local\nuser: a\nuser: b\n", ["duplicate key"], 4),
    "top-list": ("- 1\n", ["top level must be a mapping"], 1),
    "empty": ("", ["missing required field 'provider'"], None),
    "unknown-top": ("provider: {kind: local}\n\ngrups: {}\n", ["unknown key 'grups'", "did you mean 'groups'"], 3),
    "unknown-top-desc": ("provider: {kind: local}\ndescripton: x\n",
                         ["unknown key 'descripton'", "did you mean 'description'"], 2),
    "unknown-local": ("provider:\n  kind: local\n  hots: 2\n", ["unknown key 'hots'", "did you mean 'hosts'"], 3),
    "unknown-local-subnet": ("provider:\n  kind: local\n  hosts: 2\n  sbunet: 10.0.0.0/24\n",
                             ["unknown key 'sbunet'", "did you mean 'subnet'"], 4),
    "unknown-lab": ("provider:\n  kind: lab\n  hosts: [{name: a}]\n  proxyjump: gw\n",
                    ["unknown key 'proxyjump'", "did you mean 'proxy_jump'"], 4),
    "unknown-lab-host": ("provider:\n  kind: lab\n  hosts:\n    - name: a\n    - name: b\n      prot: 22\n",
                         ["unknown key 'prot'", "did you mean 'port'"], 6),
    "unknown-chameleon": ("provider:\n  kind: chameleon\n  floating_ip: true\n",
                          ["unknown key 'floating_ip'", "did you mean 'floating_ips'"], 3),
    "unknown-tpu": ("provider:\n  kind: gcp-tpu\n  runtime: tf\n",
                    ["unknown key 'runtime'", "did you mean 'runtime_version'"], 3),
    "unknown-nohint": ("provider:\n  kind: local\n  qqqq: 1\n", ["unknown key 'qqqq'", "valid keys here"], 3),
    "kind-unknown": ("provider:\n  kind: docker\n", ["unknown provider.kind 'docker'", "kind is one of: local"], 2),
    "kind-missing": ("provider:\n  hosts: 2\n", ["bad value for 'provider'", "'kind'"], 1),
    "local-hosts-type": ("provider:\n  kind: local\n  hosts: many\n", ["'provider.hosts'", "integer"], 3),
    "local-hosts-zero": ("provider:\n  kind: local\n  hosts: 0\n", ["'provider.hosts'", "greater than or equal"], 3),
    "local-subnet": ("provider:\n  kind: local\n  subnet: 300.1.1.0/24\n", ["not an IPv4 subnet"], 3),
    "local-subnet-host-bits": ("provider:\n  kind: local\n  subnet: 10.1.1.5/24\n", ["not an IPv4 subnet"], 3),
    "local-subnet-small": ("provider:\n  kind: local\n  subnet: 10.1.1.0/30\n", ["too small"], 3),
    "local-subnet-multicast": ("provider:\n  kind: local\n  subnet: 224.0.0.0/24\n", ["private range"], 3),
    "local-fit": ("provider:\n  kind: local\n  hosts: 13\n  subnet: 10.1.1.0/28\n", ["do not fit"], 1),
    "local-prefix": ("provider:\n  kind: local\n  name_prefix: Node\n", ["'provider.name_prefix'"], 3),
    "lab-empty": ("provider:\n  kind: lab\n  hosts: []\n", ["'provider.hosts'", "at least 1"], 3),
    "lab-missing-hosts": ("provider:\n  kind: lab\n", ["missing required field 'provider.hosts'"], 1),
    "lab-host-name": ("provider:\n  kind: lab\n  hosts:\n    - {address: x}\n",
                      ["missing required field 'provider.hosts.0.name'"], 4),
    "lab-host-badname": ("provider:\n  kind: lab\n  hosts:\n    - {name: 'a b'}\n",
                         ["'provider.hosts.0.name'"], 4),
    "lab-port": ("provider:\n  kind: lab\n  hosts:\n    - {name: a, port: 0}\n", ["'provider.hosts.0.port'"], 4),
    "lab-timeout": ("provider:\n  kind: lab\n  connect_timeout: 0\n  hosts: [{name: a}]\n",
                    ["'provider.connect_timeout'"], 3),
    "chameleon-count": ("provider:\n  kind: chameleon\n  count: 65\n", ["'provider.count'", "less than or equal"], 3),
    "chameleon-hours": ("provider:\n  kind: chameleon\n  hours: -2\n", ["'provider.hours'"], 3),
    "chameleon-timeout": ("provider:\n  kind: chameleon\n  lease_timeout: 1\n", ["'provider.lease_timeout'"], 3),
    "tpu-count": ("provider:\n  kind: gcp-tpu\n  count: zero\n", ["'provider.count'"], 3),
    "tpu-bool": ("provider:\n  kind: gcp-tpu\n  preemptible: sometimes\n", ["'provider.preemptible'", "boolean"], 3),
    "user-meta": ("provider: {kind: local}\nuser: 'r$(id)'\n", ["bad value for 'user'"], 2),
    "name-meta": ("name: 'x;y'\nprovider: {kind: local}\n", ["bad value for 'name'"], 1),
    "groups-type": ("provider: {kind: local}\ngroups:\n  workers: node1\n", ["'groups.workers'"], 3),
    "groups-unknown-host": ("provider: {kind: lab, hosts: [{name: a}]}\ngroups: {g: [b]}\n",
                            ["names unknown host 'b'"], 2),
    "groups-name": ("provider: {kind: local}\ngroups: {'9x': [node0]}\n", ["group name '9x'"], 2),
    "env-unset": ("provider: {kind: local}\n\nuser: ${TB_SPEC_NEVER_SET}\n",
                  ["environment variable TB_SPEC_NEVER_SET is not set", "user"], 3),
    "env-unset-nested": ("provider:\n  kind: lab\n  hosts:\n    - name: a\n      key: ${TB_SPEC_NEVER_SET}\n",
                         ["TB_SPEC_NEVER_SET", "provider.hosts.0.key"], 5),
    "two-problems": ("provider:\n  kind: local\n  hots: 2\n  sbunet: x\n",
                     ["unknown key 'hots'", "also: unknown key 'sbunet' (line 4)"], 3),  # every problem, each line
    "kind-typo": ("provider:\n  site: CHI@UC\n  kind: chameloen\nuser: 5bad\n",
                  ["unknown provider.kind 'chameloen'", "did you mean 'chameleon'?", "also: bad value for 'user'"], 3),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_spec_refused(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TB_SPEC_NEVER_SET", raising=False)
    text, frags, line = BAD[case]
    p = write(tmp_path, text, "bad.yml")
    e = refused(p)
    msg = f"{e.what} | {e.fix}"
    for f in frags:
        assert f in msg, msg
    assert e.where is not None and e.where.startswith(str(p))
    if line is not None:
        where_line = e.where[len(str(p)):].lstrip(":").split(":")[0]
        assert where_line == str(line), f"{case}: where={e.where}, expected line {line}"


def test_unreadable_and_unknown_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="not a testbed name"):
        load_testbed("Bad Name")
    with pytest.raises(UsageError, match="no testbed named 'zzz-none'") as ei:
        load_testbed("zzz-none")
    assert "known testbeds" in (ei.value.fix or "")
    with pytest.raises(UsageError) as ei:
        load_testbed("loca")
    assert "did you mean 'local'" in (ei.value.fix or "")


def test_misspelt_required_key_gets_a_hint(tmp_path: Path) -> None:
    e = refused(write(tmp_path, "provder:\n  kind: local\n"))
    assert "did you mean 'provider'" in f"{e.what} {e.fix}"


def test_a_declared_variable_that_is_not_set_is_refused_with_its_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """tesla's spec reads $WATID and says what it is: the error says it too, with the example's shape."""
    monkeypatch.delenv("WATID", raising=False)
    monkeypatch.chdir(REPO)
    with pytest.raises(UsageError) as e:
        load_testbed("tesla")
    assert "WATID is not set" in e.value.what and "account name on the ecetesla lab machines" in e.value.what
    assert "export WATID=" in e.value.fix and "jdoe" in e.value.fix and "default" not in e.value.fix
    assert e.value.where.endswith("inventories/tesla.yml:17")


def test_a_rehearsal_stands_in_for_a_declared_variable_with_its_example(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.spec import stand_ins

    monkeypatch.delenv("LABUSER", raising=False)
    monkeypatch.setenv("OTHER", "mine")
    path = write(tmp_path, "provider: {kind: lab, hosts: [{name: a, address: a.example}]}\nuser: ${LABUSER}\n"
                 "env:\n  LABUSER: {help: your lab account, example: jdoe}\n  OTHER: {help: x, example: y}\n"
                 "  NOEXAMPLE: {help: no example}\n", "lab.yml")
    with stand_ins(str(path)) as made:
        assert made == {"LABUSER": "jdoe"}  # set ones are kept, ones without an example are left out
        assert load_testbed(str(path)).user == "jdoe"
    assert "LABUSER" not in os.environ and os.environ["OTHER"] == "mine"
    with pytest.raises(UsageError, match="your lab account"):
        load_testbed(str(path))
    with pytest.raises(UsageError, match="help"):  # a declaration without its help is refused at its line
        load_testbed(str(write(tmp_path, "provider: {kind: local}\nenv: {X: {example: 1}}\n", "bad.yml")))


# a spec testbed ships: its fixes say how to copy it here, never to edit it inside site-packages ----------------
def _site_packages(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """testbed as a wheel installs it: the shipped specs under site-packages/testbed/_data/inventories (here a
    copy of the checkout's), PACKAGE_DIR pointing there; the user in an empty folder beside it."""
    import shutil

    pkg = tmp / "venv" / "lib" / "python3.11" / "site-packages" / "testbed"
    shutil.copytree(REPO / "inventories", pkg / "_data" / "inventories")
    monkeypatch.setattr(paths, "PACKAGE_DIR", pkg)
    here = tmp / "work"
    here.mkdir()
    monkeypatch.chdir(here)
    return pkg / "_data" / "inventories"


def test_an_unset_variable_in_a_shipped_spec_says_how_to_copy_it_here(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A shipped spec reads $LABUSER without declaring it: from a wheel, the fix gives the exact cp into
    inventories/ and names the copy, not 'the file' in site-packages; the command works as written, and the copy
    is then the user's own (its fix says to edit it in place)."""
    import subprocess

    shipped = _site_packages(tmp_path, monkeypatch)
    (shipped / "lab2.yml").write_text("provider: {kind: lab, hosts: [{name: a, address: a.example}]}\n"
                                      "user: ${LABUSER}\n")
    monkeypatch.delenv("LABUSER", raising=False)
    e = refused(Path("lab2"))  # by name, as the CLI loads it
    assert e.where == f"{shipped / 'lab2.yml'}:2"
    cmd = f"mkdir -p inventories && cp {shipped / 'lab2.yml'} inventories/"
    assert e.fix == (f"export LABUSER=... before running testbed, or copy it here ({cmd}), then write "
                     "${LABUSER:-default} in inventories/lab2.yml"), e.fix
    subprocess.run(cmd, shell=True, check=True)  # the fix's command, exactly as a user pastes it
    e = refused(Path("lab2"))
    copy = Path.cwd().resolve() / "inventories" / "lab2.yml"
    assert e.where == f"{copy}:2"
    assert e.fix == f"export LABUSER=... before running testbed, or write ${{LABUSER:-default}} in {copy}", e.fix


def test_own_copy_names_a_shipped_suite_folder_and_leaves_the_users_files_alone(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = _site_packages(tmp_path, monkeypatch)
    suite = shipped.parent / "experiments" / "tesla" / "suite.yml"
    suite.parent.mkdir(parents=True)
    suite.write_text("name: tesla\n")
    assert paths.own_copy(suite) == (f"mkdir -p experiments && cp -r {suite.parent} experiments/",
                                     "experiments/tesla/suite.yml")
    mine = tmp_path / "elsewhere.yml"  # a spec given by its path: the user's own wherever it is
    mine.write_text("provider: {kind: local}\n")
    assert paths.own_copy(mine) is None and paths.edit_hint(mine, "set x") == f"set x in {mine}"
    assert paths.own_copy(Path.cwd() / "inventories" / "a.yml") is None
