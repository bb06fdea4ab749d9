"""Make a small CIFAR-10 in its on-disk python format, so that torchvision.datasets.CIFAR10 loads it offline.

torchvision reads ``<root>/cifar-10-batches-py/`` with ``data_batch_1..5`` and ``test_batch`` (pickled dicts
with str keys, as the Python 2 originals load under ``pickle.load(f, encoding="latin1")``: ``"data"``, a uint8
array N x 3072, the 1024 red then green then blue values of each 32x32 image row by row, and ``"labels"``, a
list of ints 0..9)
and ``batches.meta`` (``label_names``). Random images, labels cycling through the ten classes.

The MD5 problem: ``CIFAR10.__init__`` calls ``self._check_integrity()`` whatever ``download`` says (download=True
first calls ``download()``, which returns at once when that check passes and otherwise fetches the archive), and
``_load_meta`` checks ``batches.meta`` too; each file's MD5 is compared with the real data set's, listed in the
class attributes ``train_list``, ``test_list`` and ``meta``. No made file can have those MD5s (that would be an
MD5 preimage), so without help every load fails with "Dataset not found or corrupted" (or, with download=True,
tries the network). This module therefore writes ``bench-md5.json`` beside the batches, and
``use_made_md5(root)`` sets those three class attributes to the made files' MD5s in the running process: the
artifact scripts and torchvision's files stay as they are, and torchvision's own check still runs and passes
(bench/gpu/cifar_run.py does that, then runs an artifact script). No download can happen: the check passes.

    python3 bench/gpu/make_cifar.py ROOT [--per-batch 1000] [--test 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import random
import sys
from pathlib import Path

BASE = "cifar-10-batches-py"
TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
TEST = "test_batch"
META = "batches.meta"
MD5_FILE = "bench-md5.json"
LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def _batch(n: int, rng: random.Random, label: str, start: int):
    data = rng.randbytes(n * 3072)
    try:  # torchvision does np.vstack(entry["data"]).reshape(-1, 3, 32, 32): an ndarray, as the real files hold
        import numpy as np

        data = np.frombuffer(data, dtype=np.uint8).reshape(n, 3072).copy()
    except ImportError:  # bytes of the same layout: np.vstack would not take them, but the pickle reader does
        pass
    labels = [(start + i) % 10 for i in range(n)]
    names = [f"bench_{start + i:06d}.png" for i in range(n)]
    return {"batch_label": label, "labels": labels, "data": data, "filenames": names}


def make(root: str | os.PathLike, per_batch: int = 1000, test: int = 1000, seed: int = 0) -> dict:
    """Write ROOT/cifar-10-batches-py/ and its bench-md5.json; return {file name: md5}."""
    folder = Path(root) / BASE
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for i, name in enumerate(TRAIN):
        with open(folder / name, "wb") as f:
            pickle.dump(_batch(per_batch, rng, f"training batch {i + 1} of 5", i * per_batch), f, protocol=2)
    with open(folder / TEST, "wb") as f:
        pickle.dump(_batch(test, rng, "testing batch 1 of 1", 0), f, protocol=2)
    with open(folder / META, "wb") as f:
        pickle.dump({"label_names": LABEL_NAMES, "num_cases_per_batch": per_batch, "num_vis": 3072}, f, protocol=2)
    md5 = {name: _md5(folder / name) for name in [*TRAIN, TEST, META]}
    (folder / MD5_FILE).write_text(json.dumps(md5, indent=1) + "\n")
    return md5


def use_made_md5(root: str | os.PathLike) -> dict:
    """Make torchvision's CIFAR10 expect the MD5s of the files made under ROOT (in this process only)."""
    md5 = json.loads((Path(root) / BASE / MD5_FILE).read_text())
    from torchvision.datasets import CIFAR10

    CIFAR10.train_list = [[name, md5[name]] for name in TRAIN]
    CIFAR10.test_list = [[TEST, md5[TEST]]]
    CIFAR10.meta = {**CIFAR10.meta, "md5": md5[META]}
    return md5


def load(root: str | os.PathLike, train: bool = True):
    """Read the batches as torchvision's CIFAR10.__init__ does (without torchvision): (data N x 32 x 32 x 3, labels)."""
    folder = Path(root) / BASE
    data, targets = [], []
    for name in TRAIN if train else [TEST]:
        with open(folder / name, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        data.append(entry["data"])
        targets.extend(entry["labels"] if "labels" in entry else entry["fine_labels"])
    with open(folder / META, "rb") as f:
        classes = pickle.load(f, encoding="latin1")["label_names"]
    import numpy as np

    arr = np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
    return arr, targets, classes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--per-batch", type=int, default=1000)
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    md5 = make(a.root, a.per_batch, a.test, a.seed)
    print(json.dumps({"root": str(a.root), "files": md5}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
