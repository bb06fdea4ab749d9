"""``testbed logs`` of a rank whose output is longer than the transport keeps (remote.MAX_OUTPUT, its end):
the lines shown are the file's last ones, and a note on stderr says how much was skipped and where the whole
file is; exit 0, since what is shown is right (as collect names a listing it could not read whole)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def test_a_truncated_output_is_named_with_what_was_skipped() -> None:
    from testbed.run.runner import truncation_notes

    wc = "  70000000 rank3.out\n      12 rank3.err\n70000012 total\n"
    notes = list(truncation_notes("node1", 3, wc, "~/tb-runs/r-1", "r-1", 64 << 20))
    assert [(n.host, n.rank, n.stream) for n in notes] == [("node1", 3, "note")]
    assert notes[0].text == ("rank3.out is 70,000,000 bytes: only its last 67,108,864 are shown, the first "
                             "2,891,136 skipped; the whole file is node1:~/tb-runs/r-1/rank3.out (testbed collect "
                             "r-1 fetches it)")
    assert list(truncation_notes("node1", 3, "5 rank3.out\n", "d", "r-1", 64 << 20)) == []


def test_the_cli_says_so_on_stderr(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.cli import runs
    from testbed.run import runner

    def fake(run_id: str, **_: Any) -> Iterator[runner.LogLine]:
        yield runner.LogLine("node1", 3, "out", "last line")
        yield runner.LogLine("node1", 3, "note", "rank3.out is 70,000,000 bytes: ...")

    monkeypatch.setattr(runner, "logs", fake)
    monkeypatch.setattr(runs, "existing_store", lambda **_: None)
    runs.logs("r-1")
    out = capsys.readouterr()
    assert out.out == "[node1:3] last line\n"
    assert out.err == "note: [node1 rank 3] output truncated: rank3.out is 70,000,000 bytes: ...\n"
