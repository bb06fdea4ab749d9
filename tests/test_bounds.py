"""Every input is bounded before work starts, and one name is one thing (issue 42).

Files that are not regular UTF-8 files of bounded size, template bombs, rank counts, specs that would take over
another testbed's record, and the names that must agree with the code that uses them (log files, built-in template
variables). A hang is bounded by the pytest timeout; each check asserts the refusal and its message.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testbed.errors import UsageError

SUITE = "name: s\nsteps:\n  launch:\n    command: 'true'\n"


# --- files ---------------------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    from testbed.spec import load_testbed
    from testbed.suite import load_suite

    fifo = tmp_path / "pipe.yml"
    os.mkfifo(fifo)
    for load in (load_testbed, load_suite):
        with pytest.raises(UsageError) as ei:
            load(str(fifo))
        assert "it is a FIFO, not a regular file" in ei.value.what and ei.value.where == str(fifo)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_refused_unread(device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.spec import load_testbed
    from testbed.suite import load_suite

    (tmp_path / "inventories").mkdir()
    (tmp_path / "experiments").mkdir()
    (tmp_path / "inventories" / "dev.yml").symlink_to(device)
    (tmp_path / "experiments" / "dev.yml").symlink_to(device)
    monkeypatch.chdir(tmp_path)
    for load in (load_testbed, load_suite):
        with pytest.raises(UsageError) as ei:
            load("dev")
        assert "it is a device, not a regular file" in ei.value.what


@pytest.mark.timeout(30)
def test_a_huge_file_is_refused_by_its_size(tmp_path: Path) -> None:
    from testbed.suite import load_suite
    from testbed.yamlfile import MAX_FILE_BYTES

    big = tmp_path / "big.yml"
    with big.open("w") as f:
        f.write(SUITE)
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing is written, the size is what counts
    with pytest.raises(UsageError) as ei:
        load_suite(str(big))
    assert f"it is {MAX_FILE_BYTES + 1:,} bytes; a spec or suite is at most {MAX_FILE_BYTES:,}" in ei.value.what


def test_bytes_that_are_not_utf8_are_refused_at_their_line(tmp_path: Path) -> None:
    from testbed.spec import load_testbed

    p = tmp_path / "latin.yml"
    p.write_bytes(b"provider: {kind: local}\ndescription: caf\xe9\n")
    with pytest.raises(UsageError) as ei:
        load_testbed(str(p))
    assert "it is not UTF-8 text (byte 41, 0xe9)" in ei.value.what and ei.value.where == f"{p}:2"
    assert ei.value.fix == "save the file as UTF-8 text"


# --- templates -----------------------------------------------------------------------------------------------------
BOMBS = [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
    ("{% for i in range(10**5) %}{% for j in range(10**5) %}{% for k in range(10**5) %}{% endfor %}{% endfor %}"
     "{% endfor %}", "steps"),
    ("{{ 'x' * 10**9 }}", "repeating a str"),
    ("{{ ['x' * 2**20] * 2**20 }}", "repeating a list"),
    ("{{ 'a' | center(10**9) }}", "center's width"),
    ("{{ 'a'.center(10**9) }}", "center's width"),
    ("{{ 'a'.rjust(10**9) }}", "rjust's width"),
    ("{{ '1'.zfill(10**9) }}", "zfill's width"),
    ("{{ 'a' | indent(10**9, true) }}", "indent's width"),
    ("{{ [1] | batch(10**9, 0) | list }}", "batch's linecount"),
    ("{{ [1] | slice(10**9) | list }}", "slice's slices"),
    ("{{ '%1000000000d' % 1 }}", "a format width"),
    ("{{ '%*d' % (10**9, 1) }}", "a format width"),
    ("{{ '%1000000000d' | format(1) }}", "a format width"),
    ("{{ '{:>1000000000}'.format(1) }}", "a format width"),
    ("{{ '{:>{}}'.format(1, 10**9) }}", "a format width"),
    ("{{ range(100000) | join('x' * 100000) }}", "join would make"),
    ("{{ ('a' * 2**20).replace('a', 'bb') }}", "replace would make"),
    ("{{ 'a\tb'.expandtabs(10**9) }}", "may not call str.expandtabs"),
    ("{{ lipsum(10**9) }}", "lipsum"),
    ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}", "steps"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
     "more than 1,048,576 characters or items"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
     "{{ ns.s | length }}", "more than 1,048,576 characters or items"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = (ns.s ~ '-') ~ ns.s %}{% endfor %}"
     "{{ ns.s[:3] }}", "more than 1,048,576 characters or items"),
    ("{% set x %}{% for i in range(100000) %}{{ 'y' * 1000000 }}{% endfor %}{% endset %}{{ x | length }}",
     "characters or items in all"),
    ("{% for i in range(100000) %}" + "z" * 1000 + "{% endfor %}", "characters or items"),
    ("{% set ns = namespace(x=7) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x }}",
     "digits"),
    ("{{ 9 ** (9 ** 9) }}", "digits"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("template", "why"), BOMBS, ids=[b[0][:50] for b in BOMBS])
@pytest.mark.parametrize("shell", [True, False])
def test_a_template_bomb_is_refused_by_a_bound(template: str, why: str, shell: bool) -> None:
    from testbed.suite import render

    with pytest.raises(UsageError) as ei:
        render(template, {}, shell=shell, where="s: steps.launch.command", at="s.yml:7")
    assert why in ei.value.what, ei.value.what
    assert ei.value.where == "s.yml:7" and "Traceback" not in ei.value.render()


GOOD = [
    ("{% for i in range(3) %}{{ i }},{% endfor %}", "0,1,2,"),
    ("{{ '%05d' | format(42) }} {{ '{:>4}'.format(7) }} {{ 'a'.center(5, '-') }}", "00042    7 --a--"),
    ("{{ range(4) | join(',') }} {{ ['a', 'b'] | map('upper') | join }} {{ 'x-y'.split('-') | last }}", "0,1,2,3 AB y"),
    ("{{ '%d' % 12345678901234 }} {{ 2 ** 64 }} {{ seed * 1000003 }}",
     "12345678901234 18446744073709551616 4294977884895"),
    ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ n }}{% endif %}{% endmacro %}{{ f(5) }}", "12345"),
    ("{{ 'a' ~ 1 ~ ('b' ~ 'c') }}", "a1bc"),
]


@pytest.mark.parametrize(("template", "out"), GOOD)
def test_ordinary_templates_render_as_before(template: str, out: str) -> None:
    from testbed.suite import render

    assert render(template, {"seed": 4294965}, shell=False) == out


# --- ranks ---------------------------------------------------------------------------------------------------------
def _suite(text: str, tmp_path: Path) -> object:
    from testbed.suite import load_suite

    p = tmp_path / "s.yml"
    p.write_text(text)
    return load_suite(str(p))


@pytest.mark.timeout(120)
def test_relaunches_of_many_faults_are_counted_before_they_are_planned(tmp_path: Path) -> None:
    from testbed.run.plan import MAX_RANK_COMMANDS, build_plan, testbed_info

    faults = "".join(f"  f{i}: {{action: signal, rank: 0, at: 1}}\n" for i in range(40))
    suite = _suite("name: s\nplacement: {hosts: 64}\nsteps:\n  launch: {command: 'echo {{ rank }}', "
                   "ranks_per_host: 16}\n  recovery:\n    - relaunch: true\n"
                   f"faults:\n{faults}default_faults: [{', '.join(f'f{i}' for i in range(40))}]\n", tmp_path)
    with pytest.raises(UsageError) as ei:
        build_plan(suite, testbed_info(None, dry_run=True, min_hosts=64), {})  # type: ignore[arg-type]
    assert "would plan 1,639,424 rank commands (1,024 ranks x 1,601 launches and relaunches)" in ei.value.what
    assert f"at most {MAX_RANK_COMMANDS:,}" in ei.value.what and ei.value.where.endswith("s.yml:5")


# --- one name, one thing -------------------------------------------------------------------------------------------
def test_log_keys_agree_with_the_supervisors_log_names() -> None:
    """Two steps the suite lets through write two log files; two it refuses would have written one."""
    from testbed.run.supervisor import step_log_name
    from testbed.suite import log_key

    names = ["build all", "build/all", "build_all", "a b", "a_b", "x..y", "ümlaut", "repair technique/replay.py"]
    for a in names:
        for b in names:
            same_log = step_log_name("prepare", a, "node0") == step_log_name("prepare", b, "node0")
            assert same_log == (log_key(a) == log_key(b)), (a, b)


def test_builtins_name_every_variable_a_plan_gives_templates(tmp_path: Path) -> None:
    """``BUILTINS`` (what a parameter or var may not be named) holds every name the plan puts beside them."""
    from testbed.run.plan import _scope, testbed_info
    from testbed.suite import BUILTINS, resolve_params

    suite = _suite("name: s\nparameters:\n  n: {type: int, default: 1}\nvars:\n  v: '{{ n }}'\n"
                   "steps:\n  launch: {command: 'echo {{ n }}'}\n", tmp_path)
    params = resolve_params(suite, {})  # type: ignore[arg-type]
    sc = _scope(suite, testbed_info(None, dry_run=True), params, "r1", [], None)  # type: ignore[arg-type]
    per_rank = {"rank", "local_rank", "host", "address", "host_hardware"}
    assert set(sc.base) - {"n", "v"} | per_rank <= set(BUILTINS)
    from testbed.suite import _env

    assert set(_env(True).globals) <= set(BUILTINS)


def _lab(name: str | None, address: str = "127.0.0.1") -> str:
    return (f"name: {name}\n" if name else "") + \
        f"provider:\n  kind: lab\n  hosts:\n    - {{name: a, address: {address}, port: 9}}\n"


def test_a_spec_named_like_another_spec_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.resolved import Resolved
    from testbed.state import Store

    (tmp_path / "inventories").mkdir()
    (tmp_path / "inventories" / "one.yml").write_text(_lab(None))
    (tmp_path / "inventories" / "two.yml").write_text(_lab("one", "127.0.0.2"))
    monkeypatch.chdir(tmp_path)
    st = Store(tmp_path / "state.db")
    with pytest.raises(UsageError) as ei:
        Resolved.open("two", st)
    assert "two spec files are testbed 'one'" in ei.value.what
    assert ei.value.where == f"{tmp_path / 'inventories' / 'two.yml'}:1"


@pytest.mark.parametrize("renamed", [True, False])
def test_a_spec_cannot_take_over_the_record_of_another_provider(renamed: bool, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.resolved import Resolved
    from testbed.state import Store

    (tmp_path / "inventories").mkdir()
    spec = tmp_path / "inventories" / ("mine.yml" if renamed else "lease.yml")
    spec.write_text(_lab("lease" if renamed else None))
    monkeypatch.chdir(tmp_path)
    st = Store(tmp_path / "state.db")
    st.upsert_testbed("lease", "chameleon", "/elsewhere/lease.yml", "up", {"lease_id": "L1"})
    with pytest.raises(UsageError) as ei:
        Resolved.open(spec.stem, st)
    assert "testbed 'lease' is recorded as a chameleon testbed provisioned from /elsewhere/lease.yml" in ei.value.what
    assert f"{spec} (lab) would take over its record" in ei.value.what
    assert st.testbed("lease")["provider"] == "chameleon"  # type: ignore[index]


def test_a_spec_of_its_own_record_still_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.resolved import Resolved
    from testbed.state import Store

    (tmp_path / "inventories").mkdir()
    spec = tmp_path / "inventories" / "lab1.yml"
    spec.write_text(_lab(None))
    monkeypatch.chdir(tmp_path)
    st = Store(tmp_path / "state.db")
    st.upsert_testbed("lab1", "lab", str(spec), "up", {})
    tb = Resolved.open("lab1", st)
    assert tb.name == "lab1" and tb.record is not None and tb.spec is not None


def test_a_step_on_a_group_with_no_host_in_the_run_runs_nowhere_and_never_widens(tb_home: Path) -> None:
    """A one-host point of a suite whose post step is aimed at 'workers' (tesla with gpus=1): the step runs on no
    host -- not refused, and never widened to the testbed's other hosts; the launch aimed there is refused."""
    from testbed.run import runner

    (tb_home / "experiments").mkdir(exist_ok=True)
    (tb_home / "experiments" / "onew.yml").write_text(
        "name: onew\nplacement:\n  hosts: 1\nsteps:\n  prepare:\n    - run: echo worker\n      on: workers\n"
        "  launch:\n    command: 'true'\n  post:\n    - run: echo done\n      on: workers\n")
    plan = runner.plan_run("onew", "local", {}, dry_run=True)
    assert [h.name for h in plan.hosts] == ["node0"]
    assert plan.prepare[0].hosts == [] and plan.post[0].hosts == [] and plan.ranks[0].host == "node0"


def test_poll_summary_counts_the_polls_longer_than_the_pause() -> None:
    """The supervisor's last log line on its polls: median and slowest, and how many outran ``timeouts.poll``."""
    from testbed.run.supervisor import PollTimes

    def poll_summary(times: list[tuple[int, float]], interval: float) -> str:
        pt = PollTimes()
        for hosts, seconds in times:
            pt.add(hosts, seconds)
        return pt.summary(interval)

    line = poll_summary([(1024, 0.8), (1024, 1.6), (1024, 2.5), (3, 0.1), (1, 0.05)], 1.0)
    assert line == ("polls: 5 polls of up to 1024 hosts: median 1.600 s over the 3 polls of 1,024, slowest 2.500 s; "
                    "2 of 5 longer than the 1 s between polls (timeouts.poll)")
    assert poll_summary([(1, 0.2)], 0.5).startswith("polls: 1 poll of up to 1 host: median 0.200 s over the 1 poll")
    many = poll_summary([(2, 2.0)] * (PollTimes.KEEP + 5), 1.0)  # a long run: bounded, and says so
    assert many.endswith(f"{PollTimes.KEEP:,} of the last {PollTimes.KEEP:,} longer than the 1 s between polls "
                         "(timeouts.poll)"), many
