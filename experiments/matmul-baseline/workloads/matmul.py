"""matmul-baseline workload: timed square matrix multiplies on one rank (CPU), like tesla's baseline_measure.py.

Writes ``matmul_rank<r>.csv`` (rank,host,iteration,size,seconds,gflops) in the working directory. Uses numpy,
or pure Python for tiny sizes when numpy is missing.
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import time


def matmul_py(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    bt = list(zip(*b, strict=True))
    return [[sum(x * y for x, y in zip(row, col, strict=True)) for col in bt] for row in a]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--iterations", type=int, default=5)
    a = ap.parse_args()
    host = socket.gethostname()
    try:
        import numpy as np

        rng = np.random.default_rng(a.rank)
        x, y = rng.random((a.size, a.size)), rng.random((a.size, a.size))

        def mul() -> object:
            return x @ y
    except ImportError:
        rnd = random.Random(a.rank)
        xs = [[rnd.random() for _ in range(a.size)] for _ in range(a.size)]
        ys = [[rnd.random() for _ in range(a.size)] for _ in range(a.size)]

        def mul() -> object:
            return matmul_py(xs, ys)
    with open(f"matmul_rank{a.rank}.csv", "w") as f:
        f.write("rank,host,iteration,size,seconds,gflops\n")
        for i in range(a.iterations):
            t0 = time.perf_counter()
            mul()
            dt = max(time.perf_counter() - t0, 1e-9)
            gflops = 2 * a.size ** 3 / dt / 1e9
            f.write(f"{a.rank},{host},{i},{a.size},{dt:.6f},{gflops:.3f}\n")
            print(f"rank {a.rank}/{a.world_size} on {host}: iteration {i} size {a.size} {dt:.4f} s "
                  f"{gflops:.2f} GFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
