"""The set-up as the terminal shows it: a live per-host table while Ansible runs, and a summary at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from testbed.setup.events import EventAggregator, EventHandler, SetupResult
from testbed.textfmt import plural

if TYPE_CHECKING:
    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text


# --- progress display ------------------------------------------------------------------------------------
class SetupProgress:
    """A Rich renderable of the running set-up; pass ``handle`` as ``on_event`` and show it in a ``Live``."""

    def __init__(self, hosts: list[str], title: str = "setup", poll_seconds: float = 5):
        self.agg = EventAggregator(hosts)
        self.title = title
        self.poll_seconds = poll_seconds

    def handle(self, ev: dict[str, Any]) -> None:
        self.agg.handle(ev)

    def __rich__(self) -> Table | Group:
        return render_progress(self)


def render_progress(view: SetupProgress) -> Table | Group:
    """The live table: one row per host with its current task and running counts."""
    from rich.table import Table

    hosts, current, polls, task = view.agg.snapshot()
    elapsed = time.monotonic() - view.agg.started
    t = Table(title=f"{view.title}  ·  {task or 'starting'}  ·  {elapsed:.0f} s", title_justify="left",
              expand=False)
    t.add_column("host")
    t.add_column("task", overflow="ellipsis", max_width=60)
    for col in ("ok", "changed", "failed", "skipped"):
        t.add_column(col, justify="right")
    for name, h in hosts.items():
        now = current.get(name, "")
        if name in polls and now != "done":
            now = f"{now} (running {int(polls[name] * view.poll_seconds)} s)"
        style = "red" if h.failed or h.unreachable else ("yellow" if h.changed else "")
        if h.unreachable:
            now = f"UNREACHABLE: {h.error or ''}"
        elif h.failed:
            now = f"FAILED at {h.error_task}"
        t.add_row(name, now, str(h.ok), str(h.changed), str(h.failed), str(h.skipped), style=style)
    download = view.agg.download_line()
    if download:  # a role downloading on the controller (the wheelhouse): bytes, rate and time left
        from rich.console import Group
        from rich.text import Text

        return Group(t, Text(download, no_wrap=True, overflow="ellipsis"))
    return t


def render_summary(result: SetupResult) -> Text | Group:
    """The final table host x ok/changed/failed/unreachable, and each failed host's first error."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if not result.ran:
        held = [n for n in result.hosts if n in result.reasons]  # recorded without Ansible: their image holds it
        return Text(f"setup {result.testbed}: {result.plan}: skipped: unchanged on "
                    f"{plural(len(result.unchanged), 'host')}"
                    + (f"; set up already on {', '.join(held)} ({result.reasons[held[0]]}): recorded" if held else "")
                    + f" ({result.elapsed:.1f} s)", style="green")
    verdict = "would change" if result.check else "changed"
    t = Table(title=f"setup {result.testbed}: {result.plan}  ({result.elapsed:.1f} s"
                    f"{', check mode' if result.check else ''})", title_justify="left")
    t.add_column("host")
    for col in ("ok", verdict, "failed", "unreachable", "skipped"):
        t.add_column(col, justify="right")
    t.add_column("status")
    for name, h in result.hosts.items():
        style = {"failed": "red", "unreachable": "red", "stopped": "red", "changed": "yellow"}.get(h.status, "green")
        t.add_row(name, str(h.ok), str(h.changed), str(h.failed), str(h.unreachable), str(h.skipped),
                  Text(h.status, style=style))
    parts: list[Table | Text] = [t]
    for role, folder in result.overrides.items():
        parts.append(Text(f"note: role {role} is yours ({folder}), not the shipped one of that name", style="yellow"))
    if result.unchanged:
        parts.append(Text(f"skipped: unchanged on {plural(len(result.unchanged), 'host')}", style="green"))
    parts += _reasons(result)
    if result.partial:
        parts.append(Text(f"only {', '.join(result.partial_roles)} ran on {', '.join(result.partial)} (the roles that "
                          "depend on the other hosts); the rest was there already", style="green"))
    for name, changes in result.drift.items():
        again = "would be set again" if result.check else "now set again"
        parts.append(Text(f"drift on {name} (changed behind testbed's back, {again}): "
                          + "; ".join(changes[:10]) + (f"; ... {len(changes) - 10} more" if len(changes) > 10 else ""),
                          style="yellow"))
    stopped = [n for n, h in result.hosts.items() if h.status == "stopped"]
    if stopped:
        parts.append(Text(f"stopped on {', '.join(stopped)}: the play ended before it finished there (a failure "
                          "stopped it); not recorded as set up, the next set-up runs it there again", style="red"))
    for name, h in result.hosts.items():
        if h.error:
            parts.append(Text(f"{name}: {h.error_task or 'error'}: {h.error}", style="red"))
    if result.error:
        parts.append(Text(result.error, style="red"))
    return Group(*parts)


def _reasons(result: SetupResult) -> list[Text]:
    """Why Ansible ran where it ran: one line per reason, hosts whose earlier set-up did not finish first."""
    from rich.text import Text

    why: dict[str, list[str]] = {}
    for name, reason in result.reasons.items():
        if name not in result.unfinished:
            why.setdefault(reason, []).append(name)
    out = []
    if result.unfinished:
        again = "would run there again" if result.check else "ran there again"
        out.append(Text(f"an earlier set-up did not finish on {', '.join(result.unfinished)}: {again}",
                        style="yellow"))
    out += [Text(f"ran on {', '.join(names)}: {reason}") for reason, names in why.items()]
    return out


@contextmanager
def live(hosts: list[str], title: str, console: Console | None = None) -> Iterator[EventHandler]:
    """The live per-host view of a set-up on ``console`` while the block runs; yields its event handler."""
    from rich.console import Console
    from rich.live import Live

    view = SetupProgress(hosts, title=title)
    with Live(view, console=console or Console(), refresh_per_second=4, transient=True):
        yield view.handle
