"""Provenance pieces without hosts: the listing and facts scripts run by bash here, redaction, manifest build."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.collect import manifest as mf
from testbed.collect.listing import LOG_PATTERNS, RACY_NS, Listing, listing_script, parse_listing
from testbed.state import FileStamp, Store

REPO = Path(__file__).resolve().parents[1]


def _bash(script: str) -> str:
    return subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, check=True,
                          timeout=60).stdout


def test_listing_script_globs_dirs_checksums_and_odd_names(tmp_path):
    run = tmp_path / "run dir"
    (run / "out/deep").mkdir(parents=True)
    files = {"rank0.out": b"hi", "rank0.exit": b"0", "rank0.pid": b"1", "out/a.csv": b"a", "out/deep/b.csv": b"b",
             "out/deep/c.txt": b"c", "tab\tname.log": b"t", "sp ace [x].log": b"s", ".hidden/x.csv": b"h"}
    for rel, data in files.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(data)
    (run / "link.csv").symlink_to(run / "out/a.csv")
    (run / "weird\nname.csv").write_bytes(b"n")
    pats = [*LOG_PATTERNS, "**/*.csv", "out", "*.log", "missing/*.dat", "$(touch pwned)"]
    script = listing_script(str(run), pats) + "echo @END\n"
    lst, problem = parse_listing(_bash(script))
    assert problem is None and lst.run_dir == str(run) and lst.rsync in (True, False)
    want = {"rank0.out", "rank0.exit", "out/a.csv", "out/deep/b.csv", "out/deep/c.txt", "tab\tname.log",
            "sp ace [x].log", ".hidden/x.csv", "link.csv"}
    assert set(lst.files) == want
    for rel, (size, sha) in lst.files.items():
        data = (run / rel).read_bytes()
        assert size == len(data) and sha == hashlib.sha256(data).hexdigest()
    assert [p for p in lst.nomatch if p not in LOG_PATTERNS] == ["missing/*.dat", "$(touch pwned)"]  # data, not code
    assert not (run / "pwned").exists() and not Path("pwned").exists()
    assert any("newline" in n for n in lst.notes)
    assert parse_listing(_bash(listing_script(f"{tmp_path}/nope", pats)))[1] == "@NODIR"
    assert lst.mtimes["out/a.csv"] == int((run / "out/a.csv").stat().st_mtime)
    # known files with unchanged size, mtime, ctime and inode are not hashed again (their recorded checksum is echoed)
    st = (run / "out/a.csv").stat()
    tab = (run / "tab\tname.log").stat()
    known = [(st.st_size, int(st.st_mtime), st.st_ctime_ns, st.st_ino, "f" * 64, "out/a.csv"),
             (2, 1, 1, 1, "e" * 64, "rank0.out"),
             (1, int(tab.st_mtime), tab.st_ctime_ns, tab.st_ino, "d" * 64, "tab\tname.log")]
    lst2, _ = parse_listing(_bash(listing_script(str(run), pats, known)))
    assert lst2.files["out/a.csv"] == (1, "f" * 64)  # quick check matched
    assert lst2.files["rank0.out"] == lst.files["rank0.out"]  # mtime differs: hashed
    assert lst2.files["tab\tname.log"] == (1, "d" * 64)  # a tab in the name does not break the lookup


def test_facts_script_reports_host_and_software():
    script = mf.facts_script(facts=True, python=sys.executable,
                             sources={"testbed": {"path": str(REPO)}, "gone": {"path": "/nonexistent"}})
    out = _bash(script)
    facts, sw = mf.parse_fact_lines([ln for ln in out.splitlines() if ln.startswith(mf.FACT_PREFIXES)])
    assert facts["kernel"] == os.uname().release and facts["arch"] == os.uname().machine
    assert facts["cpus"] >= 1 and facts["memory_mb"] > 0 and facts["os"] and isinstance(facts["gpus"], list)
    assert sw["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert any(ln.lower().startswith("typer==") for ln in sw["pip_freeze"])
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert sw["_commits"] == {"testbed": head.strip(), "gone": ""}
    # an interpreter that is not there falls back to python3
    _, sw2 = mf.parse_fact_lines(_bash(mf.facts_script(facts=False, python="/nope/bin/python")).splitlines())
    assert sw2["python"]["version"]
    # GPU lines from nvidia-smi's CSV
    f, _ = mf.parse_fact_lines(["@F kernel 6.1", "@G NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15"])
    assert f["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "memory": "81559 MiB", "driver": "550.54.15"}]


def test_redact_secrets_and_url_credentials(tmp_path):
    key = tmp_path / "k.json"
    key.write_text(json.dumps({"private_key": "-----BEGIN PRIVATE KEY-----\nAAAAsecretbodyline0123456789\n-----END "
                                              "PRIVATE KEY-----\n", "private_key_id": "abcdef0123456789"}))
    env = {"OS_PASSWORD": "hunter2hunter2", "HOME": "/root", "GOOGLE_APPLICATION_CREDENTIALS": str(key),
           "MY_API_KEY": "k" * 20, "SHORT_TOKEN": "abc"}
    secrets = mf.secret_values(env)
    assert "hunter2hunter2" in secrets and "/root" not in secrets and "abc" not in secrets
    assert "AAAAsecretbodyline0123456789" in secrets and "abcdef0123456789" in secrets
    obj = {"a": ["x hunter2hunter2 y", {"k": "git+https://me:tok@host/r.git@v1"}], "n": 3,
           "p": "line AAAAsecretbodyline0123456789", "ok": "/root/run"}
    out = mf.redact(obj, secrets)
    assert out == {"a": ["x *** y", {"k": "git+https://***@host/r.git@v1"}], "n": 3, "p": "line ***",
                   "ok": "/root/run"}


def test_secret_values_from_the_files_users_keep(tmp_path, monkeypatch):
    """Application-default credentials (gcloud auth application-default login) and clouds.yaml/secure.yaml of
    OS_CLOUD users: their secrets are masked, their ordinary fields (auth_url, username, client_id) are not."""
    gcloud = tmp_path / "gcloud"
    gcloud.mkdir()
    (gcloud / "application_default_credentials.json").write_text(json.dumps(
        {"type": "authorized_user", "client_id": "764086051850-abc.apps.googleusercontent.com",
         "client_secret": "d-FL95Q19q7MQmFpd7hHD0Ty", "refresh_token": "1//0gRefreshTokenValue123"}))
    clouds = tmp_path / "clouds.yaml"
    clouds.write_text("clouds:\n  chameleon:\n    auth:\n      auth_url: https://chi.uc.chameleoncloud.org:5000/v3\n"
                      "      username: alice@uni.edu\n      password: 'pw-from-clouds-yaml'\n"
                      "      application_credential_secret: appcred-s3cret-in-yaml\n    region_name: CHI@UC\n")
    monkeypatch.chdir(tmp_path)
    env = {"HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(gcloud), "OS_CLIENT_CONFIG_FILE": str(clouds),
           "OS_CLOUD": "chameleon"}
    found = mf.secret_values(env)
    for v in ("d-FL95Q19q7MQmFpd7hHD0Ty", "1//0gRefreshTokenValue123", "pw-from-clouds-yaml",
              "appcred-s3cret-in-yaml"):
        assert v in found
    for v in ("764086051850-abc.apps.googleusercontent.com", "alice@uni.edu", "CHI@UC", "chameleon",
              "https://chi.uc.chameleoncloud.org:5000/v3"):
        assert v not in found


def test_build_manifest_from_state(tmp_path):
    from testbed.hosts import Host

    st = Store(tmp_path / "state.db")
    st.upsert_testbed("tb", "lab", None, "up")
    hosts = [Host("a", "10.0.0.1", facts={"accelerator_type": "v4-8"}), Host("b", "10.0.0.2")]
    st.set_hosts("tb", hosts)
    now = time.time()
    info = {"sources": {"s": {"repo": "https://x/s", "ref": "v1", "path": "/src/s"}}, "python": "/venv/bin/python"}
    with st.tx() as db:
        db.execute("INSERT INTO runs(id, suite, testbed, params, status, created, started, ended, info) "
                   "VALUES ('r1','demo','tb','{\"lr\": 0.1}','failed',?,?,?,?)", (now, now, now + 2, json.dumps(info)))
        for rank, (h, status, code) in enumerate([("a", "succeeded", 0), ("a", "failed", 3), ("b", "succeeded", 0)]):
            db.execute("INSERT INTO run_hosts(run_id, host, rank, status, exit_code) VALUES ('r1',?,?,?,?)",
                       (h, rank, status, code))
        db.execute("INSERT INTO events(run_id, ts, kind, host, detail) VALUES ('r1', ?, 'fault', 'b', '{\"x\": 1}')",
                   (now + 1,))
    m = mf.build(st, "r1", hosts=hosts, facts={"a": {"kernel": "6.1"}},
                 software={"python": {"version": "3.11.9"}, "pip_freeze": ["a==1"], "_commits": {"s": "f" * 40}},
                 files=[{"host": "b", "path": "z", "sha256": "0" * 64, "size": 1},
                        {"host": "a", "path": "y", "sha256": "1" * 64, "size": 2}], provider="lab", secrets=[])
    assert m["schema"] == 1 and m["params"] == {"lr": 0.1} and m["testbed"] == {"name": "tb", "provider": "lab"}
    a, b = m["hosts"]
    assert a["status"] == "failed" and a["exit_code"] == 3 and a["facts"] == {"kernel": "6.1", "tpu": "v4-8"}
    assert b["status"] == "succeeded" and b["exit_code"] == 0 and b["facts"]["tpu"] is None
    assert m["software"]["sources"] == {"s": {"repo": "https://x/s", "ref": "v1", "commit": "f" * 40}}
    assert m["software"]["pip_freeze"] == ["a==1"] and "_commits" not in m["software"]
    assert m["events"] == [{"ts": mf.iso(now + 1), "kind": "fault", "host": "b", "detail": {"x": 1}}]
    assert [f["host"] for f in m["files"]] == ["a", "b"]
    assert m["started"].endswith("Z") and m["ended"] > m["started"]
    path = mf.write(tmp_path / "out", m)
    assert mf.load(path.parent) == json.loads(path.read_text()) == m
    assert mf.load(tmp_path / "nothing") == {}


def _no_python(tmp_path: Path) -> Path:
    """A folder for PATH with the tools the listing uses, python3 left out (a host without python3)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("bash", "stat", "xargs", "sha256sum", "sed", "cut", "find", "pwd", "mktemp", "touch", "rm"):
        src = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if src.startswith("/"):
            (fake / tool).symlink_to(src)
    return fake


def _bash_without_python(fake: Path, script: str) -> str:
    return subprocess.run([str(fake / "bash"), "-s"], input=script, capture_output=True, text=True,
                          env={"PATH": str(fake)}, check=True, timeout=60).stdout


def test_listing_reports_unreadable_files_and_hashes_without_python(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "a.txt").write_bytes(b"a")
    (run / "b.txt").write_bytes(b"b")
    script = listing_script(str(run), ["*.txt"])
    # without python3 on the host: coreutils sha256sum gives the same digests
    fake = _no_python(tmp_path)
    out = _bash_without_python(fake, script)
    lst, problem = parse_listing(out)
    assert problem is None and lst.files["a.txt"] == (1, hashlib.sha256(b"a").hexdigest())
    # a file the hasher could not read is an error, never a silently missing file
    (fake / "python3").write_text("#!/bin/sh\necho 'PermissionError' >&2; exit 1\n")
    (fake / "python3").chmod(0o755)
    (fake / "sh").symlink_to("/bin/sh")
    out = _bash_without_python(fake, script)
    assert parse_listing(out)[1] == "a file vanished or is unreadable while it was being checksummed"


@pytest.mark.parametrize("python", [True, False], ids=["python3", "bash"])
def test_a_file_rewritten_with_its_old_size_and_mtime_is_hashed_again(tmp_path: Path, python: bool) -> None:
    """The quick check trusts a known checksum only while size, mtime, ctime (ns) and inode are all what the host
    said when it hashed the file: a file rewritten in place with its old size and mtime (cp -p, touch -r, two
    writes within a second) is hashed again and gets its new checksum; an untouched file is not read (its known
    checksum, a made-up one, is echoed). With python3 on the host and without (stat and sha256sum in bash)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.txt").write_bytes(b"old-bytes")
    (run / "b.txt").write_bytes(b"kept")
    fake = None if python else _no_python(tmp_path)

    def listing(known: list[tuple[int, int, int, int, str, str]]) -> Listing:
        script = listing_script(str(run), ["*.txt"], known)
        out = _bash(script) if fake is None else _bash_without_python(fake, script)
        lst, problem = parse_listing(out)
        assert problem is None, out
        return lst

    first = listing([])
    for p in ("a.txt", "b.txt"):  # the host's stat of each file, as it was when hashed
        st = os.stat(run / p)
        assert first.mtimes[p] == int(st.st_mtime) and first.ids[p] == (st.st_ctime_ns, st.st_ino)
    known = [(first.files[p][0], first.mtimes[p], *first.ids[p], sha, p)
             for p, sha in (("a.txt", first.files["a.txt"][1]), ("b.txt", "e" * 64))]
    before = os.stat(run / "a.txt")
    (run / "a.txt").write_bytes(b"new-bytes")
    os.utime(run / "a.txt", ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(run / "a.txt")
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert after.st_ctime_ns != before.st_ctime_ns  # what the kernel moves on a write, and no user can set back
    again = listing(known)
    assert again.files["a.txt"] == (9, hashlib.sha256(b"new-bytes").hexdigest())
    assert again.ids["a.txt"] == (after.st_ctime_ns, after.st_ino)
    assert again.files["b.txt"] == (4, "e" * 64)  # untouched: not read, its known checksum echoed
    # a known line naming another ctime, or another inode (a file replaced), is never trusted
    size, mtime, ctime, ino, _, _ = known[1]
    for other in ((size, mtime, ctime - 1, ino, "e" * 64, "b.txt"), (size, mtime, ctime, ino + 1, "e" * 64, "b.txt")):
        assert listing([other]).files["b.txt"] == (4, hashlib.sha256(b"kept").hexdigest())


def test_a_stamp_is_trusted_only_where_a_later_write_must_move_it() -> None:
    """The host's stat of a file is kept for the next quick check only when its ctime is in nanoseconds and older
    than the listing by RACY_NS (a write within the same clock tick, or the same second on a file system that
    keeps seconds, leaves the ctime as it was); a listing that did not say its clock gives no stamp at all."""
    now = 1_800_000_000 * 10**9
    out = (f"@NOW {now}\n"
           f"F\t3\t100\t{now - 5 * 10**9}\t7\t{'a' * 64}\told.txt\n"
           f"F\t3\t100\t{now - RACY_NS // 2}\t8\t{'b' * 64}\tfresh.txt\n"
           f"F\t3\t100\t-\t9\t{'c' * 64}\tcoarse.txt\n")
    lst, problem = parse_listing(out)
    assert problem is None and set(lst.files) == {"old.txt", "fresh.txt", "coarse.txt"}
    assert lst.stamp("old.txt") == FileStamp(100, now - 5 * 10**9, 7)
    assert lst.stamp("fresh.txt") is None and lst.stamp("coarse.txt") is None and lst.stamp("absent") is None
    assert parse_listing(out.replace(f"@NOW {now}\n", ""))[0].stamp("old.txt") is None


def wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-python wheel of ``name`` (one module), to install without an index."""
    import base64
    import zipfile

    whl = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}.py": b"X = 1\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
                     f"{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(whl, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
        z.writestr(f"{info}/RECORD", record)
    return whl


def _software(python: str) -> dict:
    out = _bash(mf.facts_script(facts=False, python=python))
    return mf.parse_fact_lines(out.splitlines())[1]


def test_software_fingerprint_changes_with_what_pip_freeze_reports(tmp_path):
    """The fingerprint is the same while nothing is installed, and changes with a pip install, an uninstall and a
    commit in an editable install's checkout; the freeze printed after it shows the change."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    fp = _software(py)["_fingerprint"]
    assert len(fp) == 64 and _bash(mf.facts_script(facts=False, fingerprint=py)).strip() == f"@Y {fp}"
    assert _software(py)["_fingerprint"] == fp  # nothing changed: the same

    def pip(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "pip", "--python", py, *args, "--no-input", "-q"], check=True,
                       timeout=300, capture_output=True)

    pip("install", "--no-index", "--no-deps", str(wheel(tmp_path, "tbfake", "1.0")))
    sw = _software(py)
    assert sw["_fingerprint"] != fp and "tbfake==1.0" in sw["pip_freeze"]
    pip("uninstall", "-y", "tbfake")
    sw2 = _software(py)
    assert sw2["_fingerprint"] not in (fp, sw["_fingerprint"]) and "tbfake==1.0" not in sw2["pip_freeze"]
    # an editable install: pip freeze names its checkout's commit, so a commit there changes the fingerprint
    src = tmp_path / "src"
    src.mkdir()
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "one"], check=True)
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(exist_ok=True)  # pip removed it with its last package
    (site / "tbedit-0.1.dist-info").mkdir()
    (site / "tbedit-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tbedit\nVersion: 0.1\n")
    (site / "tbedit-0.1.dist-info" / "direct_url.json").write_text(
        json.dumps({"url": src.as_uri(), "dir_info": {"editable": True}}))
    before = _software(py)["_fingerprint"]
    assert _software(py)["_fingerprint"] == before
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "two"], check=True)
    assert _software(py)["_fingerprint"] != before
    # an interpreter that cannot run gives no fingerprint (never a cache hit)
    (tmp_path / "broken").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "broken").chmod(0o755)
    assert _bash(mf.facts_script(facts=False, fingerprint=str(tmp_path / "broken"))).strip() == "@Y"


def test_manifest_records_the_suite_files_hashes_and_the_declared_gpus(tmp_path):
    """What `testbed reproduce` compares: the suite's files by hash (absent for a run planned before testbed
    hashed them) and the GPUs the testbed's spec declared (hardware.gpu)."""
    st = Store(tmp_path / "state.db")
    st.upsert_testbed("tb", "lab", None, "up")
    now = time.time()
    infos = {"r1": {"suite_file": "/s/x.yml", "suite_sha256": "a" * 64, "suite_files": {"workloads/w.py": "b" * 64},
                    "hardware": {"gpu_model": "RTX 3070", "gpus": 2}},
             "r2": {"suite_file": "/s/x.yml", "suite_sha256": "a" * 64}}
    with st.tx() as db:
        for rid, info in infos.items():
            db.execute("INSERT INTO runs(id, suite, testbed, params, status, created, info) "
                       "VALUES (?,'demo','tb','{}','succeeded',?,?)", (rid, now, json.dumps(info)))
    m1, m2 = (mf.build(st, rid, hosts=[], facts={}, software={}, files=[], provider="lab", secrets=[])
              for rid in infos)
    assert m1["suite_file"] == {"path": "/s/x.yml", "sha256": "a" * 64, "files": {"workloads/w.py": "b" * 64}}
    assert m1["testbed"] == {"name": "tb", "provider": "lab", "hardware": {"gpu_model": "RTX 3070", "gpus": 2}}
    assert m2["suite_file"] == {"path": "/s/x.yml", "sha256": "a" * 64}
    assert m2["testbed"] == {"name": "tb", "provider": "lab"}


def _loops(run: Path, width: int = 6, depth: int = 8) -> None:
    """A run folder whose symlinks loop: each level links ``width`` times to the next and back to the top, so a
    walker that follows every path (find -L's way) meets width**depth paths."""
    d = run / "out"
    d.mkdir(parents=True)
    (d / "result.csv").write_bytes(b"r")
    for i in range(depth):
        nxt = d / f"l{i}"
        nxt.mkdir()
        (nxt / f"part{i}.csv").write_bytes(b"%d" % i)
        for k in range(width):
            (d / f"to{k}").symlink_to(nxt.name)
        (nxt / "up").symlink_to(run)
        d = nxt


def test_the_listing_walks_each_folder_once_and_never_follows_a_symlink_out(tmp_path: Path) -> None:
    """Symlinks that loop (6 ways into each of 8 levels, every level linking back to the top) are walked once
    each: every real file listed once, in seconds; a symlink leading out of the run folder (a file or a folder) is
    left out, with a note, and what it points at is never read."""
    run = tmp_path / "run"
    _loops(run)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.csv").write_bytes(b"s")
    (run / "out" / "elsewhere").symlink_to(secret)
    (run / "out" / "stolen.csv").symlink_to(secret / "key.csv")
    (run / "top.csv").symlink_to(secret / "key.csv")
    t0 = time.monotonic()
    lst, problem = parse_listing(_bash(listing_script(str(run), ["out", "*.csv"], budget=20)))
    assert problem is None and time.monotonic() - t0 < 20
    want = {"out/result.csv", *(f"out/{'/'.join(f'l{j}' for j in range(i + 1))}/part{i}.csv" for i in range(8))}
    assert set(lst.files) == want, sorted(lst.files)[:20]
    assert not any("key.csv" in p or "secret" in p for p in lst.files)
    assert any("symlink(s) leading out" in n and n.startswith("out:") for n in lst.notes), lst.notes
    assert any("symlink(s) leading out" in n and n.startswith("*.csv:") for n in lst.notes), lst.notes


def test_a_listing_past_its_budget_stops_says_how_far_it_got_and_leaves_nothing_running(tmp_path: Path) -> None:
    """A run folder too large to list within the budget: the listing stops itself, names where it was, and no
    process of it is left (the collector that gave up does not leave it growing on the host)."""
    run = tmp_path / "run"
    many = run / "out"
    many.mkdir(parents=True)
    for i in range(300):
        sub = many / f"d{i}"
        sub.mkdir()
        for k in range(200):
            (sub / f"f{k}").write_bytes(b"")
    script = listing_script(str(run), ["out"], budget=1).replace("\nshift 7\n", "\nshift 7; sleep 2\n")
    out = _bash(script)
    _, problem = parse_listing(out)
    assert problem is not None and "the listing stopped after 1 s" in problem and "too many files" in problem
    assert ", at out/d" in problem  # where it was, in the run folder
    left = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout.split()
    assert left == [], left
