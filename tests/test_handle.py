"""One resolved testbed: found by name or by the file it was provisioned from, or from its recorded copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.errors import TestbedError, UsageError
from testbed.handle import Testbed
from testbed.hosts import Host
from testbed.state import Store

LAB = """provider:
  kind: lab
  hosts:
    - {name: a1, address: 10.1.2.3}
    - {name: a2, address: 10.1.2.4}
"""


def _record(st: Store, name: str, spec: Testbed) -> None:
    """What a provision records: the testbed with its spec copy, and its hosts."""
    assert spec.spec is not None
    copy = spec.spec.model_dump(mode="json", exclude={"source", "vars", "sources"})
    st.upsert_testbed(name, spec.kind, spec.spec.source, "up", {"spec": copy, "subnet": "10.1.2.0/24"})
    st.set_hosts(name, [Host(name="a1", address="10.1.2.3"), Host(name="a2", address="10.1.2.4")])


def test_found_by_name_with_record_hosts_and_paths(tb_home: Path) -> None:
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab1.yml").write_text(LAB)
    st = Store(tb_home / ".testbed" / "state.db")
    tb = Testbed.open("lab1", st)
    assert (tb.name, tb.kind, tb.record, tb.hosts, tb.subnet) == ("lab1", "lab", None, [], None)
    _record(st, "lab1", tb)
    tb = Testbed.open("lab1", st)
    assert [h.name for h in tb.hosts] == ["a1", "a2"] and tb.subnet == "10.1.2.0/24"
    assert tb.dir == tb_home / ".testbed" / "testbeds" / "lab1"
    assert tb.provider().kind == "lab" and tb.provider().store is st and not tb.notes


def test_a_gone_spec_uses_the_recorded_copy_only_when_asked(tb_home: Path) -> None:
    inv = tb_home / "inventories"
    inv.mkdir()
    (inv / "lab1.yml").write_text(LAB)
    st = Store(tb_home / ".testbed" / "state.db")
    _record(st, "lab1", Testbed.open("lab1", st))
    (inv / "lab1.yml").write_text("provider: {kind: lab, hosts: []}\n")  # edited into something invalid
    with pytest.raises(TestbedError):
        Testbed.open("lab1", st)
    tb = Testbed.open("lab1", st, recorded_ok=True)
    assert tb.spec is not None and [h.name for h in tb.spec.provider.hosts] == ["a1", "a2"]  # type: ignore[union-attr]
    assert "using the copy recorded when it was provisioned" in tb.notes[0]
    (inv / "lab1.yml").unlink()  # deleted: set-up and runs still work from the recorded hosts
    tb = Testbed.open("lab1", st, need_spec=False)
    assert tb.spec is None and tb.kind == "lab" and len(tb.hosts) == 2
    with pytest.raises(UsageError, match="no spec to act on"):
        tb.provider()


def test_the_provisioned_file_is_found_from_another_directory(tb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tb_home / "inventories").mkdir()
    (tb_home / "inventories" / "lab1.yml").write_text(LAB)
    st = Store(tb_home / ".testbed" / "state.db")
    first = Testbed.open("lab1", st)
    assert first.spec is not None
    first.spec.source = str(tb_home / "inventories" / "lab1.yml")
    _record(st, "lab1", first)
    elsewhere = tb_home / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert Testbed.open("lab1", st).spec is not None
    with pytest.raises(UsageError, match="no testbed named 'lab2'"):
        Testbed.open("lab2", st)
