"""Every exit status testbed's commands end with: one enum, read by the CLI, the errors and the run records.

The scripts testbed places on hosts (``testbed/scripts/``, the local hosts' init) run without the package and keep
their own numbers."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """An exit status and what it means (``docs/commands.md`` lists them)."""

    OK = 0
    """Done: what was asked for happened (a run succeeded, a campaign finished with every point succeeded)."""
    FAILED = 1
    """It ran and failed: a run or a host failed, a check found a provider not usable, a report a failed run."""
    USAGE = 2
    """Bad input, refused before any host was touched (a dry run of a run the testbed would refuse, too)."""
    STOPPED = 3
    """Ended before its end on purpose: a run stopped, a campaign paused by its budget (run it again to resume)."""
    TIMED_OUT = 124
    """A run that hit ``timeouts.run`` (as ``timeout(1)`` exits)."""
    INTERRUPTED = 130
    """Ctrl-C: what was started goes on or is recorded as interrupted; the message says how to go on."""
