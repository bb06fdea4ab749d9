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
    assert sum("node0 r" in ln for ln in shown) == 8 and "2 more ranks" in shown[-1]


def test_a_suite_progress_pattern_must_be_a_regex() -> None:
    import pytest
    from pydantic import ValidationError

    base = {"name": "p", "steps": {"launch": {"command": "true"}}}
    assert Suite.model_validate({**base, "progress": r"step (\d+)"}).progress == r"step (\d+)"
    with pytest.raises(ValidationError, match="not a regular expression"):
        Suite.model_validate({**base, "progress": "step ("})


# --- downloads during set-up --------------------------------------------------------------------------------
def _wheel(folder, name: str = "bigdata", size: int = 3 * 1024 * 1024):  # type: ignore[no-untyped-def]
    """A real (installable) wheel of ``size`` bytes of incompressible data, and its file name."""
    import base64
    import hashlib
    import os
    import zipfile

    fname = f"{name}-1.0-py3-none-any.whl"
    files = {f"{name}/__init__.py": b"", f"{name}/blob.bin": os.urandom(size),
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                           b"Tag: py3-none-any\n"}

    def digest(b: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()

    record = "".join(f"{p},sha256={digest(b)},{len(b)}\n" for p, b in files.items())
    record += f"{name}-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(folder / fname, "w", zipfile.ZIP_STORED) as z:
        for p, b in files.items():
            z.writestr(p, b)
        z.writestr(f"{name}-1.0.dist-info/RECORD", record)
    return fname


def test_pip_downloads_are_read_as_bytes_of_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real pip download (`--progress-bar raw`, as the wheelhouse task runs it) from an index on 127.0.0.1,
    read back as file, bytes and size."""
    import functools
    import http.server
    import subprocess
    import sys
    import threading

    from testbed.setup.events import describe_download, read_download

    root = tmp_path / "index"
    (root / "simple" / "bigdata").mkdir(parents=True)
    fname = _wheel(root)
    (root / "simple" / "bigdata" / "index.html").write_text(f'<a href="../../{fname}">{fname}</a>')

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "progress.log"
        with out.open("w") as f:
            subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--no-cache-dir",
                            "--disable-pip-version-check", "--progress-bar", "raw", "--index-url",
                            f"http://127.0.0.1:{srv.server_port}/simple", "-d", str(tmp_path / "wh"), "bigdata"],
                           stdout=f, stderr=subprocess.PIPE, check=True, timeout=120)
    finally:
        srv.shutdown()
    size = (root / fname).stat().st_size
    d = read_download(out.read_text())
    assert d is not None and d.file == fname and d.done == d.total == size and d.files_done == 0
    first = type(d)(file=fname, done=size // 4, total=size, at=10.0)
    d.at = 11.0
    line = describe_download(d, first)
    assert line.startswith(f"downloading {fname}: ") and "/s" in line
    half = type(d)(file=fname, done=size // 2, total=size, at=11.0)
    assert "s left" in describe_download(half, first)


def test_a_second_file_counts_the_first_as_done() -> None:
    from testbed.setup.events import read_download

    text = ("Collecting a\n  Downloading a-1.whl (2.0 MB)\nProgress 1000000 of 2000000\nProgress 2000000 of 2000000\n"
            "Collecting b\n  Downloading https://host/x/b-2.whl (1.0 MB)\nProgress 500 of 1000000\n")
    d = read_download(text)
    assert d is not None and d.file == "b-2.whl" and d.files_done == 1 and d.bytes_before == 2000000
    assert d.bytes_all == 2000500
    assert read_download("Looking in indexes: x\nCollecting a\n") is None


def test_the_setup_view_shows_a_download_while_it_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The watcher reads the progress file a role writes on the controller and the live set-up table shows it;
    a new task clears it."""
    import time

    from testbed.cli.setup_view import SetupProgress, render_progress
    from testbed.setup import _DownloadWatch

    view = SetupProgress(["node0"])
    log = tmp_path / "progress.log"
    log.write_text("")
    watch = _DownloadWatch(log, view.handle)
    watch.every = 0.05
    watch.start()
    try:
        log.write_text("Collecting torch\n  Downloading torch-2.13.0-cp311-none-any.whl (190.2 MB)\n"
                       "Progress 50000000 of 190200000\n")
        deadline = time.monotonic() + 10
        while view.agg.download_line() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
    con = Console(record=True, width=120, color_system=None)
    con.print(render_progress(view))
    assert "downloading torch-2.13.0-cp311-none-any.whl: 50.0 MB of 190.2 MB" in con.export_text()
    view.handle({"event": "playbook_on_task_start", "event_data": {"task": "next"}})
    assert view.agg.download_line() is None


def test_copies_to_the_hosts_are_read_from_rsync_as_bytes_of_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The push role's copies (a label line, then a real rsync's --info=progress2 output per host) are shown as one
    line over every host while they run: bytes of their size, the rate and the time left; a new task clears it."""
    import os
    import subprocess
    import time

    from testbed.cli.setup_view import SetupProgress, render_progress
    from testbed.setup import _DownloadWatch
    from testbed.setup.events import describe_download, read_copies

    src = tmp_path / "wheels"
    src.mkdir()
    (src / "a.whl").write_bytes(os.urandom(3_000_000))
    (src / "b.whl").write_bytes(os.urandom(1_000_000))
    log = tmp_path / "progress.log"
    log.write_text("")
    view = SetupProgress(["node0", "node1"])
    watch = _DownloadWatch(log, view.handle)
    watch.every = 0.05
    watch.start()
    try:
        for host in ("node0", "node1"):
            out = tmp_path / f"progress.log.copy-{host}"
            out.write_text("the wheelhouse\n")
            with out.open("a") as f:
                subprocess.run(["rsync", "-rts", "--itemize-changes", "--info=progress2", f"{src}/",
                                f"{tmp_path / host}/"], stdout=f, check=True, timeout=60)
        deadline = time.monotonic() + 10  # until the watch has read both copies to their end (it reads every 0.05 s)
        while "to 2 hosts: 8.0 MB of 8.0 MB" not in (view.agg.download_line() or "") and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
    d = read_copies([(tmp_path / f"progress.log.copy-{h}").read_text() for h in ("node0", "node1")])
    assert d is not None and d.done == d.total == 8_000_000 and d.file == "the wheelhouse to 2 hosts", d
    con = Console(record=True, width=120, color_system=None)
    con.print(render_progress(view))
    assert "copying the wheelhouse to 2 hosts: 8.0 MB of 8.0 MB" in con.export_text(), con.export_text()
    half = type(d)(file=d.file, done=4_000_000, total=8_000_000, at=1.0, verb="copying")
    first = type(d)(file=d.file, done=1_000_000, total=8_000_000, at=0.0, verb="copying")
    assert describe_download(half, first) == "copying the wheelhouse to 2 hosts: 4.0 MB of 8.0 MB, 3.0 MB/s, 2 s left"
    assert read_copies(["the wheelhouse\n"]) is None  # nothing moved yet: no line
    view.handle({"event": "playbook_on_task_start", "event_data": {"task": "next"}})
    assert view.agg.download_line() is None


def test_a_copy_with_nothing_to_move_shows_no_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """rsync of files the host holds already: its progress says 0 bytes, 100 %; that is not a copy to show."""
    import subprocess

    from testbed.setup.events import read_copies

    src = tmp_path / "wheels"
    src.mkdir()
    (src / "a.whl").write_bytes(b"x" * 1000)
    texts = []
    for _ in range(2):  # the second rsync finds the file there
        r = subprocess.run(["rsync", "-rts", "--itemize-changes", "--info=progress2", f"{src}/", f"{tmp_path / 'h'}/"],
                           capture_output=True, text=True, check=True, timeout=60)
        texts.append("the wheelhouse\n" + r.stdout)
    first = read_copies(texts[:1])
    assert first is not None and first.done == 1000
    assert read_copies(texts[1:]) is None, texts[1]
