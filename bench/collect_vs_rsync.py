"""Collect throughput against plain ``rsync -a`` of the same files, on a real 4-host local testbed.

Each host's run folder holds ``--small`` files of 20 KB and two large files, about 50 MB per host (200 MB in
all by default). Plain rsync: one ``rsync -a`` per host, in parallel, over the same ssh config. Collect:
``collect_runs`` (listing, new files streamed and hashed on both sides, manifest). Both are timed into fresh
folders ``--repeat`` times (alternating, and alternating which goes first); medians, spread and the ratio
are reported with the targets (first collect at most 1.0x rsync -a; an unchanged re-collect under 0.1 s per
host), then the no-change re-runs.

Run as root from the repo: ``.venv/bin/python bench/collect_vs_rsync.py``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _common import loadavg
from localbed import local_available, local_bed
from test_collect import make_run, sh

from testbed.collect import collect_runs, software
from testbed.collect.transfer import HostCollect


def plain_rsync(bed: object, run_dir: str, dest: Path, workers: int = 8) -> float:
    """``rsync -a`` of ``run_dir`` from every host into ``dest/HOST``, ``workers`` hosts at a time: its seconds."""
    cfg = str(bed.ssh_config)  # type: ignore[attr-defined]

    def one(host: str) -> None:
        (dest / host).mkdir(parents=True, exist_ok=True)
        subprocess.run(["rsync", "-a", "-e", f"ssh -F {cfg} -o ControlMaster=no", f"{host}:{run_dir}/",
                        f"{dest / host}/"], check=True, capture_output=True)

    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, [h.name for h in bed.hosts]))  # type: ignore[attr-defined]
    return time.monotonic() - t0


def make_files(bed: object, run_dir: str, small: int, large_mb: int) -> None:
    """``small`` files of 20 KB under small/ and two of ``large_mb`` MB under large/ on every host."""
    gen = (f"set -e; cd {run_dir}; mkdir -p small large; "
           f"for i in $(seq {small}); do head -c 20000 /dev/urandom > small/$i.bin; done; "
           f"head -c {large_mb}M /dev/urandom > large/a.bin; "
           f"head -c {large_mb}M /dev/urandom > large/b.bin")
    hosts = bed.hosts  # type: ignore[attr-defined]
    with ThreadPoolExecutor(min(16, len(hosts))) as pool:
        list(pool.map(lambda h: sh(bed, h.name, gen, timeout=600), hosts))


def forget(bed: object, run_id: str) -> None:
    """Forget what was collected of ``run_id``: the next collect starts from nothing."""
    with bed.store.tx() as db:  # type: ignore[attr-defined]
        db.execute("DELETE FROM collected WHERE run_id=?", (run_id,))


def collect_once(bed: object, small: int = 20, large_mb: int = 1) -> None:
    """One collect of a fresh run on every host of ``bed`` (bench/scale.py): time and outcome."""
    run_id, run_dir = make_run(bed, suite="bench", outputs={"*": ["small", "large/*.bin"]})
    make_files(bed, run_dir, small, large_mb)
    work = Path(tempfile.mkdtemp(prefix="tb-bench-collect-"))
    try:
        t0 = time.monotonic()
        res = collect_runs([run_id], work, store=bed.store)[0]  # type: ignore[attr-defined]
        dt = time.monotonic() - t0
        t1 = time.monotonic()
        again = collect_runs([run_id], work, store=bed.store)[0]  # type: ignore[attr-defined]
        dt2 = time.monotonic() - t1
        n = len(res.hosts)
        print(f"collect on {n} hosts: {'ok' if res.ok else 'FAILED: ' + '; '.join(res.problems()[:3])}, "
              f"{res.files_sent} files, {res.bytes_sent / 2**20:.0f} MB in {dt:.1f} s; unchanged re-collect "
              f"{dt2:.2f} s ({dt2 / max(1, n):.3f} s per host, {again.files_sent} files sent)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--small", type=int, default=500, help="20 KB files per host")
    ap.add_argument("--large-mb", type=int, default=20, help="size of each of the two large files per host")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    reason = local_available()
    if reason:
        sys.exit(f"local testbed unavailable: {reason}")
    work = Path(tempfile.mkdtemp(prefix="tb-bench-collect-"))
    try:
        with local_bed(work / "bed", name="bench", hosts_n=args.hosts) as bed:
            run_id, run_dir = make_run(bed, suite="bench", outputs={"*": ["small", "large/*.bin"]})
            make_files(bed, run_dir, args.small, args.large_mb)
            total = args.hosts * (args.small * 20000 + 2 * args.large_mb * 2**20)
            files = args.hosts * (args.small + 2 + 5)  # + the 5 rank logs
            print(f"load before: {loadavg()}", flush=True)
            plain_t: list[float] = []
            coll_t: list[float] = []
            froze: list[int] = []
            plain_dest = coll_dest = Path()
            for i in range(args.repeat):  # alternate, and alternate which goes first
                def plain(i: int = i) -> None:
                    nonlocal plain_dest
                    plain_dest = work / f"plain{i}"
                    plain_t.append(plain_rsync(bed, run_dir, plain_dest))

                def coll(i: int = i) -> None:
                    nonlocal coll_dest
                    coll_dest = work / f"results{i}"
                    if not software.cache_path(bed.store, bed.name).exists():  # type: ignore[attr-defined]
                        froze.append(i)  # this one takes the pip freeze: nothing kept from this host yet
                    t0 = time.monotonic()
                    res = collect_runs([run_id], coll_dest, store=bed.store)
                    coll_t.append(time.monotonic() - t0)
                    assert res[0].ok, res[0].problems()
                    assert res[0].files_sent == files, (res[0].files_sent, files)

                for f in (plain, coll) if i % 2 == 0 else (coll, plain):
                    f()
                if i < args.repeat - 1:
                    shutil.rmtree(plain_dest)
                    shutil.rmtree(coll_dest)
                    forget(bed, run_id)
            again_plain, again_coll, per_host = [], [], []
            for _ in range(args.repeat):
                again_plain.append(plain_rsync(bed, run_dir, plain_dest))
                t0 = time.monotonic()
                again = collect_runs([run_id], coll_dest, store=bed.store)[0]
                again_coll.append(time.monotonic() - t0)
                assert again.ok and again.files_sent == 0
                per_host.append(max(h.seconds for h in again.hosts))
            p, c = statistics.median(plain_t), statistics.median(coll_t)
            ac = statistics.median(again_coll)
            mb = total / 2**20
            methods = sorted({h.method or "-" for h in res_methods(bed, run_id)})
            print(f"{args.hosts} hosts, {files} files, {mb:.0f} MB; median of {args.repeat} alternated rounds "
                  f"(load after: {loadavg()})")
            print(f"plain rsync -a (parallel): {p:6.2f} s  {mb / p:7.1f} MB/s   runs: {[round(x, 2) for x in plain_t]}")
            print(f"testbed collect          : {c:6.2f} s  {mb / c:7.1f} MB/s   runs: {[round(x, 2) for x in coll_t]}"
                  f"  (every sha256 verified on both sides; method: {', '.join(methods)})")
            print(f"  (round(s) {[i + 1 for i in froze]} took the pip freeze: no freeze kept for the host yet; "
                  f"the others reused it, the host's software fingerprint unchanged)")
            ratio = c / p
            print(f"first collect / rsync -a: {ratio:.2f} (spread {min(coll_t) / max(plain_t):.2f}-"
                  f"{max(coll_t) / min(plain_t):.2f}); target <= 1.0: {'MET' if ratio <= 1.0 else 'MISSED'}")
            print(f"unchanged re-run: rsync -a {statistics.median(again_plain):.2f} s, collect {ac:.2f} s = "
                  f"{ac / args.hosts:.3f} s per host (slowest host {statistics.median(per_host):.3f} s); target "
                  f"< 0.1 s per host: {'MET' if ac / args.hosts < 0.1 else 'MISSED'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def res_methods(bed: object, run_id: str) -> list[HostCollect]:
    """The per-host outcome of a fresh collect of ``run_id`` into a scratch folder (which method each used)."""
    tmp = Path(tempfile.mkdtemp(prefix="tb-bench-m-"))
    try:
        forget(bed, run_id)
        return collect_runs([run_id], tmp, store=bed.store)[0].hosts  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
