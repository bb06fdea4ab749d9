"""Markdown and self-contained HTML renderings of a Report (figures referenced as sibling PNGs)."""

from __future__ import annotations

import html
import math

from testbed.report.model import Block, Cell, Code, Figure, Heading, Link, Report, Table, Text, Timestamp
from testbed.report.tidy_csv import _verdict
from testbed.report.verdicts import Verdict, headline, headline_tone, summary
from testbed.textfmt import plural


def fmt_cell(value: Cell | object) -> str:
    """Numbers to a readable precision; None as an empty cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Timestamp):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.4g}"
        return f"{value:.4f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def _md_cell(value: Cell | object) -> str:
    if isinstance(value, Link):
        label = _md_text(value.text).replace("[", "(").replace("]", ")").replace("|", "\\|")
        return f"[{label}]({value.href.replace(' ', '%20').replace(')', '%29').replace('|', '%7C')})"
    text = _md_text(fmt_cell(value)).replace("\\", "\\\\").replace("|", "\\|")
    return " ".join(text.split())


def _longest_run(text: str, ch: str) -> int:
    """The longest run of ``ch`` in ``text`` (a code fence must be longer than any run inside it)."""
    best = cur = 0
    for c in text:
        cur = cur + 1 if c == ch else 0
        best = max(best, cur)
    return best


def _md_text(text: str) -> str:
    """Neutralise raw HTML in Markdown prose (``<`` and ``&``); keep it readable."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _status_text(report: Report) -> str | None:
    """``failed: rank 1 exited 3`` (the status, its reason and, for a failed run, its cause) with the verdicts
    beside it (``succeeded, but 1 of 4 verdicts outside tolerance``); None without a status."""
    if report.status is None:
        return None
    return headline(report.status, report.verdicts,
                    report.cause.summary() if report.cause is not None else report.reason)


def _verdict_rows(report: Report) -> list[list[object]]:
    return [[v.metric, v.reference, v.ours, _difference(v), v.status, v.tolerance, v.hardware, v.source]
            for v in report.verdicts]


VERDICT_HEAD = ["metric", "reference", "ours", "difference", "verdict", "tolerance", "hardware", "source"]


def _difference(v: Verdict) -> str:
    if v.difference is None:
        return "" if v.within is None else ("same" if v.within else "differs")
    text = f"{fmt_cell(v.difference) if v.difference < 0 else '+' + fmt_cell(v.difference)}"
    return text + (f" ({v.relative_pct:+.1f}%)" if v.relative_pct is not None else "")


def _lead(report: Report) -> list[Block]:
    """The first screen's blocks: the key figure first, then the timeline."""
    return sorted(report.lead, key=lambda b: not isinstance(b, Figure))


def to_markdown(report: Report) -> str:
    """The first screen (status, verdicts, checks, key figure, timeline), then every block in order."""
    out: list[str] = [f"# {_md_text(report.title)}", ""]
    status = _status_text(report)
    if status:
        out += [f"**Status:** {_md_text(status)}", ""]
    if report.verdicts:
        out += ["## Verdicts", "", _md_text(summary(report.verdicts)) + " (verdicts.csv)", ""]
        out += _md_table(Table("verdicts", VERDICT_HEAD, _verdict_rows(report)))
    if report.checks:
        out += ["## Checks", ""]
        out += _md_table(Table("checks", ["check", "result", "detail"],
                               [[n, _verdict(p), d] for n, p, d in report.checks]))
    for block in [*_lead(report), *report.blocks]:
        if isinstance(block, Heading):
            out += ["#" * max(2, min(block.level, 6)) + " " + _md_text(block.text), ""]
        elif isinstance(block, Text):
            out += [_md_text(block.text), ""]
        elif isinstance(block, Code):
            fence = "`" * max(3, *(_longest_run(ln, "`") + 1 for ln in block.lines)) if block.lines else "```"
            out += [f"{fence}text", *block.lines, fence, ""]
        elif isinstance(block, Table):
            out += _md_table(block)
        elif isinstance(block, Figure):
            alt = _md_text(block.caption or block.name).replace("[", "(").replace("]", ")")
            out += [f"![{alt}]({block.path.name})", ""]
            if block.caption:
                out += [f"*{_md_text(block.caption)}*", ""]
    if report.skipped:
        out += ["## Skipped while parsing", ""]
        out += [f"- {_md_text(s)}" for s in report.skipped] + [""]
    return "\n".join(out)


def _md_table(tab: Table) -> list[str]:
    lines = [f"**{_md_text(tab.title)}** ({tab.name}.csv)", ""] if tab.title else []
    if not tab.rows:
        return [*lines, "_(no rows)_", ""]
    lines.append("| " + " | ".join(_md_cell(c) for c in tab.columns) + " |")
    lines.append("|" + "---|" * len(tab.columns))
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in tab.rows]
    return [*lines, ""]


_CSS = (
    "body{font-family:sans-serif;max-width:72em;margin:1em auto;padding:0 1em}h1{font-size:1.4em;margin:.3em 0}"
    "h2{font-size:1.15em;margin:.6em 0 .3em}"
    "table{border-collapse:collapse;margin:.4em 0}td,th{border:1px solid #ccc;padding:.1em .4em}"
    "th{background:#eee}td.num{text-align:right}.pass{color:#070}.FAIL{color:#b00}img{max-width:100%}"
    ".within{color:#070}.outside{color:#b00;font-weight:bold}.missing{color:#a60}td.src,td.hw{font-size:.8em}"
    ".status{font-size:1.1em;margin:.3em 0}.st-succeeded{color:#070}.st-bad{color:#b00}.st-unsure{color:#a60}"
    ".lead{display:flex;gap:1em;align-items:flex-start;flex-wrap:wrap}.lead figure{margin:0;display:table}"
    ".lead figcaption{display:table-caption;caption-side:bottom}"  # a caption wraps under its figure, never widens it
    ".lead img{max-height:300px}.lead table{font-size:.85em}.lead p{margin:.2em 0}figcaption{font-size:.85em}"
    "details{margin:.3em 0}summary{cursor:pointer}#verdicts table,#checks table{font-size:.9em}"
    "td.nw{white-space:nowrap}"
    "pre{background:#f6f6f6;padding:.5em;overflow-x:auto}"
)

SHOWN_VERDICTS = 8
"""Verdict rows shown unfolded (those not within tolerance first); the rest fold under them."""


def to_html(report: Report) -> str:
    """The first screen (1280x800): status, verdicts, checks, key figure and timeline; then the details, every
    table and log folded (``<details>``)."""
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{e(report.title)}</title><style>{_CSS}</style></head><body>", f"<h1>{e(report.title)}</h1>"]
    status = _status_text(report)
    if status:
        cls = {"good": "st-succeeded", "bad": "st-bad", "unsure": "st-unsure"}[
            headline_tone(report.status, report.verdicts)]
        out.append(f'<p id="status" class="status {cls}"><b>{e(report.status or "")}</b>'
                   f"{e(status[len(report.status or ''):])}</p>")
    if report.verdicts:
        out.append(f'<section id="verdicts"><h2>Verdicts</h2><p>{e(summary(report.verdicts))}</p>')
        order = sorted(range(len(report.verdicts)), key=lambda i: (report.verdicts[i].within is True, i))
        rows = _verdict_rows(report)
        shown, rest = order[:SHOWN_VERDICTS], order[SHOWN_VERDICTS:]
        hw = any(v.hardware for v in report.verdicts)
        out.append(_verdict_html([rows[i] for i in shown], [report.verdicts[i] for i in shown], hw))
        if rest:
            out.append(f"<details><summary>{len(rest)} more verdicts, all within tolerance</summary>"
                       + _verdict_html([rows[i] for i in rest], [report.verdicts[i] for i in rest], hw) + "</details>")
        out.append("</section>")
    if report.checks:
        out.append('<section id="checks"><h2>Checks</h2><table><tr><th>check</th><th>result</th><th>detail</th></tr>')
        for name, passed, detail in report.checks:
            v = _verdict(passed)
            out.append(f'<tr><td>{e(name)}</td><td class="{e(v)}">{e(v)}</td><td>{e(detail)}</td></tr>')
        out.append("</table></section>")
    if report.lead:
        out.append('<div class="lead" id="lead">')
        out += [f"<div>{_html_block(b, fold=False)}</div>" for b in _lead(report)]
        out.append("</div>")
    if report.blocks and report.fold and (report.verdicts or report.checks or report.lead):
        out.append('<h2 id="details">Details</h2>')
    for block in report.blocks:
        out.append(_html_block(block, fold=report.fold))
    if report.skipped:
        out.append(f"<details><summary>Skipped while parsing ({len(report.skipped)})</summary><ul>")
        out += [f"<li>{e(s)}</li>" for s in report.skipped]
        out.append("</ul></details>")
    out.append("</body></html>")
    return "\n".join(out)


def _verdict_html(rows: list[list[object]], verdicts: list[Verdict], hardware: bool = True) -> str:
    """The verdict rows; ``hardware``: with the hardware column (left out when no verdict names a difference)."""
    e = html.escape
    cls = {"within tolerance": "within", "outside tolerance": "outside", "not measured": "missing"}
    head = [h for h in VERDICT_HEAD if hardware or h != "hardware"]
    parts = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for row, v in zip(rows, verdicts, strict=True):
        cells = [f"<td>{e(fmt_cell(row[0]))}</td>"]
        cells += [f'<td class="num nw">{e(fmt_cell(c))}</td>' for c in row[1:4]]
        note = f' title="{e(v.note)}"' if v.note else ""
        cells.append(f'<td class="{cls[v.status]} nw"{note}>{e(v.status)}</td>')
        cells.append(f'<td class="nw">{e(str(row[5]))}</td>')
        cells.append((f'<td class="hw">{e(str(row[6]))}</td>' if hardware else "")
                     + f'<td class="src">{e(str(row[7]))}</td>')
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    return "\n".join(parts)


def _html_block(block: Block, fold: bool) -> str:
    """One block; with ``fold``, a table or a log is folded under a one-line summary."""
    e = html.escape
    if isinstance(block, Heading):
        lvl = max(2, min(block.level, 6))
        return f"<h{lvl}>{e(block.text)}</h{lvl}>"
    if isinstance(block, Text):
        return f"<p>{e(block.text)}</p>"
    if isinstance(block, Code):
        pre = "<pre>" + "\n".join(e(ln) for ln in block.lines) + "</pre>"
        return f"<details><summary>log ({plural(len(block.lines), 'line')})</summary>{pre}</details>" if fold else pre
    if isinstance(block, Table):
        if not fold:
            return _html_table(block)
        label = block.title or block.name
        return (f"<details><summary>{e(label)} ({e(block.name)}.csv, {plural(len(block.rows), 'row')})</summary>"
                + _html_table(block, title=False) + "</details>")
    if isinstance(block, Figure):
        return (f'<figure><img src="{e(block.path.name)}" alt="{e(block.caption or block.name)}">'
                f"<figcaption>{e(block.caption)}</figcaption></figure>")
    return ""


def _html_table(tab: Table, title: bool = True) -> str:
    e = html.escape
    parts = [f"<p><b>{e(tab.title)}</b> ({e(tab.name)}.csv)</p>"] if tab.title and title else []
    parts.append("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in tab.columns) + "</tr>")
    for row in tab.rows:
        cells = []
        for c in row:
            if isinstance(c, Link):
                cells.append(f'<td><a href="{e(c.href)}">{e(c.text)}</a></td>')
                continue
            cls = ' class="num"' if isinstance(c, int | float) and not isinstance(c, bool) else ""
            cells.append(f"<td{cls}>{e(fmt_cell(c))}</td>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    return "\n".join(parts)
