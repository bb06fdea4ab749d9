"""``testbed new`` is safe whatever the README says (issue 51 items 5-7): a destructive or piped-to-shell command
is a TODO with its reason, never a step (testbed.hazards, the classifier); a draft ``show`` would refuse is
refused; a shipped suite's name needs --override-shipped; the folder appears whole or not at all (a real full
tmpfs, then the retry)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from testbed import drafting
from testbed.hazards import hazard

ROOT = Path(__file__).resolve().parents[1]

DESTRUCTIVE = [
    "rm -rf ~", "rm -rf /", "sudo rm -rf --no-preserve-root /", "rm -fr ~/", "rm -r -f $HOME", 'rm -rf "$HOME"/*',
    "rm -rf ${HOME}", "rm -rf /*", "rm -rf ~/.*", "rm -rf $BUILD/", "rm -rf $PREFIX/*", "sudo rm -rf /usr",
    "rm -rf /tmp/../", "rm -rf ~/..", "/bin/rm -rf /etc", "rm -rf $X/etc", "env FOO=1 nohup rm -rf /",
    "find / -name '*.log' -delete", "find ~ -type f -exec rm {} +", "chmod -R 777 /", "sudo chown -R me /usr",
    "mv ~ /tmp/x", "dd if=/dev/zero of=/dev/sda bs=1M", "sudo dd if=x.img of=/dev/nvme0n1", "mkfs.ext4 /dev/sdb",
    "sudo mkfs -t xfs /dev/sdb", "wipefs -a /dev/sda", "echo hi > /dev/sda", "cat d.img | sudo tee /dev/sdb",
    "echo b > /proc/sysrq-trigger", "shutdown -h now", "poweroff", "sudo init 0", "systemctl poweroff", "halt",
    "kill -9 -1", "kill -- -1", ":(){ :|:& };:", "echo $(rm -rf ~)", "cd x && rm -rf ~",
]
PIPED = [
    "curl -fsSL https://get.example.com/install.sh | sh", "wget -O- https://x.org/s.sh | sudo bash",
    "wget -qO - https://x | sudo -E bash -", "curl -sSL x | python3 -", "curl x | gunzip | sh", "curl -s x|bash",
    "curl x | bash -s -- --yes", "wget -O - url | busybox sh", 'sh -c "$(curl -fsSL https://x/install.sh)"',
    "bash <(curl -s https://x)", 'eval "$(wget -qO- x)"', ". <(curl x)", "source <(curl -L x)",
    'python3 -c "$(curl -fsSL https://x)"', 'bash <<< "$(curl x)"',
]
HARMLESS = [
    "rm -rf build", "rm -rf ~/w/build", "rm -rf ./out", "rm -rf $HOME/.cache/pip", "rm -rf ${OUT:?}/",
    "rm -rf $DIR/build", "dd if=/dev/zero of=test.img bs=1M count=10", "python train.py > /dev/null 2>&1",
    "curl -O https://x/data.tgz", "wget https://x/d.tgz -O - | tar xz", "curl api | python -m json.tool",
    "curl x | python parse.py", "VERSION=$(curl -s api/latest)", "kill -1 1234", "kill -HUP 22",
    "pip install -r requirements.txt", "bash install.sh", "chmod +x run.sh", "chown -R me ~/w", "mv a b",
    "cp a.img /tmp/b.img", "echo 3 | sudo tee /proc/sys/vm/drop_caches", "find . -name '*.pyc' -delete",
    "curl -fsSL x -o get.sh && sh get.sh", "python3 main.py --rank 0 | tee out.log",
]


@pytest.mark.parametrize("command", DESTRUCTIVE + PIPED)
def test_the_classifier_names_why_a_command_is_not_copied(command: str) -> None:
    found = hazard(command)
    assert found is not None and found.reason.startswith("it "), command
    assert (found.kind == "download") == (command in PIPED), (command, found)


@pytest.mark.parametrize("command", HARMLESS)
def test_the_classifier_lets_ordinary_commands_through(command: str) -> None:
    assert hazard(command) is None


def test_a_draft_never_copies_a_hazard_into_a_step() -> None:
    lines = ["git clone https://github.com/acme/w", "cd w", "pip install -r requirements.txt", *DESTRUCTIVE,
             *PIPED, "make -j8", "python train.py -o out.csv"]
    text = "# A\n\n```bash\n" + "\n".join(lines) + "\n```\n"
    d = drafting.draft(text)
    written = drafting.to_yaml(d, "w")
    data = yaml.safe_load(written)
    copied = "\n".join(s["run"] for s in data["steps"]["prepare"]) + data["steps"]["launch"]["command"]
    assert "pip install" in copied and "make -j8" in copied and "train.py" in copied
    for cmd in DESTRUCTIVE + PIPED:
        assert cmd not in copied.splitlines(), cmd
    todos = [t for _, t in drafting.todo_comments(written)]
    for cmd in DESTRUCTIVE + PIPED:
        n = 4 + lines.index(cmd)
        said = [t for t in todos if f"(from README.md:{n})" in t]
        assert said and "not copied into a step" in said[0] and "because it " in said[0], (cmd, said)


def test_a_reboot_stays_a_set_up_todo_and_a_source_never_clones_into_home() -> None:
    text = "# A\n\n```bash\ngit clone https://h/r .\nsudo shutdown -r now\npython x.py\n```\n"
    d = drafting.draft(text)
    assert [g.line for g in d.setup_todos] == [5] and "reboot" in d.setup_todos[0].value
    assert [s.path for s in d.sources] == ["~/r"]
    assert any("clones https://h/r into '.'" in t for t, _ in d.todos)


def cli(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed", *argv], cwd=home, capture_output=True, text=True,
                          timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(home / ".testbed"),
                               "COLUMNS": "400"})


def test_a_shipped_suites_name_is_refused_unless_overridden(tb_home: Path) -> None:
    for argv in (("new", "jitc"), ("new", "tesla", "--to", "elsewhere")):
        r = cli(tb_home, *argv)
        assert r.returncode == 2 and "is the name of a suite testbed ships" in r.stderr, r.stderr
        assert "--override-shipped" in r.stderr and "Traceback" not in r.stderr
    assert not (tb_home / "experiments").exists() and not (tb_home / "elsewhere").exists()
    r = cli(tb_home, "new", "jitc", "--override-shipped")
    assert r.returncode == 0, r.stderr
    assert (tb_home / "experiments" / "jitc" / "suite.yml").is_file()
    shown = cli(tb_home, "show", "jitc")  # the user's draft, which hides the shipped one here, as asked
    assert shown.returncode == 0 and "experiments/jitc/suite.yml" in shown.stdout, shown.stdout


def test_a_draft_show_would_refuse_is_refused_and_nothing_is_written(tb_home: Path) -> None:
    body = "\n".join(f"python a{i}.py" for i in range(60_000))  # 60,000 launch variants: a draft over 1 MiB
    (tb_home / "big.md").write_text("# Big\n\n```bash\n" + body + "\n```\n")
    assert (tb_home / "big.md").stat().st_size <= drafting.MAX_README_BYTES
    r = cli(tb_home, "new", "big", "--from", "big.md")
    assert r.returncode == 2, r.stderr
    assert "testbed new writes no suite that testbed show would refuse" in r.stderr and "Traceback" not in r.stderr
    assert not (tb_home / "experiments").exists() or list((tb_home / "experiments").iterdir()) == []


def test_the_loader_is_the_judge_of_what_is_written(tb_home: Path) -> None:
    """write_folder loads the written suite as show would: what the loader refuses never gets its name."""
    from testbed.cli.newsuite import write_folder
    from testbed.errors import UsageError

    folder = tb_home / "experiments" / "bad"
    with pytest.raises(UsageError, match="the draft would not load") as e:
        write_folder(folder, {"suite.yml": "name: bad\nsteps: {launch: {command: x}}\nno_such_key: 1\n"}, "README.md")
    assert e.value.where == "README.md"
    assert list((tb_home / "experiments").iterdir()) == []  # no half-made folder, no temporary one either
    write_folder(folder, {"suite.yml": "name: bad\nsteps: {launch: {command: x}}\n", "expected/a.txt": "1\n"}, "x")
    assert (folder / "expected" / "a.txt").read_text() == "1\n"


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs (root only), nearly filled."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        (mnt / "filler").write_bytes(b"\0" * 56 * 1024)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_leaves_nothing_and_the_retry_works(tb_home: Path, full_disk: Path) -> None:
    steps = "\n".join(f"pip install package-number-{i}" for i in range(600))  # a suite.yml of about 20 KB
    (tb_home / "README.md").write_text(f"# A\n\n```bash\ngit clone https://h/r\n{steps}\npython x.py\n```\n")
    r = cli(tb_home, "new", "art", "--to", str(full_disk))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "No space left on device" in r.stderr and "run the same command again" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # no empty suite.yml, no temporary folder
    (full_disk / "filler").unlink()
    again = cli(tb_home, "new", "art", "--to", str(full_disk))
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load((full_disk / "art" / "suite.yml").read_text())["name"] == "art"
