"""A run report's words match what it shows: the timeline's cells are cut at a word boundary (never inside a word),
a repair's details are words (not a Python dict), and the loss figure's caption names the line style and colour
each marker is drawn with."""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_report_first_screen import fault_drill_run

from testbed.report import plotting
from testbed.report.build import build_report


def _timeline(md: str) -> list[list[str]]:
    """The rows of the report's timeline table (Markdown): the cells of each."""
    lines = md.split("Fault and recovery timeline", 1)[1].splitlines()[1:]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    end = next((i for i, ln in enumerate(lines) if i > start and not ln.startswith("|")), len(lines))
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[start + 2:end]]


def test_timeline_cells_are_words_cut_at_word_boundaries(tmp_path: Path) -> None:
    run = fault_drill_run(tmp_path)
    m = json.loads((run / "manifest.json").read_text())
    long_reason = ("node2 rank 2: signal 9 (SIGKILL) while writing its checkpoint to the shared folder, "
                   "after the collective timed out")
    m["events"][2]["detail"]["reason"] = long_reason
    ts = m["events"][3]["ts"]
    m["events"][3:3] = [
        {"ts": ts, "kind": "repairing", "host": None,
         "detail": {"hosts": ["node2"], "setup": True, "why": {"node2": "no answer to ssh for 8.1 s"}}},
        {"ts": ts, "kind": "repaired", "host": "node2",
         "detail": {"how": "restarted its init", "repair_seconds": 1.2, "setup": "fault-drill", "setup_seconds": 8.5,
                    "replaced": []}}]
    (run / "manifest.json").write_text(json.dumps(m))
    md = build_report(run).path.read_text()
    rows = {r[1]: r for r in _timeline(md)}
    assert rows["repairing"][3] == "node2: no answer to ssh for 8.1 s", rows["repairing"]
    assert rows["repaired"][3] == "restarted its init in 1.2 s, set up again in 8.5 s", rows["repaired"]
    failed = rows["failed"][3]
    assert failed.endswith("…") and len(failed) <= 80, failed
    assert long_reason.startswith(failed[:-1]) and long_reason[len(failed) - 1] == " ", failed  # at a space
    assert not any("{" in r[3] or "'" in r[3] for r in rows.values()), rows
    events = md.split("| repairing |")[-1].splitlines()[0]  # the run's event table, further down: words too
    assert events.strip() == "| hosts=node2, setup=True, why=node2: no answer to ssh for 8.1 s |", events


def test_loss_caption_names_the_styles_the_figure_draws(tmp_path: Path) -> None:
    res = build_report(fault_drill_run(tmp_path))
    md = res.path.read_text()
    caption = re.search(r"!\[([^\]]*)\]\(loss\.png\)", md) or re.search(r"\n\*?([^\n]*vertical lines[^\n]*)", md)
    assert caption, md[:3000]
    text = caption[1]
    assert "solid line per attempt" in text, text
    assert "fault (node2): red, dashed" in text and "recovery: green, dotted" in text, text
    assert "dashed lines: failure (red) and restart (green)" not in md


def test_clip_and_words() -> None:
    from testbed.textfmt import clip, words

    assert clip("short", 80) == "short"
    assert clip("alpha beta gamma", 12) == "alpha beta…"
    assert clip("x" * 20, 8) == "x" * 7 + "…"
    assert words({"node1": "lost", "node2": ["a", "b"]}) == "node1: lost; node2: a, b"
    assert words([]) == "none" and words(0) == "0"
    assert plotting.vline_key([(1, "fault", "tab:red"), (2, "b", "green"), (3, "c", "k"), (4, "d", "k")]) == \
        "fault: red, dashed; b: green, dotted; c: k, dash-dotted; d: k, dashed"
