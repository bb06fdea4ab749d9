"""The first second of a command on a terminal: until the command itself writes anything, a live line on stderr
says that it is starting and for how long (its imports and state take seconds on a loaded machine), so no start
is silent. Cleared, and out of the way, at the command's first write. Standard library only: it runs before the
command's own imports."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

DELAY = 0.7
"""Seconds of silence before the line is shown (a command that answers sooner never shows it)."""
TICK = 0.5


class _Stream:
    """``stream`` as the command sees it: its first write clears the starting line first."""

    def __init__(self, stream: TextIO, starting: Starting) -> None:
        self._stream, self._starting = stream, starting

    def write(self, text: str) -> int:
        self._starting.stop()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        if name == "buffer":  # bytes written past this stream: the line goes first all the same
            self._starting.stop()
        return getattr(self._stream, name)


class Starting:
    """The live ``… testbed VERB: starting (N s)`` line, shown while the command has written nothing."""

    def __init__(self, what: str) -> None:
        self.what, self.t0 = what, time.monotonic()
        self.lock, self.done, self.shown = threading.Lock(), threading.Event(), False
        self.out, self.err = sys.stdout, sys.stderr
        # kept here as well as in sys: print() holds sys.stdout without a reference of its own while it writes, and
        # the first write hands the real stream back (the stand-in must outlive that write)
        self.streams = (_Stream(self.out, self), _Stream(self.err, self))
        sys.stdout, sys.stderr = self.streams
        threading.Thread(target=self._tick, name="starting-line", daemon=True).start()

    @classmethod
    def maybe(cls, argv: list[str]) -> Starting | None:
        """One for a command run on a terminal (not for completion, --help or a bare ``testbed``)."""
        words = [a for a in argv[1:] if not a.startswith("-")]
        if not words or "_TESTBED_COMPLETE" in os.environ or {"--help", "-h"} & set(argv[1:]):
            return None
        try:
            if not sys.stderr.isatty():
                return None
        except (AttributeError, ValueError, OSError):
            return None
        import atexit

        starting = cls(f"testbed {' '.join(words[:2])}")
        atexit.register(starting.stop)  # a command that ends without a word leaves no line behind
        return starting

    def _tick(self) -> None:
        wait = DELAY
        while not self.done.wait(wait):
            with self.lock:
                if self.done.is_set():
                    return
                self.err.write(f"\r\x1b[2K\x1b[2m… {self.what}: starting ({time.monotonic() - self.t0:.0f} s)\x1b[0m")
                self.err.flush()
                self.shown = True
            wait = TICK

    def stop(self) -> None:
        """Clear the line (when shown) and hand the streams back; at the command's first write, and at its end."""
        if self.done.is_set():
            return
        with self.lock:
            if self.done.is_set():
                return
            self.done.set()
            if self.shown:
                self.err.write("\r\x1b[2K")
                self.err.flush()
            sys.stdout, sys.stderr = self.out, self.err
