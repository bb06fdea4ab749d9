"""The test tiers, applied by fixture: what a test needs decides its markers, whatever its file says.

- ``local``: root and local testbeds (network namespaces, sshd in them);
- ``own_testbed``: it provisions local testbeds of its own (one or more per test), so it never shares the
  worker's one (``shared_local_testbed``), which is reset between test modules instead;
- ``sshd``: root and real sshd daemons on loopback addresses (the cloud fakes' servers);
- ``slow``: more than a few seconds (said explicitly, or by a fixture such as ``torch_pair``).

``make test-unit`` runs ``not local and not sshd and not slow``; ``make test-fast`` runs ``not slow and not
own_testbed``; ``make test`` runs everything. Explicit markers on a test or a module still count.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

import pytest

# a test that uses (directly or through other fixtures) one of these fixtures gets these markers
BY_FIXTURE: dict[str, tuple[str, ...]] = {
    "need_local": ("local", "own_testbed"),
    "local_testbed": ("local", "own_testbed"),
    "shared_local_testbed": ("local",),
    "slurm_cluster": ("local", "own_testbed"),  # a Slurm cluster on local hosts of its module's own
    "sshd": ("sshd",),  # tests/test_chameleon.py: LoopbackSshd for the fake's floating IPs
    "tpu_sshd": ("sshd",),  # tests/test_tpu_provider.py: one sshd for the fake's TPU workers
    "torch_pair": ("slow",),  # a venv with torch and torchvision, ~1 minute the first time on a machine
}

# a fixture of a file this table has never seen (or a test itself) whose source does this gets these markers
BY_SOURCE: list[tuple[re.Pattern[str], tuple[str, ...]]] = [
    (re.compile(r"\blocal_bed\(|\bLocalBed\(|\bLocalProvider\("), ("local", "own_testbed")),
    (re.compile(r"\bLoopbackSshd\(|\bsshd\}? -f\b|/usr/sbin/sshd\b"), ("sshd",)),
]

TIER_MARKERS = ("local", "own_testbed", "sshd", "slow")


@cache
def _source_marks(func: Callable[..., object]) -> frozenset[str]:
    try:
        src = inspect.getsource(func)
    except (OSError, TypeError):
        return frozenset()
    return frozenset(m for pattern, marks in BY_SOURCE if pattern.search(src) for m in marks)


def _fixture_funcs(item: pytest.Item) -> Iterable[tuple[str, Callable[..., object]]]:
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in (getattr(info, "name2fixturedefs", None) or {}).items():
        for d in defs:
            yield name, d.func


def needed_markers(item: pytest.Item) -> set[str]:
    """The tier markers ``item`` needs, from its fixtures (by name and by source) and its own source."""
    names = set(getattr(item, "fixturenames", ()))
    out = {m for name in names & BY_FIXTURE.keys() for m in BY_FIXTURE[name]}
    for name, func in _fixture_funcs(item):
        if name in names and not func.__module__.startswith(("_pytest", "pytest", "xdist", "hypothesis")):
            out |= _source_marks(func)
    obj = getattr(item, "obj", None)
    if callable(obj):
        out |= _source_marks(obj)
    return out


def _explicit(item: pytest.Item) -> set[str]:
    return {m.name for m in item.iter_markers() if m.name in TIER_MARKERS}


def apply(items: list[pytest.Item]) -> None:
    """Add the tier markers each item needs (explicit ones stay)."""
    for item in items:
        have = _explicit(item)
        need = needed_markers(item)
        if "own_testbed" in have:  # an explicit own_testbed is local as well
            need.add("local")
        for m in sorted(need - have):
            item.add_marker(getattr(pytest.mark, m))


def dump(items: list[pytest.Item], path: Path) -> None:
    """Each item's node id, markers and fixtures (the whole closure) as JSON, for tests/test_tiers.py."""
    path.write_text(json.dumps([{"id": i.nodeid, "markers": sorted({m.name for m in i.iter_markers()}),
                                 "fixtures": sorted(getattr(i, "fixturenames", ()))} for i in items]))
