"""``testbed new NAME --from README|URL`` (issue 38 item 7): the README reader (testbed.drafting, pure), the YAML
it writes (safe whatever the README holds), the folder the command writes, its refusals, the URL path (a local
http.server on 127.0.0.1), ``show``'s "to fill in", and the five seed READMEs drafted, shown and dry-run."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from testbed import drafting

ROOT = Path(__file__).resolve().parents[1]
SEEDS = Path("/work/shared/seeds")


def cli(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The real command line (one-message errors, exit codes)."""
    return subprocess.run([sys.executable, "-m", "testbed", *argv], cwd=home, capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TESTBED_HOME": str(home / ".testbed"),
                               "COLUMNS": "200"})


def invoke(*argv: str) -> Any:
    from testbed.cli.typer_app import app

    return CliRunner().invoke(app, list(argv), env={"COLUMNS": "200"}, prog_name="testbed")


def readme(*blocks: str, lang: str = "bash") -> str:
    return "# Artifact\n\nSome prose.\n\n" + "\n\n".join(f"```{lang}\n{b}\n```" for b in blocks) + "\n"


def line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


# --- the reader: each kind of line ------------------------------------------------------------------------------
def test_git_clone_and_checkout_pin_the_source() -> None:
    text = readme("git clone https://github.com/acme/Widget.git\ncd Widget\ngit checkout 0123abcd")
    d = drafting.draft(text)
    [s] = d.sources
    assert (s.name, s.repo, s.path, s.ref) == ("widget", "https://github.com/acme/Widget.git", "~/Widget", "0123abcd")
    assert (s.line, s.ref_line) == (line_of(text, "git clone"), line_of(text, "git checkout"))
    out = yaml.safe_load(drafting.to_yaml(d, "w"))
    assert out["sources"] == [{"name": "widget", "repo": "https://github.com/acme/Widget.git", "ref": "0123abcd",
                               "path": "~/Widget"}]


def test_a_branch_or_no_commit_is_a_todo_and_ssh_urls_become_https() -> None:
    d = drafting.draft(readme("git clone -b dev git@github.com:acme/a.git\ngit clone --recursive "
                              "https://gitlab.com/acme/b"))
    a, b = d.sources
    assert (a.repo, a.ref, b.ref, b.submodules) == ("https://github.com/acme/a.git", "dev", None, True)
    text = drafting.to_yaml(d, "w")
    todos = [t for _, t in drafting.todo_comments(text)]
    assert any("a branch or tag, not a commit" in t for t in todos)
    assert any("pin the commit (ref: COMMIT)" in t for t in todos)


@pytest.mark.parametrize(("line", "env"), [
    ("conda create -n emu python=3.10", "~/miniconda3/envs/emu"),
    ("conda create -p /opt/envs/x -y", "/opt/envs/x"),
    ("python3 -m venv vit_env", "~/vit_env"),
    ("/usr/bin/python3.8 -m venv --without-pip vit_env", "~/vit_env"),
    ("source ~/venvs/a/bin/activate", "~/venvs/a"),
])
def test_environment_lines(line: str, env: str) -> None:
    d = drafting.draft(readme(line))
    assert d.environment is not None and d.environment.value == env
    assert not d.steps  # making the environment is a set-up role's work, not a step


def test_installs_and_builds_are_prepare_steps_and_limits_and_reboots_are_todos() -> None:
    text = readme("sudo apt-get install -y libnuma-dev\npip install -r requirements.txt",
                  "cd src\nmake -j8\ncmake --build build",
                  "echo '* soft memlock unlimited' | sudo tee -a /etc/security/limits.conf\nsudo reboot")
    d = drafting.draft(text)
    install, build = d.steps
    assert install.name.startswith("install packages") and install.network
    assert install.run == "sudo apt-get install -y libnuma-dev\npip install -r requirements.txt\n"[:-1]
    assert build.name.startswith("build") and build.run.startswith("cd src\nmake -j8")
    assert [g.line for g in d.setup_todos] == [line_of(text, "limits.conf"), line_of(text, "sudo reboot")]
    out = yaml.safe_load(drafting.to_yaml(d, "w"))
    assert [s["needs"] for s in out["steps"]["prepare"] if "needs" in s] == [["network"]]


@pytest.mark.parametrize(("line", "program", "one"), [
    ("python train.py --epochs 3", "train.py", False),
    ("python3 -m torch.distributed.launch --nproc_per_node 8 train.py", "torch.distributed.launch", False),
    ("torchrun --nnodes 2 --nproc_per_node=8 main.py", "torchrun main.py", True),
    ("deepspeed --num_gpus 8 pretrain.py --deepspeed", "deepspeed pretrain.py", True),
    ("mpirun -np 5 --hostfile hosts.txt --mca btl tcp,self ./entry.sh", "mpirun ./entry.sh", True),
    ("docker run --gpus all acme/img python x.py", "docker run", False),
    ("bash scripts/run_eval.sh", "scripts/run_eval.sh", False),
])
def test_launch_lines(line: str, program: str, one: bool) -> None:
    [ln] = drafting.draft(readme(line)).launches
    assert (ln.program, ln.one_launcher) == (program, one)


def test_a_repeated_launch_line_is_one_variant_and_a_guessed_folder_a_todo() -> None:
    d = drafting.draft(readme("git clone https://h/dep\ngit clone https://h/art", "python a.py\npython a.py",
                              "cd art\npython b.py -x NCCL_PROTO"))
    a, b = d.launches
    assert (a.cwd, b.cwd) == ("~/dep", "~/art")  # a block starts in the first source unless it cds into one
    assert a.todo is not None and "check the folder" in a.todo and b.todo is None


def test_not_launch_lines() -> None:
    d = drafting.draft(readme("python main.py -h\npython setup.py install\npython\nbash scripts/build_env.sh"))
    assert not d.launches and len(d.steps) == 1


def test_prompts_comments_continuations_and_cd() -> None:
    text = readme("$ cd fault_injection\n$ python3 run.py \\\n    --file x.csv  # a comment\nsome output line",
                  lang="console")
    [ln] = drafting.draft(text).launches
    assert ln.command == "python3 run.py --file x.csv  # a comment" and ln.cwd == "fault_injection"
    assert ln.line == line_of(text, "python3 run.py")


@pytest.mark.parametrize(("line", "hosts"), [("python3 main.py --num-nodes 2 --rank 0", 2),
                                             ("mpirun -np 5 --hostfile h ./a.sh", 5), ("python x.py", 1)])
def test_the_host_count_a_launch_line_names(line: str, hosts: int) -> None:
    text = readme(line)
    written = drafting.to_yaml(drafting.draft(text), "w")
    assert yaml.safe_load(written)["requires"] == {"hosts": 1}  # the draft plans on any testbed; the TODO says
    row = next(ln for ln in written.splitlines() if ln.startswith("requires:"))
    assert (f"(README.md:{line_of(text, line)} starts {hosts} ranks: a host each?)" in row) == (hosts > 1), row


def test_addresses_ranks_and_world_size_become_templates() -> None:
    got = drafting.template("python3 main.py --master-ip 10.128.0.14 --num-nodes 2 --rank 0 --hostfile h.txt")
    assert got == ("python3 main.py --master-ip {{ master_addr }} --num-nodes {{ world_size }} --rank {{ rank }} "
                   "--hostfile {{ hostfile }}")


@pytest.mark.parametrize(("line", "outs"), [
    ("python a.py -o results.csv", ["results.csv"]),
    ("python a.py --output=out/run.json --log_dir logs/", ["out/run.json", "logs/**"]),
    ("python a.py --save_dir ckpt > train.log 2>&1", ["ckpt/**", "train.log"]),
    ("python a.py | tee /tmp/run_$RUN.txt", ["/tmp/run_*.txt"]),
    ("python a.py --output /", []),  # a whole disk: a TODO, never an output
])
def test_outputs_from_the_files_launch_lines_write(line: str, outs: list[str]) -> None:
    d = drafting.draft(readme(line))
    assert [g.value for g in d.outputs] == outs
    assert any("cannot be collected" in t for t, _ in d.todos) == (not outs)


def test_files_the_prose_after_a_launch_names() -> None:
    text = ("# A\n\n```\npython3 detection.py --check\n```\n\nThese two commands generate two files: "
            "`train_recorder_no_check.txt` and `train_recorder_check.txt`, with `detection.py` and the `logs` folder."
            "\n\n## Next\n\nIt writes `other.txt`.\n")
    d = drafting.draft(text)
    assert [g.value for g in d.outputs] == ["train_recorder_no_check.txt", "train_recorder_check.txt"]


def test_prose_naming_the_file_a_command_writes_is_an_output_with_placeholders_as_globs() -> None:
    text = "# A\n\n```\ncd fi\npython3 r.py --file x/TARGET_INJECTION\n```\n\nThis command generates a " \
           "`replay_inj_TARGET_INJECTION.txt` file.\n"
    d = drafting.draft(text)
    assert [g.value for g in d.outputs] == ["fi/replay_inj_*.txt"]
    assert d.launches[0].todo is not None and "TARGET_INJECTION" in d.launches[0].todo


def test_expected_output_blocks_become_reference_stubs() -> None:
    text = ("# A\n\nYou should see this output:\n\n```\naccuracy 0.91\nloss 0.2\n```\n\n```bash\nnvcc --version\n"
            "# expect:\n# release 11.8\n```\n")
    d = drafting.draft(text)
    assert [(g.line, g.value) for g in d.expected] == [(6, "accuracy 0.91\nloss 0.2"), (12, "release 11.8")]
    written = drafting.to_yaml(d, "w", expected_files=["expected/README-6.txt", "expected/README-12.txt"])
    stubs = [t for _, t in drafting.todo_comments(written) if t.startswith("TODO reference stub")]
    assert len(stubs) == 2 and "expected/README-6.txt" in stubs[0]
    assert "references" not in yaml.safe_load(written)  # a stub is commented out until its table is named


def test_every_guess_cites_its_readme_line() -> None:
    text = readme("git clone https://github.com/acme/w\ncd w\npython x.py -o out.csv")
    written = drafting.to_yaml(drafting.draft(text), "w")
    for key, needle in (("repo:", "git clone"), ("command:", "python x.py"), ("- ~/w/out.csv", "python x.py")):
        row = next(ln for ln in written.splitlines() if ln.strip().startswith(key))
        assert f"# from README.md:{line_of(text, needle)}" in row, row


# --- the YAML is safe whatever the README holds ---------------------------------------------------------------
HOSTILE = readme(
    "git clone 'https://example.com/a: b\\n!!python/object/apply:os.system [\"id\"]'",
    "python run.py --name '{{ 7 * 7 }}' --x '{% if 1 %}y{% endif %}' --k 'a: b' --t '!!python/name:os.system' "
    "--v ${HOME} -o 'out/{a,b}'",
    "python2 evil.py --a '{% endraw %}{{ 7 * 7 }}'",
    "pip install 'x\x1b[31m'\nmake '#not-a-comment'",
)


def test_a_hostile_readme_yields_safe_loadable_yaml(tb_home: Path) -> None:
    from testbed import suite as suite_mod

    d = drafting.draft("# Title: {{ 1 }} !!python/object\r\n" + HOSTILE)
    written = drafting.to_yaml(d, "hostile")
    assert "\x1b" not in written and "\r" not in written
    data = yaml.safe_load(written)  # a safe loader: no tag builds an object
    assert data["name"] == "hostile" and data["sources"][0]["repo"].startswith("https://example.com/a: b")
    folder = tb_home / "experiments" / "hostile"
    folder.mkdir(parents=True)
    (folder / "suite.yml").write_text(written)
    s = suite_mod.load_suite("hostile")  # ${HOME} is not expanded by the loader: the README wrote $HOME
    command = suite_mod.render(s.steps.launch.command, {"launch": "run"}, where="launch")
    assert "--name '{{ 7 * 7 }}'" in command and "--x '{% if 1 %}y{% endif %}'" in command
    assert "--v $HOME" in command and "49" not in command
    assert any("endraw" in t for t, _ in d.todos)  # the line that could close the raw block is left to the user
    assert "out/{a,b}" not in str(s.outputs)  # braces are no glob collect honours: a TODO instead


FRAGMENTS = ["```", "```bash\n", "```console\n", "\n```\n", "$ ", "git clone https://h/r", "git checkout ", "cd ",
             "python ", "x.py", " -o ", " > ", "{{", "}}", "{%", "%}", "endraw", "${A}", "$B", ": ", "#", "# expect:",
             "'", '"', "\\", "\n", "\r", "\t", "\x00", "\x1b", "\x85", "\u2028", "\ufeff", "!!python/object", "&a",
             "*a", "- ", "? ", "|", ">", "mpirun -np 2 ", "conda create -n ", "pip install ", "make", "sudo reboot",
             "TARGET_X", "[YOUR]", "~/", "/", "..", "**", "generates a `", "`", "docker run ", "-b ", "null", "é"]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=60))
def test_any_readme_drafts_to_yaml_that_reads_back(parts: list[str]) -> None:
    """Whatever the README holds (Unicode line breaks, control characters, YAML and Jinja syntax), the draft is
    written and reads back as written (to_yaml proves it), and its TODO comments are found."""
    d = drafting.draft("".join(parts))
    written = drafting.to_yaml(d, "fz", expected_files=[f"expected/README-{g.line}.txt" for g in d.expected])
    data = yaml.safe_load(written)
    assert data["name"] == "fz" and "command" in data["steps"]["launch"]
    assert drafting.todo_comments(written)


# --- the command ------------------------------------------------------------------------------------------------
def test_new_writes_the_folder_and_show_lists_its_todos(tb_home: Path) -> None:
    (tb_home / "README.md").write_text(readme("git clone https://github.com/acme/w\ncd w\npython x.py -o o.csv",
                                              "```\nok\n```"))
    r = invoke("new", "mine")
    assert r.exit_code == 0, r.output
    folder = tb_home / "experiments" / "mine"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "suite.yml"]
    assert "README.md" in (folder / "README.md").read_text()
    shown = invoke("show", "mine")
    assert shown.exit_code == 0, shown.output
    as_json = json.loads(invoke("show", "mine", "--json").stdout)
    assert [t["todo"] for t in as_json["to_fill_in"]] == [t for _, t in
                                                          drafting.todo_comments((folder / "suite.yml").read_text())]
    body = shown.output.split("to fill in: ", 1)[1]
    todos = drafting.todo_comments((folder / "suite.yml").read_text())
    assert body.startswith(f"{len(todos)} TODOs") and todos
    for n, text in todos:
        assert f"experiments/mine/suite.yml:{n}: {text}" in body


def test_a_skeleton_without_a_readme_and_a_folder_elsewhere(tb_home: Path) -> None:
    r = invoke("new", "bare", "--to", "elsewhere")
    assert r.exit_code == 0, r.output
    suite = tb_home / "elsewhere" / "bare" / "suite.yml"
    assert "with no README (a skeleton)" in (suite.parent / "README.md").read_text()
    shown = invoke("show", str(suite))
    assert shown.exit_code == 0 and "TODO the launch command" in shown.output, shown.output
    assert not (tb_home / "experiments").exists()


def test_show_lists_the_todos_of_any_suite_and_none_for_a_finished_one(tb_home: Path) -> None:
    (tb_home / "experiments").mkdir()
    (tb_home / "experiments" / "hand.yml").write_text(
        "name: hand\nsteps:\n  launch:\n    command: |\n      echo hi  # TODO not a comment of the file\n"
        "timeouts: {run: 60}  # TODO how long it really takes\n")
    r = invoke("show", "hand")
    assert r.exit_code == 0, r.output
    assert "to fill in: 1 TODO\n" in r.output and "hand.yml:6: TODO how long it really takes" in r.output
    assert "to fill in" not in invoke("show", "fault-drill").output


def test_rehearse_lists_what_is_left_before_any_host(tb_home: Path) -> None:
    (tb_home / "README.md").write_text(readme("python x.py"))
    assert invoke("new", "d").exit_code == 0
    todos = drafting.todo_comments((tb_home / "experiments" / "d" / "suite.yml").read_text())
    r = cli(tb_home, "rehearse", "d")
    assert r.returncode == 1 and "would fail before any host" in r.stdout, (r.stdout, r.stderr)
    for n, text in todos:
        assert f"experiments/d/suite.yml:{n}: left to fill in: {text}" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr and not (tb_home / ".testbed").exists()  # no replica, no state


def test_refusals_write_nothing(tb_home: Path) -> None:
    (tb_home / "big.md").write_bytes(b"x" * (drafting.MAX_README_BYTES + 1))
    (tb_home / "bin.md").write_bytes(b"\xff\xfe")
    (tb_home / "experiments" / "taken").mkdir(parents=True)
    (tb_home / "experiments" / "single.yml").write_text("name: single\n")
    cases = [(("new", "Bad_Name"), "is not a suite name"), (("new", "taken"), "already exists"),
             (("new", "single"), "single.yml already exists"),
             (("new", "x", "--from", "big.md"), "a README is read up to"),
             (("new", "x", "--from", "bin.md"), "not UTF-8"), (("new", "x", "--from", "nope.md"), "no such file"),
             (("new", "x", "--from", "file:///etc/passwd"), "only http:// and https://"),
             (("new", "x", "--from", "ftp://127.0.0.1/README.md"), "only http:// and https://"),
             (("new", "x", "--to", "experiments/single.yml"), "cannot make experiments/single.yml/x")]
    for argv, said in cases:
        r = cli(tb_home, *argv)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
    assert sorted(p.name for p in (tb_home / "experiments").iterdir()) == ["single.yml", "taken"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """An http.server on 127.0.0.1 serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, directory=str(www), **k)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_readme_by_url(tb_home: Path, server: str) -> None:
    www = tb_home / "www"
    (www / "README.md").write_text(readme("git clone https://github.com/acme/w\ncd w\ngit checkout abcdef1\n"
                                          "python x.py --log_dir logs"))
    (www / "huge.md").write_bytes(b"#" * (drafting.MAX_README_BYTES + 10))
    r = invoke("new", "byurl", "--from", f"{server}/README.md")
    assert r.exit_code == 0, r.output
    written = (tb_home / "experiments" / "byurl" / "suite.yml").read_text()
    assert f"from {server}/README.md" in written.splitlines()[0]
    assert yaml.safe_load(written)["outputs"] == ["~/w/logs/**"]
    for path, said in (("huge.md", "larger than 1024 KiB"), ("missing.md", "HTTP 404")):
        r2 = cli(tb_home, "new", "other", "--from", f"{server}/{path}")
        assert r2.returncode == 2 and said in r2.stderr and "Traceback" not in r2.stderr, r2.stderr
    dead = cli(tb_home, "new", "other", "--from", "http://127.0.0.1:9/README.md")  # nothing listens on port 9
    assert dead.returncode == 2 and "could not fetch the README" in dead.stderr
    assert not (tb_home / "experiments" / "other").exists()


# --- the five seed READMEs ----------------------------------------------------------------------------------------
SEED_FILES = sorted(SEEDS.glob("0*.txt")) if SEEDS.is_dir() else []


@pytest.mark.skipif(not SEED_FILES, reason="the seed READMEs (/work/shared/seeds) are not on this machine")
def test_the_seed_readmes_draft_show_and_dry_run(tb_home: Path) -> None:
    assert len(SEED_FILES) == 5
    for i, seed in enumerate(SEED_FILES):
        name = f"seed{i}"
        r = invoke("new", name, "--from", str(seed))
        assert r.exit_code == 0, r.output
        shown = invoke("show", name)
        assert shown.exit_code == 0 and re.search(r"to fill in: \d+ TODOs", shown.output), shown.output
        dry = invoke("run", name, "--dry-run", "--on", "local")
        assert dry.exit_code == 0, dry.output
        assert "left to fill in" in dry.output  # the warning points at what is left


ARTIFACTS = Path("/work/shared/artifacts")


@pytest.mark.skipif(not SEED_FILES, reason="the seed READMEs (/work/shared/seeds) are not on this machine")
@pytest.mark.parametrize("repositories", [False, True])
def test_the_agreement_figures_in_the_docs_are_the_bench_output(repositories: bool) -> None:
    if repositories and not ARTIFACTS.is_dir():
        pytest.skip("the artifacts' archives (/work/shared/artifacts) are not on this machine")
    argv = [str(SEEDS)] + (["--repositories", str(ARTIFACTS)] if repositories else [])
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "new_agreement.py"), *argv], capture_output=True,
                       text=True, timeout=300, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    table = r.stdout.strip()
    assert table.count("\n") == 7 and "| **all** |" in table, table  # a header, a rule, 5 suites, all
    for page in ("README.md", "docs/suites.md"):
        assert table in (ROOT / page).read_text(), f"{page}: the agreement table is not bench/new_agreement.py's"
