"""A campaign longer than its own testbed's spec gives is a static finding (issue 37, item 5; datastall's campaign
of 14h 42m outlived its shipped 6 h Chameleon lease): named at the suite's ``testbed:`` line, before any host."""

from __future__ import annotations

import shutil
from pathlib import Path

from testbed import lint
from testbed.suite import load_suite

ROOT = Path(__file__).resolve().parents[1]


def _with_spec(tb_home: Path, hours: int) -> list[lint.Finding]:
    (tb_home / "inventories").mkdir(exist_ok=True)
    text = (ROOT / "inventories" / "chameleon.yml").read_text()
    assert text.count("  hours: 20\n") == 1
    (tb_home / "inventories" / "chameleon.yml").write_text(text.replace("  hours: 20\n", f"  hours: {hours}\n"))
    return lint.campaign_outlives_testbed(load_suite("datastall-emulator"))


def test_a_campaign_longer_than_its_testbeds_lease_is_named_at_the_suites_testbed_line(tb_home: Path) -> None:
    found = _with_spec(tb_home, 6)
    assert len(found) == 1, found
    f = found[0]
    assert f.kind == "testbed-length" and f.what.startswith(
        "the campaign of datastall-emulator is estimated at 14h 42m on testbed 'chameleon', whose spec gives 6h 00m "
        "(its spec's lease of 6 h (not provisioned yet), "), f.what
    path, line = f.where.rsplit(":", 1)
    assert Path(path).read_text().splitlines()[int(line) - 1].startswith("testbed: chameleon"), f.where
    assert _with_spec(tb_home, 15) == []  # 14h 42m fits in 15 h


def test_the_shipped_specs_give_each_suites_campaign_the_time_it_needs() -> None:
    for name in ("datastall-emulator", "isca-resnet18", "jitc", "tesla", "neuronabox", "fault-drill"):
        assert lint.campaign_outlives_testbed(load_suite(name)) == [], name


def test_a_suite_without_a_matrix_or_a_spec_length_is_not_judged(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    shutil.copytree(ROOT / "experiments" / "mpi-hello", tb_home / "experiments" / "mpi-hello")
    assert lint.campaign_outlives_testbed(load_suite("mpi-hello")) == []
