"""Role arguments: every role's meta/argument_specs.yml, and the check of the variables given to roles against it
(profiles, testbed specs, extra variables) before any host is touched; the same verdicts as Ansible's own check."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import DEFAULT_TYPE_VALIDATORS

from testbed import setup
from testbed.errors import UsageError
from testbed.hosts import Host

ROLES = Path(__file__).resolve().parent.parent / "playbooks" / "roles"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "tasks" / "main.yml").is_file())


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _template(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, list):
        return any(map(_template, value))
    if isinstance(value, dict):
        return any(map(_template, value.values()))
    return False


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TESTBED_HOME", str(tmp_path / ".testbed"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "playbooks" / "profiles").mkdir(parents=True)
    return tmp_path


def _profile(home: Path, name: str, text: str) -> Path:
    p = home / "playbooks" / "profiles" / f"{name}.yml"
    p.write_text(text)
    return p


def _refused(name: str) -> UsageError:
    with pytest.raises(UsageError) as e:
        setup.load_profile(name)
    return e.value


# --- the spec files ------------------------------------------------------------------------------------------
def _check_option(role: str, name: str, opt: dict[str, Any]) -> None:
    assert set(opt) <= {"type", "elements", "choices", "required", "default", "description", "options"}, (role, name)
    assert opt.get("type") in DEFAULT_TYPE_VALIDATORS, (role, name, opt.get("type"))
    assert opt.get("description"), (role, name)
    if "elements" in opt:
        assert opt["type"] == "list" and opt["elements"] in DEFAULT_TYPE_VALIDATORS, (role, name)
    if "choices" in opt:
        assert isinstance(opt["choices"], list) and opt["choices"], (role, name)
    if "options" in opt:
        assert opt["type"] == "dict" or opt.get("elements") == "dict", (role, name)
        for k, sub in opt["options"].items():
            _check_option(role, f"{name}.{k}", sub)
    assert not (opt.get("required") and "default" in opt), (role, name)  # Ansible refuses both


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_role_declares_its_arguments(role: str) -> None:
    """Ansible's role argument format; the defaults are defaults/main.yml's; required ones have none there."""
    spec = _yaml(ROLES / role / "meta" / "argument_specs.yml")
    assert set(spec) == {"argument_specs"} and set(spec["argument_specs"]) == {"main"}, role
    main = spec["argument_specs"]["main"]
    assert main.get("short_description") and main.get("description") and main.get("options"), role
    options = main["options"]
    defaults = _yaml(ROLES / role / "defaults" / "main.yml") or {}
    derived = _yaml(ROLES / role / "vars" / "main.yml") or {}
    for name, opt in options.items():
        assert name.startswith(role + "_"), (role, name)
        _check_option(role, name, opt)
        if opt.get("required"):
            assert name not in defaults, (role, name)
        else:
            assert name in defaults and opt.get("default") == defaults[name], (role, name)
    assert set(defaults) <= set(options), (role, set(defaults) - set(options))
    assert not set(derived) & set(options), role  # derived values are not settings
    assert setup.role_variables(role) == frozenset(options)


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_role_defaults_fit_their_specs(role: str) -> None:
    """What the role runs with when nothing is given passes both Ansible's check and ours."""
    spec = setup.role_spec(role)
    defaults = _yaml(ROLES / role / "defaults" / "main.yml") or {}
    plain = {k: v for k, v in defaults.items() if not _template(v)}
    assert ArgumentSpecValidator({k: spec[k] for k in plain}).validate(plain).error_messages == []
    setup.check_role_vars(defaults, [role], "defaults")


def _defined_by_tasks(node: Any, out: set[str]) -> None:
    """Names a task list makes: register, set_fact, task vars, loop_var."""
    if isinstance(node, list):
        for x in node:
            _defined_by_tasks(x, out)
    elif isinstance(node, dict):
        if "register" in node:
            out.add(node["register"])
        for key in ("ansible.builtin.set_fact", "vars"):
            if isinstance(node.get(key), dict):
                out |= set(node[key])
        if isinstance(node.get("loop_control"), dict) and "loop_var" in node["loop_control"]:
            out.add(node["loop_control"]["loop_var"])
        for key in ("block", "rescue", "always"):
            _defined_by_tasks(node.get(key), out)


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_variable_a_role_uses_is_declared_and_every_declared_one_used(role: str) -> None:
    spec = set(setup.role_spec(role))
    derived = set(_yaml(ROLES / role / "vars" / "main.yml") or {})
    used, made = set(), set()
    for f in sorted((ROLES / role).rglob("*")):
        if not f.is_file() or f.suffix not in (".yml", ".j2") or f.parent.name == "meta":
            continue
        text = f.read_text()
        if f.parent.name == "defaults":  # the values only: a default may use another setting
            text = "\n".join(map(str, (_yaml(f) or {}).values()))
        used |= set(re.findall(rf"\b{role}_[a-z0-9_]+\b", text))
        made |= set(re.findall(r"template_vars=\{'([a-z0-9_]+)'", text))
        if f.parent.name in ("tasks", "handlers"):
            _defined_by_tasks(_yaml(f), made)
    modules = {p.stem for p in (ROLES / role / "library").glob("*.py")}  # the role's own modules are no variables
    assert used - spec - derived - made - modules == set(), role
    assert spec - used == set(), role


# --- the check agrees with Ansible's -----------------------------------------------------------------------
CANDIDATES: list[Any] = [
    "x", "", "3", 3, 0, -1, 2.5, "2.5", True, False, "yes", "no", "True", "False", "true", "auto", "venv", "a,b",
    [], ["a"], [1, 2], [True], [["a"]], [{"k": 1}], {}, {"a": 1}, {"a": [1]}, "a=1", None, "stage", "ed25519",
    ["venv", "conda"], [{"name": "n", "url": "u", "dest": "d"}], [{"name": "n", "url": "u"}],
    [{"name": "n", "url": "u", "dest": "d", "shaa256": ""}],
    [{"name": "n", "url": "u", "dest": "d", "folder": "maybe"}],
    [{"name": "n", "url": "u", "dest": "d", "folder": "yes", "via_controller": 0}],
]


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_verdicts_agree_with_ansibles_role_argument_validation(role: str) -> None:
    """For every option and many values, refused here exactly when Ansible's ArgumentSpecValidator (what runs at
    role start) refuses: we neither let through what Ansible stops nor stop what it takes."""
    for name, opt in setup.role_spec(role).items():
        for value in CANDIDATES:
            theirs = ArgumentSpecValidator({name: opt}).validate({name: value}).error_messages
            try:
                setup.check_role_vars({name: value}, [role], "test")
                ours = None
            except UsageError as e:
                ours = e.what
            assert bool(ours) == bool(theirs), (name, value, theirs, ours)


# --- profiles ----------------------------------------------------------------------------------------------
def test_shipped_profiles_pass_and_templates_are_left_to_ansible(home: Path) -> None:
    for name in setup.available_profiles():
        setup.load_profile(name)
    _profile(home, "ok", "vars:\n  python_env_wheelhouse: true\n  source_build_github_https: false\n"
                         "  mpi_slots: '4'\n  tesla_repo: https://example.org/x.git\n"
                         "roles:\n  - role: python_env\n    vars:\n      python_env_python: python3.11\n"
                         "      python_env_pip_packages: \"{{ pkgs }}\"\n"
                         "      python_env_kind: \"{{ 'conda' if big else 'venv' }}\"\n"
                         "      python_env_dotenv: {A: 1}\n")
    assert setup.load_profile("ok").steps[0].vars["python_env_pip_packages"] == "{{ pkgs }}"


def test_a_misspelt_variable_is_refused_even_without_the_role_prefix(home: Path) -> None:
    path = _profile(home, "typo", "include: [base]\nvars:\n  memlok_limit: unlimited\nroles: [memlock]\n")
    e = _refused("typo")
    assert e.what == "role 'memlock' has no variable 'memlok_limit'"
    assert e.where == f"{path}:3" and "did you mean 'memlock_limit'" in (e.fix or "")
    assert "meta/argument_specs.yml" in (e.fix or "")
    # a name near no role variable is the user's own (a template's input): left alone
    _profile(home, "own", "vars:\n  my_dataset_root: /data\nroles: [memlock]\n")
    assert setup.load_profile("own").vars == {"my_dataset_root": "/data"}


def test_wrong_type_bad_choice_and_derived_name_are_refused_with_their_line(home: Path) -> None:
    path = _profile(home, "types", "roles:\n  - role: mpi\n    vars:\n      mpi_check: true\n      mpi_slots: many\n")
    e = _refused("types")
    assert e.what == "role 'mpi': mpi_slots must be a whole number, not a string ('many')"
    assert e.where == f"{path}:5" and "Slots per host" in (e.fix or "")
    path = _profile(home, "choice", "roles:\n  - role: source_build\n    vars:\n      source_build_artifact: wheels\n")
    e = _refused("choice")
    assert "source_build_artifact is 'wheels', not one of stage, wheel, none" in e.what
    assert e.where == f"{path}:4" and "did you mean 'wheel'" in (e.fix or "")
    _profile(home, "derived", "roles:\n  - role: python_env\n    vars:\n      python_env_pip_args: --pre\n")
    assert "derived by the role (vars/main.yml)" in _refused("derived").what
    _profile(home, "listof", "vars:\n  dataset_items:\n    - ~/data/a.tar\nroles: [dataset]\n")
    e = _refused("listof")
    assert "dataset_items[0] must be a mapping" in e.what and e.where and e.where.endswith("listof.yml:3")
    _profile(home, "null", "vars:\n  python_env_pip_packages:\nroles: [python_env]\n")
    assert "python_env_pip_packages must be a list of strings, not empty" in _refused("null").what


def test_items_with_declared_keys_are_checked_key_by_key(home: Path) -> None:
    head = "roles:\n  - role: dataset\n    vars:\n      dataset_items:\n"
    item = "        - name: a\n          url: http://x/a\n          dest: ~/a\n"
    path = _profile(home, "key", head + item + item.replace("/a", "/b") + "          sha265: '00'\n")
    e = _refused("key")
    assert e.what == "role 'dataset': dataset_items[1] has no key 'sha265'"
    assert e.where == f"{path}:11" and "did you mean 'sha256'" in (e.fix or "")
    _profile(home, "nourl", head + "        - name: a\n          dest: ~/a\n")
    assert _refused("nourl").what == "role 'dataset': dataset_items[0] lacks url"
    _profile(home, "folder", head + item + "          folder: maybe\n")
    assert "dataset_items[0].folder must be true or false" in _refused("folder").what


def test_profile_sections_of_the_wrong_shape_are_refused(home: Path) -> None:
    _profile(home, "shape", "vars: [a, b]\nroles: [mpi]\n")
    assert "vars: must be a mapping" in _refused("shape").what
    _profile(home, "inc", "include: base\nroles: [mpi]\n")
    assert "include: and roles: lists" in _refused("inc").what


# --- required variables, extra variables, apply ----------------------------------------------------------
def test_a_required_variable_nobody_sets_is_refused(home: Path) -> None:
    plan = setup.resolve_plan(roles=["source_build"])
    with pytest.raises(UsageError) as e:
        setup.check_plan(plan)
    assert e.value.what == ("role 'source_build' needs source_build_name, source_build_repo, source_build_steps, "
                            "which nothing sets")
    assert e.value.where == "--role source_build" and "--var" in (e.value.fix or "")
    setup.check_plan(plan, {"source_build_name", "source_build_repo", "source_build_steps"})
    path = _profile(home, "half", "roles:\n  - role: memlock\n  - role: source_build\n"
                                  "    vars: {source_build_name: x, source_build_steps: [make]}\n")
    with pytest.raises(UsageError) as e:
        setup.check_plan(setup.load_profile("half"))
    assert "needs source_build_repo" in e.value.what and e.value.where == f"{path}:3"
    setup.check_plan(setup.load_profile("half"), {"source_build_repo"})  # e.g. from the testbed spec's vars


def test_apply_refuses_bad_role_variables_before_touching_hosts(home: Path) -> None:
    from testbed.state import Store

    st = Store(home / ".testbed" / "state.db")
    (home / "inventories").mkdir()
    (home / "inventories" / "tb.yml").write_text("provider: {kind: local, hosts: 2, subnet: 10.213.151.0/24}\n"
                                                 "vars:\n  gpu_check_min_gpus: '2'\n")
    st.upsert_testbed("tb", "local", str(home / "inventories" / "tb.yml"), "up")
    st.set_hosts("tb", [Host("node0", "10.213.151.2"), Host("node1", "10.213.151.3")])
    with pytest.raises(UsageError, match="needs source_build_name"):
        setup.apply("tb", roles=["source_build"])
    with pytest.raises(UsageError) as e:
        setup.apply("tb", roles=["mpi"], extra_vars={"mpi_slots": "two"})
    assert "mpi_slots must be a whole number" in e.value.what and e.value.where == "extra variables (--var)"
    (home / "inventories" / "tb.yml").write_text("provider: {kind: local, hosts: 2, subnet: 10.213.151.0/24}\n"
                                                 "vars:\n  gpu_check_min_gpus: two\n")
    with pytest.raises(UsageError) as e:
        setup.apply("tb", roles=["gpu_check"])
    assert "gpu_check_min_gpus must be a whole number" in e.value.what and e.value.where.endswith("tb.yml:3")
    assert not (home / ".testbed" / "ansible" / "runs").exists()


def test_memlock_reboots_from_a_handler_only_when_its_file_changed() -> None:
    tasks = _yaml(ROLES / "memlock" / "tasks" / "main.yml")
    handlers = _yaml(ROLES / "memlock" / "handlers" / "main.yml")
    assert not any("ansible.builtin.reboot" in t for t in tasks)  # no inline reboot
    reboot = next(h for h in handlers if "ansible.builtin.reboot" in h)
    writes = next(t for t in tasks if "ansible.builtin.template" in t)
    assert writes["notify"] == reboot["name"] and reboot["when"] == "memlock_reboot | bool"
    flush = [i for i, t in enumerate(tasks) if t.get("ansible.builtin.meta") == "flush_handlers"]
    check = [i for i, t in enumerate(tasks) if "ansible.builtin.shell" in t]  # ulimit -l in a new session
    assert flush and check and flush[0] < check[0]  # the reboot comes before the check


def test_a_role_of_ones_own_without_a_spec_uses_its_defaults_and_a_broken_spec_is_refused(home: Path) -> None:
    from testbed.errors import TestbedError

    role = home / "playbooks" / "roles" / "mytool"
    (role / "tasks").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "tasks" / "main.yml").write_text("- ansible.builtin.debug: {msg: hi}\n")
    (role / "defaults" / "main.yml").write_text("mytool_level: 3\n")
    assert setup.role_variables("mytool") == {"mytool_level"}
    _profile(home, "mine", "roles:\n  - role: mytool\n    vars: {mytool_level: anything}\n")
    assert setup.load_profile("mine").steps[0].vars == {"mytool_level": "anything"}  # untyped without a spec
    _profile(home, "mistyped", "roles:\n  - role: mytool\n    vars: {mytool_levle: 4}\n")
    assert "did you mean 'mytool_level'" in (_refused("mistyped").fix or "")
    (role / "meta").mkdir()
    (role / "meta" / "argument_specs.yml").write_text("argument_specs:\n  main:\n    options: [mytool_level]\n")
    with pytest.raises(TestbedError) as e:
        setup.load_profile("mine")
    assert "no argument_specs.main.options mapping" in e.value.what
    assert e.value.where == str(role / "meta" / "argument_specs.yml")


def test_build_script_echoes_each_step_without_running_it(tmp_path: Path) -> None:
    """The source build's script prints each step before running it: the printed copy never expands ``$(...)``,
    backticks or variables, so a step's command substitution runs once, not twice."""
    import subprocess

    import jinja2
    from ansible.plugins.filter.core import FilterModule

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(FilterModule().filters())
    template = env.from_string((ROLES / "source_build" / "templates" / "build.sh.j2").read_text())
    count = tmp_path / "count"
    step = f'echo x >> {count}; echo "$(echo x >> {count}; echo sub)" `echo tick` "$HOME" \'q\''
    script = template.render(source_build_name="s", source_build_commit="c", source_build_dest=str(tmp_path),
                             source_build_env={}, source_build_pre_steps=[], source_build_steps=[step],
                             source_build_artifact="none")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, check=True).stdout
    assert count.read_text() == "x\nx\n"  # the step's own two appends, none from its echo
    assert f"+ {step}\n" in out
