"""The per-user index of state homes (``paths.index_path()``): every folder whose state has recorded a testbed,
so that ``testbed status`` anywhere lists every testbed of this user that can bill.

The file is JSON (``{"homes": [absolute paths]}``), read without a lock (cheap: one small file on every
``testbed status``). Writers take an exclusive ``flock`` on a sibling lock file, read, change and write a
temporary file that replaces the index in one ``rename``: a reader sees the old list or the new one, never a
part, and two processes registering at once both end up listed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed import paths


def _key(home: Path) -> str:
    return os.path.realpath(home)


def read() -> tuple[list[str], str | None]:
    """The homes listed (in the order registered) and a note when the index cannot be read (None: fine)."""
    path = paths.index_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [], None
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        return [], (f"the index of state homes ({path}) is unreadable ({why}): testbeds of other folders are not "
                    "listed; the next 'testbed provision' rewrites it (each folder's 'testbed status' adds it back)")
    homes = data.get("homes") if isinstance(data, dict) else None
    if not isinstance(homes, list):
        return [], (f"the index of state homes ({path}) does not hold a list of homes: testbeds of other folders "
                    "are not listed; the next 'testbed provision' rewrites it")
    return [h for h in homes if isinstance(h, str) and h], None


@contextmanager
def _locked() -> Iterator[list[str]]:
    """The index's homes under the writers' lock; the list as left by the block is written back atomically
    when it changed."""
    import fcntl

    path = paths.index_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before, _ = read()
        homes = list(before)
        yield homes
        if homes != before:
            _write(path, homes)
    finally:
        os.close(fd)  # releases the lock


def _write(path: Path, homes: list[str]) -> None:
    import threading

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.new")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            os.chmod(tmp, 0o600)
            json.dump({"homes": homes}, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def register(home: Path) -> str | None:
    """Add ``home`` to the index (nothing when it is listed already); a note when it could not be added."""
    key = _key(home)
    listed, _ = read()
    if key in listed:
        return None
    try:
        with _locked() as homes:
            if key not in homes:
                homes.append(key)
    except OSError as e:
        return (f"could not add {key} to the index of state homes ({paths.index_path()}: {e.strerror or e}): "
                "'testbed status' in other folders will not list its testbeds")
    return None


def prune(gone: list[str]) -> list[str]:
    """Remove the homes of ``gone`` whose state is still missing; those removed."""
    removed: list[str] = []
    with _locked() as homes:
        for h in gone:
            if h in homes and not (Path(h) / "state.db").is_file():
                homes.remove(h)
                removed.append(h)
    return removed

