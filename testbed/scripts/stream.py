"""testbed collect: send files, each with the sha256 of the bytes sent, hashed while they are read (one pass).

usage: python3 stream.py RATE < NUL-terminated paths (or ``send`` called by the listing, which streams the files it
listed: testbed/scripts/listing.sh)
For each path, in order: a header of two big-endian int64 (size, mtime in s; size -1: unreadable, nothing
follows), then ``size`` bytes of the file, one status byte (0: read in full; 1: the file shrank while it was
read and zeros stand for the missing bytes) and the 32-byte sha256 of the bytes sent.
RATE: bytes per second not to exceed (0: no limit). Standard library only (it runs on the hosts).
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import time

TYPE_CHECKING = False  # typing costs 11 ms of start-up on the host
if TYPE_CHECKING:
    from typing import BinaryIO

CHUNK = 1 << 20


def send(paths: list[bytes], rate: float, out: BinaryIO) -> None:
    """Write each of ``paths`` to ``out`` as described above."""
    sent, t0 = 0, time.monotonic()
    for p in paths:
        try:
            f = open(p, "rb")  # noqa: SIM115
            st = os.fstat(f.fileno())
        except OSError:
            out.write(struct.pack("!qq", -1, 0))
            continue
        with f:
            out.write(struct.pack("!qq", st.st_size, int(st.st_mtime)))
            h, left, status = hashlib.sha256(), st.st_size, 0
            while left > 0:  # bounded: left shrinks by at least one byte a pass
                try:
                    b = f.read(min(left, CHUNK))
                except OSError:
                    b = b""
                if not b:
                    status, b = 1, bytes(min(left, CHUNK))
                h.update(b)
                out.write(b)
                left -= len(b)
                sent += len(b)
                if rate > 0:
                    ahead = sent / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        out.flush()
                        time.sleep(ahead)
            out.write(bytes([status]) + h.digest())
    out.flush()


if __name__ == "__main__":
    send(sys.stdin.buffer.read().split(b"\0")[:-1], float(sys.argv[1]) if len(sys.argv) > 1 else 0.0,
         sys.stdout.buffer)
