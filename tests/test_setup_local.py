"""Set-up on real local hosts: every role applied, re-applied with changed=0, --check, reboot, SSH drop.

One 4-host local testbed for the module. Artifacts (a git repository, wheels, dataset files) are served
over HTTP from this machine on the testbed's bridge address: no traffic leaves the machine.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localbed import can_raise_memlock, probe_wheel

from testbed import paths, setup

pytestmark = [pytest.mark.local, pytest.mark.slow]

HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello from tb-hello"); return 0; }\n'
MAKEFILE = ("PREFIX ?= /usr/local\nall: tb-hello\ntb-hello: hello.c\n\tcc -O2 -o tb-hello hello.c\n"
            "install: tb-hello\n\tinstall -D -m 755 tb-hello $(DESTDIR)$(PREFIX)/bin/tb-hello\n")
TIMINGS: dict[str, float] = {}


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def _bare_repo(served: Path, name: str, files: dict[str, str]) -> None:
    work = served / f"{name}-work"
    work.mkdir()
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    _git(work, "init", "-q", "-b", "main")
    _git(work, "add", ".")
    _git(work, "commit", "-q", "-m", "init")
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(served / f"{name}.git")], check=True)
    subprocess.run(["git", "update-server-info"], cwd=served / f"{name}.git", check=True)  # dumb HTTP


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def bed(shared_local_testbed: Any) -> Any:
    return shared_local_testbed


@pytest.fixture(scope="module")
def served(bed: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An HTTP server on the bridge address with a repo, wheels and dataset files."""
    import ipaddress

    root = tmp_path_factory.mktemp("served")
    _bare_repo(root, "tbhello", {"hello.c": HELLO_C, "Makefile": MAKEFILE})
    bad_json = '{"train_batch_size": 80,\n "fp16": {"enabled": false},\n}\n'  # the artifact's trailing comma
    hello = (Path(setup.roles_dir()) / "mpi/files/mpi_check.c").read_text()
    _bare_repo(root, "vit", {"tesla/deepspeed_config.json": bad_json, "tesla/setup/hello_mpi.c": hello})
    (root / "wheels").mkdir()
    probe_wheel(root / "wheels")
    blob = os.urandom(200_000)
    (root / "blob.bin").write_bytes(blob)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"label,value\ncat,1\n"
        info = tarfile.TarInfo("tbdata/train.csv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (root / "tbdata.tar.gz").write_bytes(buf.getvalue())
    gw = str(ipaddress.IPv4Network(bed.spec.provider.subnet).network_address + 1)
    srv = http.server.ThreadingHTTPServer((gw, 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://{gw}:{srv.server_address[1]}"
    yield {"url": url, "host": gw, "root": root, "blob_sha": hashlib.sha256(blob).hexdigest(),
           "tar_sha": hashlib.sha256(buf.getvalue()).hexdigest()}
    srv.shutdown()


def _on_all(bed: Any, command: str) -> dict[str, str]:
    out = {}
    for h in bed.hosts:
        r = bed.ssh(h.name, command)
        out[h.name] = r.stdout.strip() if r.returncode == 0 else f"rc={r.returncode}: {r.stderr.strip()}"
    return out


def _apply_twice(bed: Any, label: str, **kw: Any) -> setup.SetupResult:
    t = time.monotonic()
    first = setup.apply(bed.name, **kw)
    TIMINGS[f"{label} first"] = time.monotonic() - t
    assert first.ok, first.to_json()
    t = time.monotonic()
    again = setup.apply(bed.name, verify=True, **kw)  # Ansible again on every host (not skipped): idempotence
    TIMINGS[f"{label} no-op"] = time.monotonic() - t
    assert again.ok and again.ran, again.to_json()
    assert again.changed == 0 and not again.drift, {h: (r.changed, r.ok) for h, r in again.hosts.items()}
    return first


def test_tesla_profile_then_noop(bed: Any, served: dict[str, Any]) -> None:
    """base + tesla: ssh mesh, zsh, packages, mpi hello on 4 hosts, venv (wheelhouse), repo fix, GPU report (zsh:
    the shell role changing the login shell as root may; the lab profile itself keeps the lab's tcsh)."""
    url = served["url"]
    offline = {"shell_name": "zsh", "tesla_pip_packages": ["tbprobe==1.0"], "tesla_verify_imports": ["tbprobe"],
               "python_env_pip_extra_index_urls": [], "python_env_pip_no_index": True,
               "python_env_pip_find_links": [f"{url}/wheels/"],
               "python_env_pip_extra_args": f"--trusted-host {served['host']}",
               "tesla_repo": f"{url}/vit.git", "tesla_version": "main",
               "tesla_cifar10": {"name": "cifar10", "url": f"{url}/tbdata.tar.gz",
                                 "dest": "~/datasets/cifar10/tbdata.tar.gz", "sha256": served["tar_sha"],
                                 "extract_to": "~/datasets/cifar10", "creates": "~/datasets/cifar10/tbdata/train.csv"}}
    events: list[dict[str, Any]] = []
    first = _apply_twice(bed, "tesla", profile="tesla", extra_vars=offline, on_event=events.append)
    assert first.changed > 0 and set(first.hosts) == {h.name for h in bed.hosts}
    # the wheelhouse's download on the controller was shown as it went (pip's own progress, read live)
    downloads = [e["download"] for e in events if e.get("event") == "testbed_download"]
    pip = [d for d in downloads if d.get("verb", "downloading") == "downloading"]
    assert pip and pip[-1]["file"].startswith("tbprobe-1.0"), downloads
    # and its copy to the hosts (the push role's rsync, read live): bytes over every host
    copies = [d for d in downloads if d.get("verb") == "copying" and d["file"].startswith("the wheelhouse to ")]
    assert copies and max(d["done"] for d in copies) > 0, downloads  # (the no-op's copies move nothing: no line)
    # ssh mesh: host to host by name and by bare IP, without a password
    for h in bed.hosts[1:]:
        for target in (h.name, h.address):
            r = bed.ssh(bed.hosts[0].name, f"ssh -o BatchMode=yes {target} hostname")
            assert r.returncode == 0 and r.stdout.strip() == h.name, (target, r.stderr)
    # the dataset fetched once, verified, where the suite's data_path points
    assert set(_on_all(bed, "cat ~/datasets/cifar10/tbdata/train.csv").values()) == {"label,value\ncat,1"}
    # zsh is the login shell in a new session
    assert set(_on_all(bed, 'echo "$SHELL"').values()) == {"/usr/bin/zsh"}
    # mpi: hostfiles and a hello across the 4 hosts
    r = bed.ssh(bed.hosts[0].name, "cat ~/testbed-mpi/hosts.txt ~/testbed-mpi/1_host.txt ~/testbed-mpi/4_hosts.txt")
    assert "node3 slots=1" in r.stdout and "node0 slots=1" in r.stdout
    r = bed.ssh(bed.hosts[0].name, f"mpirun --allow-run-as-root -np 4 --hostfile ~/testbed-mpi/hosts.txt "
                                   f"--mca btl_tcp_if_include {bed.spec.provider.subnet} ~/testbed-mpi/mpi_check",
                timeout=120)
    assert sorted(ln for ln in r.stdout.splitlines() if ln.startswith("hello from rank")) == \
        [f"hello from rank {i} of 4 on node{i}" for i in range(4)], r.stderr
    # venv with the wheel, ~/.deepspeed_env, the artifact's invalid JSON fixed
    assert set(_on_all(bed, "~/vit_env/bin/python -c 'import tbprobe; print(tbprobe.__version__)'").values()) == {"1.0"}
    assert "NCCL_SOCKET_IFNAME=^docker,lo" in bed.ssh("node2", "cat ~/.deepspeed_env").stdout
    assert bed.ssh("node1", "python3 -m json.tool ~/Scalable_ViT_DT/tesla/deepspeed_config.json").returncode == 0


def test_check_mode_changes_nothing(bed: Any) -> None:
    res = setup.apply(bed.name, roles=["shell"], extra_vars={"shell_name": "bash"}, check=True)
    assert res.ok and res.check and res.changed > 0  # it would change the shell back to bash ...
    assert set(_on_all(bed, "getent passwd root | cut -d: -f7").values()) == {"/usr/bin/zsh"}  # ... but did not


def test_limit_reruns_some_hosts(bed: Any) -> None:
    res = setup.apply(bed.name, roles=["packages"], limit=["node1,node2"])
    assert res.ok and set(res.hosts) == {"node1", "node2"} and res.changed == 0


def test_ssh_mesh_check_scales_yet_finds_a_peer_it_does_not_log_in_to(bed: Any) -> None:
    """The check logs in around a ring (node0 to node1 only) and checks every peer by content: a stale /etc/hosts
    line ahead of the role's block on node0 that sends node2's name to node3's address first fails node0, and
    only node0."""
    res = setup.apply(bed.name, roles=["ssh_mesh"])
    assert res.ok, res.to_json()
    for h in bed.hosts:  # what the check stands for: every host to every other, by name and by bare IP
        targets = " ".join(f"{p.name} {p.address}" for p in bed.hosts if p.name != h.name)
        r = bed.ssh(h.name, f"for t in {targets}; do ssh -o BatchMode=yes -o StrictHostKeyChecking=yes $t hostname "
                            "</dev/null || exit 1; done", timeout=120)
        assert r.returncode == 0 and len(r.stdout.split()) == 2 * (len(bed.hosts) - 1), (h.name, r.stderr)
    wrong = {h.name: h.address for h in bed.hosts}["node3"]
    stale = f"printf '{wrong} node2\\n' | cat - /etc/hosts > ~/tb-hosts.saved && cat ~/tb-hosts.saved > /etc/hosts"
    assert bed.ssh("node0", stale).returncode == 0
    try:
        res = setup.apply(bed.name, roles=["ssh_mesh"], verify=True)  # its record matches: only --verify runs it
        assert not res.ok and {n for n, r in res.hosts.items() if r.failed} == {"node0"}, res.to_json()
        assert f"node2 resolves to {wrong}," in (res.hosts["node0"].error or ""), res.hosts["node0"].error
    finally:
        assert bed.ssh("node0", "sed 1d ~/tb-hosts.saved > /etc/hosts && rm ~/tb-hosts.saved").returncode == 0
    res = setup.apply(bed.name, roles=["ssh_mesh"], extra_vars={"ssh_mesh_verify_pairs": "all"}, verify=True)
    assert res.ok and res.changed == 0, res.to_json()


def _blocks(bed: Any, host: str) -> dict[str, str]:
    """The ssh_mesh role's managed blocks on ``host``: file -> the block's lines."""
    out = {}
    for f in ("~/.ssh/authorized_keys", "~/.ssh/known_hosts", "~/.ssh/config", "/etc/hosts"):
        r = bed.ssh(host, f"sed -n '/# BEGIN testbed ssh_mesh/,/# END testbed ssh_mesh/p' {f}")
        assert r.returncode == 0, r.stderr
        out[f] = r.stdout
    return out


def test_ssh_mesh_on_one_host_keeps_every_peer(local_testbed: Any) -> None:
    """A play on node0 alone (--limit node0, Ansible run there) rewrites node0's blocks with every inventory host:
    the keys of node1 and node2 are read from them (read-only), so nothing changes and node0 still logs in. A peer
    that does not answer stops the play before any block is rewritten, naming it."""
    bed = local_testbed(hosts=3)
    res = setup.apply(bed.name, roles=["ssh_mesh"])
    assert res.ok, res.to_json()
    before = _blocks(bed, "node0")
    peers = {h.name: bed.ssh(h.name, "cat ~/.ssh/id_ed25519.pub").stdout.strip() for h in bed.hosts[1:]}
    res = setup.apply(bed.name, roles=["ssh_mesh"], limit=["node0"], verify=True)
    assert res.ok and res.ran and set(res.hosts) == {"node0"}, res.to_json()
    assert res.hosts["node0"].changed == 0, res.hosts["node0"].changed_tasks
    after = _blocks(bed, "node0")
    assert after == before
    for name, key in peers.items():
        addr = next(h.address for h in bed.hosts if h.name == name)
        assert key and key in after["~/.ssh/authorized_keys"]
        assert f"{name},{addr} ssh-ed25519 " in after["~/.ssh/known_hosts"]
        assert f" {name} {addr}" in after["~/.ssh/config"] and f"{addr} {name}" in after["/etc/hosts"]
        r = bed.ssh("node0", f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes {name} true </dev/null")
        assert r.returncode == 0, (name, r.stderr)
    bed.provider.kill_host("node2")  # a peer whose keys cannot be read: the play stops before any block is written
    res = setup.apply(bed.name, roles=["ssh_mesh"], limit=["node0"], verify=True)
    assert not res.ok and res.hosts["node0"].error_task.startswith("Read the keys of the hosts outside this play")
    assert "node2" in (res.hosts["node0"].error or ""), res.hosts["node0"].error
    assert _blocks(bed, "node0") == before


def test_source_build_once_installed_everywhere_and_survives_ssh_drop(bed: Any, served: dict[str, Any]) -> None:
    cp_dir = str(setup.ansible_control_dir(bed.name))
    killed: list[int] = []

    def drop_ssh(ev: dict[str, Any]) -> None:
        """On the first poll of the build, kill Ansible's SSH master connections (ours, by their socket dir)."""
        if ev.get("event") != "runner_on_async_poll" or killed:
            return
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if cmd.startswith("ssh") and cp_dir in cmd:
                try:
                    os.kill(int(p.name), signal.SIGKILL)
                    killed.append(int(p.name))
                except ProcessLookupError:
                    pass

    ev = {"source_build_name": "tbhello", "source_build_repo": f"{served['url']}/tbhello.git",
          "source_build_version": "main",
          "source_build_steps": ["sleep 8", "make", 'make install DESTDIR="$TESTBED_STAGE" PREFIX=/usr/local'],
          "source_build_verify": "/usr/local/bin/tb-hello"}
    t = time.monotonic()
    first = setup.apply(bed.name, roles=["source_build"], extra_vars=ev, on_event=drop_ssh)
    TIMINGS["source_build first"] = time.monotonic() - t
    assert first.ok, first.to_json()
    assert killed, "the SSH connection was never dropped during the build"
    assert set(_on_all(bed, "/usr/local/bin/tb-hello").values()) == {"hello from tb-hello"}
    built = _on_all(bed, "grep -c 'testbed: build of tbhello done' ~/src/tbhello/.testbed-build.log || true")
    assert sorted(built.values()).count("1") == 1, built  # built on one host, exactly once
    t = time.monotonic()
    again = setup.apply(bed.name, roles=["source_build"], extra_vars=ev, verify=True)
    TIMINGS["source_build no-op"] = time.monotonic() - t
    assert again.ok and again.ran and again.changed == 0, again.to_json()


def test_dataset_over_http_and_wrong_checksum(bed: Any, served: dict[str, Any]) -> None:
    url = served["url"]
    items = [{"name": "blob", "url": f"{url}/blob.bin", "dest": "~/data/blob.bin", "sha256": served["blob_sha"]},
             {"name": "tbdata", "url": f"{url}/tbdata.tar.gz", "dest": "~/data/tbdata.tar.gz",
              "sha256": served["tar_sha"], "extract_to": "~/data", "creates": "~/data/tbdata",
              "via_controller": False}]
    _apply_twice(bed, "dataset", roles=["dataset"], extra_vars={"dataset_items": items})
    sums = _on_all(bed, "sha256sum ~/data/blob.bin | cut -d' ' -f1; cat ~/data/tbdata/train.csv | wc -l")
    assert set(sums.values()) == {served["blob_sha"] + "\n2"}
    # fetched once here, into the user's cache that every state home shares (keyed by content), not the state home
    assert (paths.user_cache() / "datasets" / served["blob_sha"] / "blob.bin").exists()
    assert not (bed.home / "cache").exists()
    bad = [{"name": "bad", "url": f"{url}/blob.bin", "dest": "~/data/bad.bin", "sha256": "0" * 64}]
    res = setup.apply(bed.name, roles=["dataset"], extra_vars={"dataset_items": bad})
    assert not res.ok and all(h.failed for h in res.hosts.values())
    err = res.hosts["node0"].error or ""
    assert "sha256 mismatch" in err and "0" * 64 in err and served["blob_sha"] in err and "NOT installed" in err
    assert set(_on_all(bed, "test -e ~/data/bad.bin && echo present || echo absent").values()) == {"absent"}


def test_memlock_reboots_once_and_a_new_session_sees_the_limit(bed: Any) -> None:
    """`unlimited` where this machine may raise RLIMIT_MEMLOCK; else (no CAP_SYS_RESOURCE) a lower value."""
    want = "unlimited" if can_raise_memlock() else "4096"
    boot = _on_all(bed, "cat /proc/sys/kernel/random/boot_id")
    assert set(_on_all(bed, "ulimit -l").values()) != {want}
    _apply_twice(bed, "memlock", roles=["memlock"], extra_vars={"memlock_limit": want})
    after = _on_all(bed, "cat /proc/sys/kernel/random/boot_id")
    assert all(after[h] != boot[h] for h in boot), "memlock did not reboot the hosts"
    assert set(_on_all(bed, "ulimit -l").values()) == {want}
    # the no-op run did not reboot again
    assert _on_all(bed, "cat /proc/sys/kernel/random/boot_id") == after


def test_gpu_and_tpu_checks_say_plainly_there_is_no_hardware(bed: Any) -> None:
    messages: list[str] = []

    def collect(ev: dict[str, Any]) -> None:
        res = (ev.get("event_data") or {}).get("res") or {}
        if isinstance(res.get("msg"), str):
            messages.append(res["msg"])

    ok = setup.apply(bed.name, roles=["gpu_check", "tpu_check"], on_event=collect,
                     extra_vars={"gpu_check_required": False, "tpu_check_required": False})
    assert ok.ok and ok.changed == 0
    assert any("has no usable NVIDIA GPU (nvidia-smi is not installed)" in m and "going on" in m for m in messages)
    assert any("has no TPU" in m for m in messages)
    bad = setup.apply(bed.name, roles=["gpu_check"], extra_vars={"gpu_check_required": True})
    assert not bad.ok
    assert "gpu_check_required: true" in (bad.hosts["node1"].error or "")


def test_report_timings() -> None:
    """Not a check: prints the measured times (pytest -s) for the closing note."""
    print("\nset-up timings on 4 local hosts:", {k: round(v, 1) for k, v in TIMINGS.items()})


def test_an_environment_on_a_shared_home_is_made_by_one_host(local_testbed: Any) -> None:
    """Where every host shares the home (an NFS lab), python_env has the first host make an environment under it
    and the others use it: never three `venv --clear` into one folder at once. Each host can still run it."""
    bed = local_testbed(hosts=3, name="nfs", hardware={"shared_home": True})
    res = setup.apply(bed.name, roles=["python_env"], extra_vars={"python_env_path": "~/tb-shared-venv"})
    assert res.ok, res.to_json()
    made = {n for n, h in res.hosts.items() if any("Create the venv" in t for t in h.changed_tasks)}
    assert made == {"node0"}, {n: h.changed_tasks for n, h in res.hosts.items()}
    assert set(_on_all(bed, "~/tb-shared-venv/bin/python -c 'import sys; print(sys.prefix)'").values()) == \
        {bed.ssh("node0", "echo ~/tb-shared-venv").stdout.strip()}
    # on homes of their own, every host makes its own
    solo = local_testbed(hosts=2, name="own")
    res = setup.apply(solo.name, roles=["python_env"], extra_vars={"python_env_path": "~/tb-own-venv"})
    assert res.ok, res.to_json()
    made = {n for n, h in res.hosts.items() if any("Create the venv" in t for t in h.changed_tasks)}
    assert made == {"node0", "node1"}


def _world_readable(name: str) -> Path:
    """A fresh folder the local hosts can read (they see this machine's /var/tmp, not the test's private tmp)."""
    import shutil

    root = Path(os.environ.get("TESTBED_TEST_CACHE", "/var/tmp/testbed-tests")) / f"{name}-{os.getpid()}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    return root


def test_builds_and_datasets_on_a_shared_home_are_made_by_one_host(local_testbed: Any) -> None:
    """On a home every host shares, source_build checks out and builds under it, and dataset fetches into it, on
    the home's writer alone (testbed_home_writer, as python_env): never three checkouts into one folder at once;
    hosts that build different things there (emu, ori) each build their own. A build installed outside the home
    (/opt) is installed on every host, and again on a host replaced under the same home."""
    import shutil

    src = _world_readable("shared-home")
    try:
        repo = src / "repo"
        repo.mkdir()
        (repo / "README").write_text("x\n")
        for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "x"]):
            subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True)
        with tarfile.open(src / "d.tar.gz", "w:gz") as tf:
            info = tarfile.TarInfo("d/f.txt")
            info.size = 3
            tf.addfile(info, io.BytesIO(b"ok\n"))
        bed = local_testbed(hosts=3, name="nfsb", hardware={"shared_home": True})
        home = {"source_build_name": "tb-home", "source_build_repo": str(repo), "source_build_version": "main",
                "source_build_dest": "{{ ansible_facts.user_dir }}/tb-home-src", "source_build_artifact": "none",
                "source_build_steps": ['hostname >> built-by.txt'],
                "source_build_verify": "test -s ~/tb-home-src/built-by.txt"}
        res = setup.apply(bed.name, roles=["source_build"], extra_vars=home)
        assert res.ok, res.to_json()
        assert set(_on_all(bed, "cat ~/tb-home-src/built-by.txt").values()) == {"node0"}  # one checkout, one build
        # hosts that build different things under the one home (neuronabox's emu and ori): each its own, once
        flavor = {**home, "source_build_name": "tb-flavor", "source_build_dest":
                  "{{ ansible_facts.user_dir }}/tb-{{ 'emu' if inventory_hostname == 'node2' else 'ori' }}-src"}
        res = setup.apply(bed.name, roles=["source_build"], extra_vars=flavor)
        assert res.ok, res.to_json()
        assert bed.ssh("node1", "cat ~/tb-emu-src/built-by.txt; cat ~/tb-ori-src/built-by.txt").stdout.split() == [
            "node2", "node0"]
        items = [{"name": "d", "url": f"file://{src / 'd.tar.gz'}", "dest": "~/tb-data/d.tar.gz",
                  "extract_to": "~/tb-data", "creates": "~/tb-data/d/f.txt"}]
        res = setup.apply(bed.name, roles=["dataset"], extra_vars={"dataset_items": items})
        assert res.ok, res.to_json()
        fetched = {n for n, h in res.hosts.items() if any("Unpack dataset" in t for t in h.changed_tasks)}
        assert fetched == {"node0"}, {n: h.changed_tasks for n, h in res.hosts.items()}
        assert set(_on_all(bed, "cat ~/tb-data/d/f.txt").values()) == {"ok"}

        opt = {**home, "source_build_name": "tb-opt", "source_build_dest": "{{ ansible_facts.user_dir }}/tb-opt-src",
               "source_build_artifact": "stage", "source_build_steps": [
                   'mkdir -p "$TESTBED_STAGE/opt/tb-opt" && echo built > "$TESTBED_STAGE/opt/tb-opt/here"'],
               "source_build_verify": "test -f /opt/tb-opt/here"}
        res = setup.apply(bed.name, roles=["source_build"], extra_vars=opt)
        assert res.ok, res.to_json()
        # node2 replaced under the same home: its own disk is new (what the build installed, its own records)
        assert bed.ssh("node2", "rm -r /opt/tb-opt /var/tmp/testbed-builds-*").returncode == 0
        res = setup.apply(bed.name, roles=["source_build"], extra_vars=opt, verify=["node2"])  # installed again
        assert res.ok, res.to_json()
        assert set(_on_all(bed, "cat /opt/tb-opt/here").values()) == {"built"}
    finally:
        shutil.rmtree(src, ignore_errors=True)
