"""Collect throughput against plain ``rsync -a`` of the same files, on a real 4-host local testbed.

Each host's run folder holds ``--small`` files of 20 KB and two large files, about 50 MB per host (200 MB in
all by default). Plain rsync: one ``rsync -a`` per host, in parallel, over the same ssh config. Collect:
``collect_runs`` (listing + host-side sha256, rsync, local verification, manifest). Both are timed into fresh
folders ``--repeat`` times (alternating); the median is reported, then the no-change re-run of each.

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

from localbed import local_available, local_bed
from test_collect import make_run, sh

from testbed.collect import collect_runs


def plain_rsync(bed: object, run_dir: str, dest: Path) -> float:
    cfg = str(bed.ssh_config)  # type: ignore[attr-defined]

    def one(host: str) -> None:
        (dest / host).mkdir(parents=True, exist_ok=True)
        subprocess.run(["rsync", "-a", "-e", f"ssh -F {cfg} -o ControlMaster=no", f"{host}:{run_dir}/",
                        f"{dest / host}/"], check=True, capture_output=True)

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, [h.name for h in bed.hosts]))  # type: ignore[attr-defined]
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--small", type=int, default=500, help="20 KB files per host")
    ap.add_argument("--large-mb", type=int, default=20, help="size of each of the two large files per host")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    reason = local_available()
    if reason:
        sys.exit(f"local testbed unavailable: {reason}")
    work = Path(tempfile.mkdtemp(prefix="tb-bench-collect-"))
    try:
        with local_bed(work / "bed", name="bench", hosts_n=args.hosts) as bed:
            run_id, run_dir = make_run(bed, suite="bench", outputs={"*": ["small", "large/*.bin"]})
            gen = (f"set -e; cd {run_dir}; mkdir -p small large; "
                   f"for i in $(seq {args.small}); do head -c 20000 /dev/urandom > small/$i.bin; done; "
                   f"head -c {args.large_mb}M /dev/urandom > large/a.bin; "
                   f"head -c {args.large_mb}M /dev/urandom > large/b.bin")
            with ThreadPoolExecutor(args.hosts) as pool:
                list(pool.map(lambda h: sh(bed, h.name, gen, timeout=600), bed.hosts))
            total = args.hosts * (args.small * 20000 + 2 * args.large_mb * 2**20)
            files = args.hosts * (args.small + 2 + 6)
            plain_t, coll_t = [], []
            plain_dest = coll_dest = Path()
            for i in range(args.repeat):
                plain_dest = work / f"plain{i}"
                plain_t.append(plain_rsync(bed, run_dir, plain_dest))
                coll_dest = work / f"results{i}"
                t0 = time.monotonic()
                res = collect_runs([run_id], coll_dest, store=bed.store)
                coll_t.append(time.monotonic() - t0)
                assert res[0].ok, res[0].problems()
                if i < args.repeat - 1:
                    shutil.rmtree(plain_dest)
                    shutil.rmtree(coll_dest)
                    with bed.store.tx() as db:  # forget what was collected: the next round starts fresh
                        db.execute("DELETE FROM collected WHERE run_id=?", (run_id,))
            p, c = statistics.median(plain_t), statistics.median(coll_t)
            again_plain = plain_rsync(bed, run_dir, plain_dest)
            t0 = time.monotonic()
            again = collect_runs([run_id], coll_dest, store=bed.store)[0]
            again_coll = time.monotonic() - t0
            assert again.ok and again.files_sent == 0
            mb = total / 2**20
            print(f"{args.hosts} hosts, {files} files, {mb:.0f} MB; median of {args.repeat}")
            print(f"plain rsync -a (parallel): {p:6.2f} s  {mb / p:7.1f} MB/s   runs: {[round(x, 2) for x in plain_t]}")
            print(f"testbed collect          : {c:6.2f} s  {mb / c:7.1f} MB/s   runs: {[round(x, 2) for x in coll_t]}")
            print(f"collect / rsync time ratio: {c / p:.2f}  (throughput {p / c:.2f}x of rsync)")
            print(f"no-change re-run: rsync -a {again_plain:.2f} s, collect {again_coll:.2f} s "
                  f"(max per host {max(h.seconds for h in again.hosts):.2f} s, 0 files sent)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
