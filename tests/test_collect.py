"""Collect from real local hosts: layout, checksums, incremental re-collect, refusals, cut links, SFTP, secrets."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from testbed.collect import collect_runs, format_problems, transfer
from testbed.paths import PARTIAL_DIR

LOGS = ("out", "err", "exit", "start", "end")


def put(bed: Any, host: str, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` on ``host`` (parents created)."""
    d = path.rsplit("/", 1)[0]
    r = subprocess.run(["ssh", "-F", str(bed.ssh_config), "-o", "ControlMaster=no", host, "--",
                        f"mkdir -p '{d}' && cat > '{path}'"], input=data, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr


def sh(bed: Any, host: str, cmd: str, timeout: float = 120) -> str:
    r = bed.ssh(host, cmd, timeout=timeout)
    assert r.returncode == 0, (cmd, r.stderr)
    return r.stdout


def make_run(bed: Any, *, suite: str = "demo", hosts: list[str] | None = None,
             outputs: dict[str, list[str]] | None = None, params: dict[str, Any] | None = None,
             files: dict[str, dict[str, bytes]] | None = None, info: dict[str, Any] | None = None,
             events: list[tuple[str, str | None, dict[str, Any]]] | None = None) -> tuple[str, str]:
    """Record a finished run in state and write its logs (+ ``files``) on the hosts; returns (id, run_dir)."""
    hosts = hosts or [h.name for h in bed.hosts]
    run_id = f"{suite}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    run_dir = f"/root/.testbed-runs/{run_id}"
    now = time.time()
    full_info = {"run_dir": run_dir, "outputs": outputs or {}, "hosts": hosts, "sources": {},
                 "python": sys.executable, **(info or {})}
    st = bed.store
    tb = st.testbed(bed.name)
    # a run of this testbed: made after it was provisioned (an older run's hosts are gone: collect knows it)
    created = max(now - 10, float(tb["created"]) + 0.01) if tb else now - 10
    with st.tx() as db:
        db.execute("INSERT INTO runs(id, suite, testbed, params, status, created, started, ended, info) "
                   "VALUES (?,?,?,?,?,?,?,?,?)", (run_id, suite, bed.name, json.dumps(params or {"n": 1}),
                                                  "succeeded", created, created + 0.01, now, json.dumps(full_info)))
        for k, h in enumerate(hosts):
            db.execute("INSERT INTO run_hosts(run_id, host, rank, status, exit_code, started, ended) "
                       "VALUES (?,?,?,?,?,?,?)", (run_id, h, k, "succeeded", 0, created + 0.01, now))
        for kind, host, detail in events or []:
            db.execute("INSERT INTO events(run_id, ts, kind, host, detail) VALUES (?,?,?,?,?)",
                       (run_id, now - 5, kind, host, json.dumps(detail)))
    for k, h in enumerate(hosts):
        script = (f"mkdir -p {run_dir} && cd {run_dir} && echo 'hello from rank {k} on {h}' > rank{k}.out && "
                  f": > rank{k}.err && echo 0 > rank{k}.exit && date +%s > rank{k}.start && date +%s > rank{k}.end "
                  f"&& echo $$ > rank{k}.pid")
        sh(bed, h, script)
        for rel, data in (files or {}).get(h, {}).items():
            put(bed, h, f"{run_dir}/{rel}", data)
    return run_id, run_dir


def hide_rsync(bed: Any, host: str) -> None:
    """Make ``host`` a host without rsync (its root is copy-on-write: the controller and the others keep theirs)."""
    sh(bed, host, "while p=$(command -v rsync); do mv \"$p\" \"$p.hidden\"; hash -r; done")


def collect_rsync_and_sftp(run_id: str) -> Any:
    """Collect ``run_id`` (node1 without rsync): the result, checked ok with node0 on rsync and node1 on sftp."""
    r = collect_runs([run_id], Path("results"))[0]
    assert r.ok, r.problems()
    assert {h.host: h.method for h in r.hosts} == {"node0": "rsync", "node1": "sftp"}
    return r


def host_sha(bed: Any, host: str, path: str) -> str:
    return sh(bed, host, f"sha256sum '{path}'").split()[0]


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -------------------------------------------------------------------------------------------------
def test_collect_layout_manifest_and_incremental(local_testbed, tmp_path):
    bed = local_testbed(hosts=3)
    sh(bed, "node0", "set -e; mkdir -p /root/src/app && cd /root/src/app && git init -q && "
                     "git -c user.email=a@b -c user.name=t commit -q --allow-empty -m init")
    commit = sh(bed, "node0", "git -C /root/src/app rev-parse HEAD").strip()
    files = {h.name: {"out/a.csv": f"x,y\n1,{i}\n".encode(), "metrics/deep/m.json": b'{"loss": 1}',
                      "metrics/top.txt": b"top", "out/ignored.bin": b"nope"} for i, h in enumerate(bed.hosts)}
    files["node1"]["extra.txt"] = b"only node1"
    run_id, run_dir = make_run(
        bed, outputs={"*": ["out/*.csv", "metrics"], "node1": ["extra.txt"], "node2": ["never-written.dat"]},
        files=files, events=[("fault", "node1", {"action": "kill", "at_s": 3})],
        info={"sources": {"app": {"repo": "https://github.com/example/app", "ref": "main", "path": "/root/src/app"}}})
    seen: dict[str, int] = {}

    def progress(host: str, advance: int, total: int) -> None:
        seen[host] = seen.get(host, 0) + advance

    res = collect_runs([run_id], Path("results"), progress=progress)
    assert len(res) == 1 and res[0].ok, res[0].problems()
    r = res[0]
    folder = Path("results/demo") / run_id
    assert r.path == folder and r.manifest == folder / "manifest.json"
    for k, h in enumerate(bed.hosts):
        got = tree(folder / h.name)
        want = {f"rank{k}.{x}" for x in LOGS} | {"out/a.csv", "metrics/deep/m.json", "metrics/top.txt"}
        if h.name == "node1":
            want.add("extra.txt")
        assert set(got) == want, (h.name, set(got) ^ want)
        for rel, sha in got.items():
            assert sha == host_sha(bed, h.name, f"{run_dir}/{rel}")
    assert sum(seen.values()) == r.bytes_sent > 0
    node2 = next(h for h in r.hosts if h.host == "node2")
    assert any("never-written.dat" in n for n in node2.notes)
    # collected table
    rows = bed.store.query("SELECT host, path, sha256, size FROM collected WHERE run_id=?", (run_id,))
    assert len(rows) == sum(len(tree(folder / h.name)) for h in bed.hosts)
    assert all(row["size"] >= 0 for row in rows)
    # manifest
    m = json.loads((folder / "manifest.json").read_text())
    for key in ("schema", "run_id", "suite", "params", "testbed", "hosts", "software", "testbed_version",
                "started", "ended", "events", "files"):
        assert key in m, key
    assert m["run_id"] == run_id and m["suite"] == "demo" and m["params"] == {"n": 1}
    assert m["testbed"] == {"name": bed.name, "provider": "local"}
    assert [h["name"] for h in m["hosts"]] == ["node0", "node1", "node2"]
    for h in m["hosts"]:
        assert h["status"] == "succeeded" and h["exit_code"] == 0 and h["address"]
        f = h["facts"]
        assert f["kernel"] and f["os"] and f["cpus"] >= 1 and f["memory_mb"] > 0 and f["arch"]
        assert f["hostname"] == h["name"] and "gpus" in f and "tpu" in f
    assert m["software"]["python"]["version"].startswith("3.")
    assert any(ln.lower().startswith("typer==") for ln in m["software"]["pip_freeze"])
    assert m["software"]["sources"] == {"app": {"repo": "https://github.com/example/app", "ref": "main",
                                                "commit": commit}}
    assert m["started"].endswith("Z") and m["ended"] > m["started"]
    assert m["events"][0]["kind"] == "fault" and m["events"][0]["detail"] == {"action": "kill", "at_s": 3}
    for f in m["files"]:
        assert hashlib.sha256((folder / f["host"] / f["path"]).read_bytes()).hexdigest() == f["sha256"]
        assert (folder / f["host"] / f["path"]).stat().st_size == f["size"]
    assert len(m["files"]) == len(rows)
    # incremental: nothing sent again, rsync not even started, well under a second per host
    before = tree(folder)
    t0 = time.monotonic()
    again = collect_runs([run_id], Path("results"))[0]
    dt = time.monotonic() - t0
    assert again.ok and again.files_sent == 0 and again.bytes_sent == 0
    assert all(h.method is None and h.unchanged == h.files for h in again.hosts)
    assert dt < 1.0 * len(bed.hosts), dt
    assert all(h.seconds < 1.0 for h in again.hosts), [h.seconds for h in again.hosts]
    after = tree(folder)
    assert {k: v for k, v in after.items() if k != "manifest.json"} == \
        {k: v for k, v in before.items() if k != "manifest.json"}
    # a new file on one host: only it is sent
    put(bed, "node1", f"{run_dir}/out/b.csv", b"x,y\n2,2\n")
    third = collect_runs([run_id], Path("results"))[0]
    assert third.ok and third.files_sent == 1
    assert [h.sent for h in third.hosts] == [0, 1, 0]
    assert json.loads((folder / "manifest.json").read_text())["files"].__len__() == len(rows) + 1
    # the folder's manifest edited (wrong types where objects and lists stood): read as if they were absent, never
    # a traceback; the hosts' facts are read again
    m = json.loads((folder / "manifest.json").read_text())
    m.update(hosts=[{"name": "node0", "facts": "edited"}, 7], files={"a": 1},
             software={"pip_freeze": ["x==1"], "sources": ["edited"]})
    (folder / "manifest.json").write_text(json.dumps(m))
    fourth = collect_runs([run_id], Path("results"))[0]
    assert fourth.ok, fourth
    m = json.loads((folder / "manifest.json").read_text())
    assert [h["name"] for h in m["hosts"]] == [h.name for h in bed.hosts]
    assert all(isinstance(h["facts"], dict) and h["facts"]["kernel"] for h in m["hosts"])


def test_refuses_to_overwrite_different_content(local_testbed):
    bed = local_testbed(hosts=2)
    run_id, run_dir = make_run(bed, outputs={"*": ["data/*"]},
                               files={"node0": {"data/a.txt": b"v1"}, "node1": {"data/a.txt": b"w1"}})
    assert collect_runs([run_id], Path("results"))[0].ok
    local = Path("results/demo") / run_id / "node0/data/a.txt"
    assert local.read_bytes() == b"v1"
    # the host's file changes after it was collected: refused, the collected copy stays as it was
    put(bed, "node0", f"{run_dir}/data/a.txt", b"v2-changed")
    put(bed, "node0", f"{run_dir}/data/new.txt", b"new")
    r = collect_runs([run_id], Path("results"))[0]
    assert not r.ok
    h0 = next(h for h in r.hosts if h.host == "node0")
    assert "refusing to overwrite" in h0.error and "data/a.txt" in h0.error and "node0" in h0.error
    assert local.read_bytes() == b"v1"
    assert (local.parent / "new.txt").read_bytes() == b"new"  # other files are still collected
    assert next(h for h in r.hosts if h.host == "node1").error is None
    err = format_problems([r])
    assert err is not None and "node0" in err.where and "refusing to overwrite" in err.what
    # a local file that was never collected by testbed and differs: refused too
    other = Path("results/demo") / run_id / "node1/data/a.txt"
    other.chmod(0o644)
    other.write_bytes(b"hand-edited")
    with bed.store.tx() as db:
        db.execute("DELETE FROM collected WHERE host='node1'")
    r2 = collect_runs([run_id], Path("results"))[0]
    h1 = next(h for h in r2.hosts if h.host == "node1")
    assert h1.error and "refusing to overwrite" in h1.error
    assert other.read_bytes() == b"hand-edited"


def test_unreachable_host_reported_others_collected(local_testbed):
    bed = local_testbed(hosts=3)
    run_id, _ = make_run(bed, outputs={"*": ["r.txt"]}, files={h.name: {"r.txt": h.name.encode()} for h in bed.hosts})
    bed.provider.cut_network("node1")
    try:
        t0 = time.monotonic()
        r = collect_runs([run_id], Path("results"), timeout=4)[0]
        assert time.monotonic() - t0 < 20
    finally:
        bed.provider.restore_network("node1")
    assert not r.ok
    bad = [h for h in r.hosts if h.error]
    assert [h.host for h in bad] == ["node1"] and "node1" in bad[0].error
    assert "r.txt" in bad[0].missing and "rank*.out" in bad[0].missing
    folder = Path("results/demo") / run_id
    assert (folder / "node0/r.txt").read_bytes() == b"node0" and (folder / "node2/r.txt").read_bytes() == b"node2"
    assert not (folder / "node1").exists()
    err = format_problems([r])
    assert err is not None and err.where == "node1" and err.what.count("\n") == 0 and "node1" in err.what
    m = json.loads((folder / "manifest.json").read_text())
    assert {f["host"] for f in m["files"]} == {"node0", "node2"}
    # the host is back: the same command completes the results
    r2 = collect_runs([run_id], Path("results"), timeout=20)[0]
    assert r2.ok, r2.problems()
    assert (folder / "node1/r.txt").read_bytes() == b"node1"
    assert [h.sent for h in r2.hosts] == [0, 6, 0]


def test_network_cut_mid_transfer_then_resume(local_testbed):
    bed = local_testbed(hosts=2)
    run_id, run_dir = make_run(bed, outputs={"*": ["big.bin", "small/*"]},
                               files={"node1": {f"small/{i}.txt": f"{i}\n".encode() for i in range(20)}})
    sh(bed, "node0", f"head -c 80M /dev/urandom > {run_dir}/big.bin")
    want = host_sha(bed, "node0", f"{run_dir}/big.bin")
    done = {"node0": 0}
    cut = threading.Event()

    def progress(host: str, advance: int, total: int) -> None:
        done[host] = done.get(host, 0) + advance
        if host == "node0" and done[host] > 15 * 2**20 and not cut.is_set():
            cut.set()
            threading.Thread(target=bed.provider.cut_network, args=("node0",), daemon=True).start()

    folder = Path("results/demo") / run_id
    t0 = time.monotonic()
    try:
        r = collect_runs([run_id], Path("results"), progress=progress, io_timeout=3, timeout=60,
                         bwlimit_kbps=20_000)[0]
    finally:
        time.sleep(0.5)
        bed.provider.restore_network("node0")
    assert cut.is_set() and time.monotonic() - t0 < 60
    assert not r.ok
    h0 = next(h for h in r.hosts if h.host == "node0")
    assert "node0" in h0.error and "lost" in h0.error and "big.bin" in h0.missing
    assert next(h for h in r.hosts if h.host == "node1").error is None  # the other host is complete
    partial = folder / "node0" / PARTIAL_DIR / "big.bin"  # kept for the resume, not under its own name
    assert partial.is_file() and 15 * 2**20 <= partial.stat().st_size < 80 * 2**20
    assert not (folder / "node0/big.bin").exists()
    row = bed.store.query("SELECT size FROM collected WHERE run_id=? AND path='big.bin'", (run_id,))
    assert row[0]["size"] == transfer.PENDING
    m = json.loads((folder / "manifest.json").read_text())
    assert "big.bin" not in {f["path"] for f in m["files"]}
    # resume: only node0's file is fetched, identical to the host's copy
    deadline = time.monotonic() + 30
    while bed.ssh("node0", "true", timeout=10).returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    size_before = partial.stat().st_size
    r2 = collect_runs([run_id], Path("results"), io_timeout=30)[0]
    assert r2.ok, r2.problems()
    assert hashlib.sha256((folder / "node0/big.bin").read_bytes()).hexdigest() == want
    assert not partial.parent.exists()  # the partial copy and its folder are gone
    h0 = next(h for h in r2.hosts if h.host == "node0")
    assert h0.sent == h0.rsync_transferred == h0.files == 6
    assert h0.reused_bytes >= size_before // 2  # resumed from the partial file, not sent again from zero
    assert next(h for h in r2.hosts if h.host == "node1").sent == 0
    assert not [p for p in (folder / "node0").iterdir() if p.name.startswith(".big.bin.")]
    m = json.loads((folder / "manifest.json").read_text())
    assert {f["path"]: f["sha256"] for f in m["files"] if f["host"] == "node0"}["big.bin"] == want


def test_sftp_fallback_when_host_has_no_rsync(local_testbed):
    bed = local_testbed(hosts=2)
    odd = "odd name [1]*.txt"
    files = {h.name: {"data/a.bin": secrets.token_bytes(300_000), f"data/{odd}": b"odd", "data/sub/x.txt": b"x"}
             for h in bed.hosts}
    run_id, _ = make_run(bed, outputs={"*": ["data"]}, files=files)
    hide_rsync(bed, "node1")
    assert bed.ssh("node1", "command -v rsync").returncode != 0
    assert bed.ssh("node0", "command -v rsync").returncode == 0 and Path("/usr/bin/rsync").exists()
    r = collect_rsync_and_sftp(run_id)
    folder = Path("results/demo") / run_id
    for h in bed.hosts:
        got = tree(folder / h.name)
        for rel, data in files[h.name].items():
            assert got[rel] == hashlib.sha256(data).hexdigest(), (h.name, rel)
    h1 = next(h for h in r.hosts if h.host == "node1")
    assert h1.sent == h1.files == 8 and h1.bytes_sent > 300_000
    assert not (folder / ".partial").exists()
    # an interrupted sftp download resumes: its partial file waits in the staging folder
    local = folder / "node1/data/a.bin"
    local.unlink()
    stage = transfer._stage(transfer.Ctx(bed.store, threading.Lock(), bed.name, run_id, folder, {}, None, 1, 1,
                                        None, False), "node1", "data/a.bin")
    stage.parent.mkdir(parents=True)
    stage.write_bytes(files["node1"]["data/a.bin"][:100_000])
    again = collect_runs([run_id], Path("results"))[0]
    assert again.ok, again.problems()
    assert [h.sent for h in again.hosts] == [0, 1] and again.hosts[1].resumed == 1
    assert local.read_bytes() == files["node1"]["data/a.bin"]
    assert not (folder / ".partial").exists()


def test_credentials_in_controller_env_never_reach_results(local_testbed, monkeypatch, tmp_path):
    bed = local_testbed(hosts=2)
    pw = "os-pw-" + secrets.token_hex(12)
    aws = "aws-" + secrets.token_hex(16)
    body = "MIIEv" + secrets.token_hex(24)
    key = tmp_path / "gcp-key.json"
    key.write_text(json.dumps({"type": "service_account", "private_key_id": secrets.token_hex(20),
                               "private_key": f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n",
                               "client_email": "x@y.iam.gserviceaccount.com"}))
    monkeypatch.setenv("OS_PASSWORD", pw)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", aws)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    token = "ghp_" + secrets.token_hex(10)
    run_id, run_dir = make_run(
        bed, outputs={"*": ["env.txt"]},
        # a careless fault hook logged a secret into an event; a source URL embeds a token
        events=[("fault", "node0", {"action": "cut", "note": f"OS_PASSWORD={pw}"})],
        info={"sources": {"app": {"repo": f"https://user:{token}@github.com/x/app", "ref": "main",
                                  "path": "/nonexistent"}}})
    for h in bed.hosts:  # what a workload started over SSH from this controller sees of its environment
        sh(bed, h.name, f"env > {run_dir}/env.txt; env >> {run_dir}/rank0.out")
    r = collect_runs([run_id], Path("results"))[0]
    assert r.ok, r.problems()
    values = [pw, aws, body, str(key), token, json.loads(key.read_text())["private_key_id"]]
    scanned = 0
    for p in Path("results").rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            scanned += 1
            for v in values:
                assert v.encode() not in data, (p, v[:8])
    assert scanned >= 2 * 6 + 1  # logs and env.txt of both hosts, and the manifest
    m = json.loads((Path("results/demo") / run_id / "manifest.json").read_text())
    assert m["events"][0]["detail"]["note"] == "OS_PASSWORD=***"
    assert m["software"]["sources"]["app"]["repo"] == "https://***@github.com/x/app"
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(m)  # no environment in the manifest


def test_running_run_collected_then_replaced_by_final_version(local_testbed):
    bed = local_testbed(hosts=1)
    run_id, run_dir = make_run(bed, outputs={"*": ["log.txt"]}, files={"node0": {"log.txt": b"epoch 1\n"}})
    with bed.store.tx() as db:
        db.execute("UPDATE runs SET status='running', ended=NULL WHERE id=?", (run_id,))
    # --all leaves a running run alone; naming it collects what it has so far
    skipped = collect_runs(None, Path("results"), all_runs=True)[0]
    assert skipped.ok and not skipped.hosts and "skipped" in skipped.notes[0]
    r = collect_runs([run_id], Path("results"))[0]
    assert r.ok and r.hosts[0].sent == 6 and "still running" in r.notes[0]
    local = Path("results/demo") / run_id / "node0/log.txt"
    assert local.read_bytes() == b"epoch 1\n"
    m = json.loads((Path("results/demo") / run_id / "manifest.json").read_text())
    assert {f["path"] for f in m["files"]} >= {"log.txt", "rank0.out"}
    # the run goes on and ends: the early copy is replaced by the final one, not refused
    put(bed, "node0", f"{run_dir}/log.txt", b"epoch 1\nepoch 2\n")
    with bed.store.tx() as db:
        db.execute("UPDATE runs SET status='succeeded', ended=? WHERE id=?", (time.time(), run_id))
    r2 = collect_runs([run_id], Path("results"))[0]
    assert r2.ok, r2.problems()
    assert local.read_bytes() == b"epoch 1\nepoch 2\n" and r2.hosts[0].sent == 1
    rows = bed.store.query("SELECT path, size FROM collected WHERE run_id=?", (run_id,))
    assert all(row["size"] >= 0 for row in rows)
    m = json.loads((Path("results/demo") / run_id / "manifest.json").read_text())
    assert {f["path"]: f["sha256"] for f in m["files"]}["log.txt"] == hashlib.sha256(local.read_bytes()).hexdigest()


def test_outputs_under_home_and_absolute_paths(local_testbed):
    """``~/`` and absolute output globs are collected (rsync and sftp) under @home/ and @root/, with their origin
    in the manifest; a matching file older than the run folder belongs to an earlier run and is left alone."""
    bed = local_testbed(hosts=2)
    tag = secrets.token_hex(3)
    for h in bed.hosts:
        sh(bed, h.name, f"mkdir -p /tmp/tb-{tag} ~/proj-{tag}/log/old && echo stale > /tmp/tb-{tag}/app_9.log "
                        f"&& echo stale > ~/proj-{tag}/log/old/x.csv")
    time.sleep(3)  # the stale files are older than the run folder made next
    run_id, run_dir = make_run(bed, outputs={"*": [f"~/proj-{tag}/log/**", f"/tmp/tb-{tag}/app_*.log", "own.txt"]},
                               files={h.name: {"own.txt": h.name.encode(), "tb-rank.sh": b"#!/bin/sh\n"}
                                      for h in bed.hosts})
    for h in bed.hosts:
        sh(bed, h.name, f"mkdir -p ~/proj-{tag}/log/run1 && echo 'epoch,loss' > ~/proj-{tag}/log/run1/metrics.csv "
                        f"&& echo {h.name} > /tmp/tb-{tag}/app_0.log")
    hide_rsync(bed, "node1")
    r = collect_rsync_and_sftp(run_id)
    folder = Path("results/demo") / run_id
    for h in bed.hosts:
        got = tree(folder / h.name)
        assert f"@home/proj-{tag}/log/run1/metrics.csv" in got and f"@root/tmp/tb-{tag}/app_0.log" in got, got
        assert not any("old/x.csv" in k or "app_9" in k for k in got), got  # written before the run
        assert (folder / h.name / f"@root/tmp/tb-{tag}/app_0.log").read_text() == f"{h.name}\n"
        assert got["own.txt"] == hashlib.sha256(h.name.encode()).hexdigest()
        hc = next(x for x in r.hosts if x.host == h.name)
        assert any("not written during this run" in n for n in hc.notes), hc.notes
    m = json.loads((folder / "manifest.json").read_text())
    origins = {(f["host"], f["path"]): f["from"] for f in m["files"]}
    assert origins[("node0", f"@root/tmp/tb-{tag}/app_0.log")] == f"/tmp/tb-{tag}/app_0.log"
    assert origins[("node1", f"@home/proj-{tag}/log/run1/metrics.csv")] == f"~/proj-{tag}/log/run1/metrics.csv"
    assert origins[("node0", "own.txt")] == f"{run_dir}/own.txt"
    again = collect_runs([run_id], Path("results"))[0]  # unchanged: nothing sent
    assert again.ok and again.files_sent == 0, again.problems()


def test_full_disk_is_one_message_and_no_partial_file_under_its_name(local_testbed, tmp_path):
    """The results folder fills up mid-transfer: one clear problem, nothing unverified under a final name, and the
    manifest lists only verified bytes; with room again, collect resumes and completes."""
    import os
    import random

    bed = local_testbed(hosts=1)
    big = random.randbytes(3 << 20)
    run_id, _ = make_run(bed, outputs={"*": ["big.bin"]}, files={"node0": {"big.bin": big}})
    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        r = collect_runs([run_id], disk / "results")[0]
        assert not r.ok
        problem = " ".join(r.problems())
        assert "space" in problem.lower(), problem
        folder = r.path
        assert not (folder / "node0" / "big.bin").exists()
        man = folder / "manifest.json"
        if man.exists():
            assert all(f["path"] != "big.bin" for f in json.loads(man.read_text())["files"])
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    r = collect_runs([run_id], tmp_path / "results")[0]  # room again (another disk): complete and verified
    assert r.ok, r.problems()
    assert (r.path / "node0" / "big.bin").read_bytes() == big
    assert not any(".testbed-partial" in p for p in tree(r.path))
    assert os.path.getsize(r.path / "node0" / "big.bin") == len(big)


def _manifest_matches_disk(folder: Path) -> None:
    for f in json.loads((folder / "manifest.json").read_text())["files"]:
        p = folder / f["host"] / f["path"]
        assert p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() == f["sha256"], f


def test_results_folder_contents_are_verified_never_trusted(local_testbed):
    """A collected file replaced by other bytes of the same size with its old mtime (cp -p from another run) is
    found (its ctime moved), refused and kept out of the manifest; a file put there by hand is named and left out;
    a folder holding another run's manifest is refused before any host is touched."""
    bed = local_testbed(hosts=2)
    run_id, _ = make_run(bed, outputs={"*": ["data/*"]},
                         files={"node0": {"data/a.txt": b"run-a-bytes"}, "node1": {"data/a.txt": b"w1"}})
    assert collect_runs([run_id], Path("results"))[0].ok
    folder = Path("results/demo") / run_id
    local = folder / "node0/data/a.txt"
    before = local.stat()
    time.sleep(0.05)
    local.write_bytes(b"other-bytes")  # same size, other run's content
    os.utime(local, ns=(before.st_atime_ns, before.st_mtime_ns))
    (folder / "node1/by-hand.csv").write_text("x\n")
    r = collect_runs([run_id], Path("results"))[0]
    h0 = next(h for h in r.hosts if h.host == "node0")
    assert not r.ok and h0.error and "refusing to overwrite" in h0.error and "data/a.txt" in h0.error
    assert local.read_bytes() == b"other-bytes"
    listed = {(f["host"], f["path"]) for f in json.loads((folder / "manifest.json").read_text())["files"]}
    assert ("node0", "data/a.txt") not in listed and ("node1", "data/a.txt") in listed
    assert ("node1", "by-hand.csv") not in listed and any("node1/by-hand.csv" in n for n in r.notes), r.notes
    _manifest_matches_disk(folder)
    # another run's results folder renamed to this run's name: refused, left as it was
    other, _ = make_run(bed, outputs={"*": ["data/*"]}, files={"node0": {"data/a.txt": b"B"}})
    moved = folder.rename(folder.parent / other)
    snapshot = tree(moved)
    r2 = collect_runs([other], Path("results"))[0]
    assert not r2.ok and r2.error and run_id in r2.error and "another --to" in r2.error and not r2.hosts
    assert tree(moved) == snapshot


def test_a_host_file_rewritten_with_its_old_size_and_mtime_is_never_called_unchanged(local_testbed, tmp_path):
    """A collected file rewritten on its host in place with its old size and mtime (cp -p, touch -r, two writes
    within a second) is hashed again there (its ctime moved): the re-collect says the host's file differs (the
    collected copy is never overwritten), never "unchanged" with the old sha256; once the old copy is moved away,
    the new bytes are collected and the manifest gives their sha256. Alike for files first sent by rsync and by
    the stream, whose rows keep the host's stat of each file (mtime, ctime in ns, inode) for the quick check."""
    bed = local_testbed(hosts=1)
    n = transfer.STREAM_MIN[0]
    few = make_run(bed, outputs={"*": ["data"]}, files={"node0": {"data/a.txt": b"v1-bytes"}})
    many = make_run(bed, outputs={"*": ["data"]},
                    files={"node0": {"data/a.txt": b"v1-bytes", **{f"data/{i:03d}.txt": b"x" for i in range(n)}}})
    time.sleep(1.2)  # older than the listing's racy window (RACY_NS): the host's stat of each file is kept
    for (run_id, run_dir), method in ((few, "rsync"), (many, "stream")):
        r = collect_runs([run_id], Path("results"))[0]
        assert r.ok and r.hosts[0].method == method, (r.problems(), r.hosts[0].method)
        folder = Path("results/demo") / run_id
        local = folder / "node0/data/a.txt"
        stat = f"stat -c '%s %.9Y %i' {run_dir}/data/a.txt"
        before = sh(bed, "node0", stat)
        sh(bed, "node0", f"cd {run_dir}/data && touch -r a.txt ../ref && printf v2-bytes > a.txt && "
                         "touch -r ../ref a.txt")
        assert sh(bed, "node0", stat) == before  # same size, mtime (to the ns) and inode
        new_sha = host_sha(bed, "node0", f"{run_dir}/data/a.txt")
        again = collect_runs([run_id], Path("results"))[0]
        h = again.hosts[0]
        assert not again.ok and h.error and "refusing to overwrite" in h.error and "data/a.txt" in h.error, h
        assert f"host {new_sha[:12]}" in h.error and h.missing == ["data/a.txt"] and h.unchanged == h.files - 1
        assert local.read_bytes() == b"v1-bytes"
        # moved away, as the refusal says: the host's new bytes come, and the manifest lists their sha256
        local.rename(tmp_path / f"{method}-a.txt")
        third = collect_runs([run_id], Path("results"))[0]
        assert third.ok and third.hosts[0].sent == 1, third.problems()
        assert local.read_bytes() == b"v2-bytes"
        files = {f["path"]: f["sha256"] for f in json.loads((folder / "manifest.json").read_text())["files"]}
        assert files["data/a.txt"] == new_sha == hashlib.sha256(b"v2-bytes").hexdigest()
        # the rows of the files left alone keep the host's stat of them, as it was when they were hashed
        mtime, ctime, ino = sh(bed, "node0", f"stat -c '%Y %.9Z %i' {run_dir}/rank0.out").split()
        stamps = {f.path: f.stamp for f in bed.store.collected(run_id)}
        assert stamps["rank0.out"] == (int(mtime), int(ctime.replace(".", "")), int(ino))


def test_first_collect_of_many_files_streams_them_hashed_on_both_sides(local_testbed):
    """Many new files: one stream per host, each file hashed on the host as it is read and here as it is written
    (the listing hashes nothing); the files, the collected rows and the manifest are as with rsync, and an
    unchanged re-collect sends nothing. A stream cut off mid-file leaves that file in its partial folder, where
    the next collect's rsync resumes it."""
    bed = local_testbed(hosts=2)
    n = transfer.STREAM_MIN[0]
    files = {h.name: {f"many/{i:03d}.txt": f"{h.name} {i}\n".encode() for i in range(n)} for h in bed.hosts}
    run_id, run_dir = make_run(bed, outputs={"*": ["many", "big.bin"]}, files=files)
    sh(bed, "node0", f"head -c 24M /dev/urandom > {run_dir}/big.bin")
    want_big = host_sha(bed, "node0", f"{run_dir}/big.bin")
    done: dict[str, int] = {}
    cut = threading.Event()

    def progress(host: str, advance: int, total: int) -> None:
        done[host] = done.get(host, 0) + advance
        if host == "node0" and done[host] > 4 * 2**20 and not cut.is_set():
            cut.set()
            threading.Thread(target=bed.provider.cut_network, args=("node0",), daemon=True).start()

    folder = Path("results/demo") / run_id
    try:
        r = collect_runs([run_id], Path("results"), progress=progress, io_timeout=3, timeout=60,
                         bwlimit_kbps=4_000)[0]
    finally:
        time.sleep(0.5)
        bed.provider.restore_network("node0")
    h0, h1 = r.hosts
    assert h0.method == h1.method == "stream"
    assert h1.error is None and h1.sent == h1.files == n + 5 and not (folder / "node1" / PARTIAL_DIR).exists()
    assert "lost" in (h0.error or "") and "big.bin" in h0.missing and not (folder / "node0/big.bin").exists()
    partial = folder / "node0" / PARTIAL_DIR / "big.bin"
    assert partial.is_file() and 4 * 2**20 <= partial.stat().st_size < 24 * 2**20
    for k, h in enumerate(bed.hosts):  # what arrived is the host's bytes
        for rel, data in files[h.name].items():
            p = folder / h.name / rel
            assert not p.exists() or p.read_bytes() == data
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if bed.ssh("node0", "true", timeout=10).returncode == 0:
                break
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.5)
    r2 = collect_runs([run_id], Path("results"), io_timeout=30)[0]
    assert r2.ok, r2.problems()
    h0 = r2.hosts[0]
    assert h0.method == "rsync" and h0.reused_bytes >= 2**20  # resumed from the streamed part
    assert hashlib.sha256((folder / "node0/big.bin").read_bytes()).hexdigest() == want_big
    assert not (folder / "node0" / PARTIAL_DIR).exists()
    m = json.loads((folder / "manifest.json").read_text())
    assert len(m["files"]) == 2 * (n + 5) + 1
    for f in m["files"]:
        assert hashlib.sha256((folder / f["host"] / f["path"]).read_bytes()).hexdigest() == f["sha256"]
        assert f["sha256"] == host_sha(bed, f["host"], f"{run_dir}/{f['path']}")
    again = collect_runs([run_id], Path("results"))[0]
    assert again.ok and again.files_sent == 0 and all(h.method is None for h in again.hosts)


def test_software_freeze_reused_until_the_host_changes(local_testbed, monkeypatch):
    """The run's pip freeze is taken once and reused by later first collects while the host's software fingerprint
    holds (no second session); a pip install on the host changes the fingerprint, and the next manifest shows
    the new package. The kept freeze is in the state home, never under results/."""
    from test_manifest import wheel

    import testbed.collect as collect_mod

    bed = local_testbed(hosts=2)
    venv = "/root/tb-venv"
    sh(bed, "node0", f"python3 -m venv --without-pip {venv}")
    run_id, _ = make_run(bed, info={"python": f"{venv}/bin/python"})
    gathers: list[str] = []
    real = collect_mod.gather_software
    monkeypatch.setattr(collect_mod, "gather_software", lambda ctx, host: gathers.append(host) or real(ctx, host))

    def software(folder: str) -> dict[str, Any]:
        r = collect_runs([run_id], Path(folder))[0]
        assert r.ok, r.problems()
        return json.loads((Path(folder) / "demo" / run_id / "manifest.json").read_text())["software"]

    a = software("a")
    assert gathers == ["node0"] and a["python"]["executable"] == f"{venv}/bin/python"
    assert a["python"]["version"] and not any(ln.startswith("tbfake") for ln in a["pip_freeze"])
    assert software("b") == a and gathers == ["node0"]  # the same host: the kept freeze, no second session
    assert (bed.home / "testbeds" / bed.name / "collect-software.json").is_file()
    assert not [p for d in ("a", "b") for p in Path(d).rglob("collect-software*")]  # nothing under results/
    whl = wheel(Path("."), "tbfake", "1.0")
    put(bed, "node0", f"/root/{whl.name}", whl.read_bytes())
    sh(bed, "node0", f"{sys.executable} -m pip --python {venv}/bin/python install -q --no-index --no-deps "
                     f"/root/{whl.name}", timeout=300)
    c = software("c")
    assert gathers == ["node0", "node0"] and "tbfake==1.0" in c["pip_freeze"]
    assert software("d") == c and len(gathers) == 2


def test_a_file_that_keeps_growing_during_collect_is_not_left_in_the_folder(local_testbed):
    """A running run's log grows while it is collected again (rsync, then verified against the host's checksum):
    it never verifies, and what lies under its name is removed, so the folder holds what its manifest lists."""
    bed = local_testbed(hosts=1)
    run_id, run_dir = make_run(bed, outputs={"*": ["log.txt"]}, files={"node0": {"log.txt": b"epoch 1\n"}})
    with bed.store.tx() as db:
        db.execute("UPDATE runs SET status='running', ended=NULL WHERE id=?", (run_id,))
    first = collect_runs([run_id], Path("results"))[0]
    assert first.ok, first.problems()
    writer = subprocess.Popen(["ssh", "-F", str(bed.ssh_config), "-o", "ControlMaster=no", "node0", "--",
                               f"for i in $(seq 1 20000); do head -c 65536 /dev/urandom >> {run_dir}/log.txt; "
                               "sleep 0.01; done"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1)
        r = collect_runs([run_id], Path("results"))[0]
    finally:
        writer.kill()
        writer.wait(10)
    folder = Path("results/demo") / run_id
    listed = {f["path"] for f in json.loads((folder / "manifest.json").read_text())["files"]}
    assert "log.txt" not in listed and not (folder / "node0" / "log.txt").exists(), (listed, r.problems())
    assert "checksum mismatch" in " ".join(r.problems())
    _manifest_matches_disk(folder)
