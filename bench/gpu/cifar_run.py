"""Run an artifact script as ``python3 SCRIPT ARGS...`` would, with torchvision's CIFAR10 expecting the made files.

    python3 bench/gpu/cifar_run.py DATA_ROOT SCRIPT [ARGS...]

DATA_ROOT is the folder the script passes to CIFAR10 (it holds cifar-10-batches-py/ from make_cifar.py). Only
CIFAR10's expected MD5s change (see make_cifar.py); the script runs unmodified as __main__, with its own folder
first on sys.path as when Python runs it directly.
"""

from __future__ import annotations

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_cifar


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    root, script = sys.argv[1], sys.argv[2]
    make_cifar.use_made_md5(root)
    sys.argv = [script, *sys.argv[3:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
