"""Progress while a run goes on: each rank's last line worth showing (pure parts here; on local hosts in
tests/test_run_local.py), and the live status line as the CLI draws it."""

from __future__ import annotations

from rich.console import Console

from testbed.cli.runs import progress_view
from testbed.run.runner import TAIL_BYTES, RankLine, last_line, parse_tails
from testbed.suite import Suite


def test_last_line_takes_the_last_match_or_the_last_line() -> None:
    text = "loading\nepoch 1 step 10 loss 2.3\nsaving checkpoint\n\n"
    assert last_line(text, None) == "saving checkpoint"
    assert last_line(text, r"step (\d+)") == "epoch 1 step 10 loss 2.3"
    assert last_line(text, r"accuracy") == ""
    assert last_line("  10%|#   \r  50%|#####  \r 90%|######### \n", None) == "90%|#########"  # a tqdm bar


def test_tails_output_is_split_per_rank_and_a_cut_first_line_dropped() -> None:
    out = "\n@@testbed-rank 0\nhello\nworld\n\n@@testbed-rank 3\n" + "x" * 10 + "\n" + "y" * (TAIL_BYTES - 11)
    tails = parse_tails(out)
    assert tails[0].splitlines() == ["hello", "world"]
    assert tails[3] == "y" * (TAIL_BYTES - 11)  # the first line of a full tail may be cut: dropped
    assert parse_tails("") == {}


def test_the_live_line_is_cut_never_wrapped() -> None:
    con = Console(record=True, width=80, force_terminal=True, color_system=None)
    lines = [RankLine("node0", k, f"step {k} " + "z" * 200) for k in range(10)]
    con.print(progress_view("fault-drill-20261124-120000-abcd", "rank 1 ended", 83.0, lines, most=8))
    shown = con.export_text().splitlines()
    assert "fault-drill-20261124-120000-abcd" in shown[0] and "1m23s" in shown[0]
    assert all(len(ln) <= 80 for ln in shown)
    assert sum("node0 r" in ln for ln in shown) == 8 and "2 more rank(s)" in shown[-1]


def test_a_suite_progress_pattern_must_be_a_regex() -> None:
    import pytest
    from pydantic import ValidationError

    base = {"name": "p", "steps": {"launch": {"command": "true"}}}
    assert Suite.model_validate({**base, "progress": r"step (\d+)"}).progress == r"step (\d+)"
    with pytest.raises(ValidationError, match="not a regular expression"):
        Suite.model_validate({**base, "progress": "step ("})
