"""How often reading one command's code returns to a file it already left.

Runs ``testbed ARGS...`` in this process under a profiler hook, keeps each testbed function at its first call
(a loop or a poll counts once), and walks those functions in that order: the files visited, one step per change
of file. A *return* is a step into a file the walk already left. Usage::

    python bench/walk.py run mpi-hello --on local      # prints the count and the walk
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any


def walk(argv: list[str]) -> list[str]:
    """The files of the first calls of testbed functions while ``testbed argv`` runs, in order."""
    import testbed

    root = Path(testbed.__file__).parent  # the tree imported (PYTHONPATH may name another checkout)
    seen: set[tuple[str, int]] = set()
    order: list[str] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        key = (code.co_filename, code.co_firstlineno)
        if key in seen or not code.co_filename.startswith(str(root)):
            return
        seen.add(key)
        order.append(str(Path(code.co_filename).relative_to(root.parent)))

    from testbed.cli import main

    sys.argv = ["testbed", *argv]
    sys.setprofile(hook)
    try:
        main()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    return order


def returns(files: list[str]) -> tuple[int, list[str]]:
    """(steps into a file already left, the walk with consecutive repeats folded)."""
    steps = [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
    left: set[str] = set()
    count = 0
    for i, f in enumerate(steps):
        if f in left:
            count += 1
        if i:
            left.add(steps[i - 1])
    return count, steps


if __name__ == "__main__":
    n, steps = returns(walk(sys.argv[1:]))
    out = os.fdopen(os.dup(2), "w")
    out.write(f"walk of 'testbed {' '.join(sys.argv[1:])}': {len(steps)} steps through "
              f"{len(set(steps))} files, {n} returns to a file already left\n")
    if os.environ.get("WALK_VERBOSE"):
        out.write("\n".join(steps) + "\n")
