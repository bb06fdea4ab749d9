"""Markdown and self-contained HTML renderings of a Report (figures referenced as sibling PNGs)."""

from __future__ import annotations

import html
import math

from testbed.report.model import Cell, Code, Figure, Heading, Link, Report, Table, Text, Timestamp
from testbed.report.tidy_csv import _verdict


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


def to_markdown(report: Report) -> str:
    out: list[str] = [f"# {_md_text(report.title)}", ""]
    for block in report.blocks:
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
    if report.checks:
        out += ["## Checks", ""]
        out += _md_table(Table("checks", ["check", "result", "detail"],
                               [[n, _verdict(p), d] for n, p, d in report.checks]))
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
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .5em}"
    "th{background:#eee}td.num{text-align:right}.pass{color:#070}.FAIL{color:#b00}img{max-width:100%}"
    "pre{background:#f6f6f6;padding:.5em;overflow-x:auto}"
)


def to_html(report: Report) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{e(report.title)}</title><style>{_CSS}</style></head><body>", f"<h1>{e(report.title)}</h1>"]
    for block in report.blocks:
        if isinstance(block, Heading):
            lvl = max(2, min(block.level, 6))
            out.append(f"<h{lvl}>{e(block.text)}</h{lvl}>")
        elif isinstance(block, Text):
            out.append(f"<p>{e(block.text)}</p>")
        elif isinstance(block, Code):
            out.append("<pre>" + "\n".join(e(ln) for ln in block.lines) + "</pre>")
        elif isinstance(block, Table):
            out.append(_html_table(block))
        elif isinstance(block, Figure):
            out.append(f'<figure><img src="{e(block.path.name)}" alt="{e(block.caption or block.name)}">'
                       f"<figcaption>{e(block.caption)}</figcaption></figure>")
    if report.checks:
        out.append("<h2>Checks</h2><table><tr><th>check</th><th>result</th><th>detail</th></tr>")
        for name, passed, detail in report.checks:
            v = _verdict(passed)
            out.append(f'<tr><td>{e(name)}</td><td class="{e(v)}">{e(v)}</td><td>{e(detail)}</td></tr>')
        out.append("</table>")
    if report.skipped:
        out.append("<h2>Skipped while parsing</h2><ul>")
        out += [f"<li>{e(s)}</li>" for s in report.skipped]
        out.append("</ul>")
    out.append("</body></html>")
    return "\n".join(out)


def _html_table(tab: Table) -> str:
    e = html.escape
    parts = [f"<p><b>{e(tab.title)}</b> ({e(tab.name)}.csv)</p>"] if tab.title else []
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
