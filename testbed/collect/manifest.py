"""Provenance: ``results/<suite>/<run-id>/manifest.json`` of a collected run.

The manifest records what ran (suite, parameters), where (testbed, provider, hosts with facts), with what
(Python, the pip freeze of the run's environment, the git commit of every source), when (start, end, events)
and what came back (sha256 of every collected file). Facts and software come from one shell script
(:func:`facts_script`) that collect runs beside its per-host listing, so gathering them costs no extra
round trip. Secrets never enter it: environment variables are never read into it, and every string is
scrubbed of the controller's secret values and of credentials embedded in URLs (:func:`redact`).
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from testbed import scripts
from testbed.distribution import SOURCE_VERSION
from testbed.errors import UsageError
from testbed.paths import MANIFEST
from testbed.records import Manifest, ManifestHost

if TYPE_CHECKING:
    from testbed.hosts import Host
    from testbed.records import RankRecord
    from testbed.state import Store

SCHEMA = 1

SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_KEY|_KEY$|AUTH", re.I)
URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
MASK = "***"
SECRET_FIELD = re.compile(r"password|secret|token|private_key", re.I)  # keys in key files and clouds.yaml

# Fact lines printed by the remote snippet: "@F key value", "@G gpu-csv", "@P python", "@Z freeze", "@S name\tsha",
# "@Y fingerprint" (of what the freeze and version depend on)
FACT_PREFIXES = ("@F ", "@G ", "@P ", "@Z ", "@S ", "@Y ")

def iso(ts: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (``2024-05-01T12:00:00.000Z``); None stays None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(float(ts), UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# secrets -----------------------------------------------------------------------------------------
def secret_values(env: dict[str, str] | None = None) -> list[str]:
    """Values of the controller's secrets, held the ways users hold them: secret-looking environment variables
    (an openrc sourced), a GCP key file or application-default credentials, and clouds.yaml / secure.yaml."""
    env = dict(os.environ) if env is None else env
    found: set[str] = set()
    for name, value in env.items():
        if SECRET_NAME.search(name) and len(value) >= 8:  # short values would mask ordinary text
            found.add(value)
    home = Path(env.get("HOME") or "~").expanduser()
    gcloud = Path(env["CLOUDSDK_CONFIG"]) if env.get("CLOUDSDK_CONFIG") else home / ".config" / "gcloud"
    for key_file in (env.get("GOOGLE_APPLICATION_CREDENTIALS"), gcloud / "application_default_credentials.json"):
        if key_file:
            _secret_leaves(_read_data(Path(key_file), json.loads), found)
    import yaml

    os_dirs = [Path.cwd(), home / ".config" / "openstack", Path("/etc/openstack")]
    candidates = [Path(env["OS_CLIENT_CONFIG_FILE"])] if env.get("OS_CLIENT_CONFIG_FILE") else []
    candidates += [d / f for d in os_dirs for f in ("clouds.yaml", "clouds.yml", "secure.yaml", "secure.yml")]
    for f in candidates:
        _secret_leaves(_read_data(f, yaml.safe_load), found)
    return sorted(found, key=len, reverse=True)


def _read_data(path: Path, parse: Any) -> Any:
    try:
        if path.is_file() and path.stat().st_size < 1_000_000:
            return parse(path.read_text(encoding="utf-8", errors="replace"))
    except Exception:  # an unreadable or malformed file holds nothing to mask
        return None
    return None


def _secret_leaves(data: Any, found: set[str]) -> None:
    """Every string under a secret key (password, private_key, refresh_token, ...), with its PEM lines."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        if isinstance(v, dict | list):
            _secret_leaves(v, found)
        elif isinstance(v, str) and len(v) >= 4 and isinstance(k, str) and SECRET_FIELD.search(k):
            found.add(v)
            found.update(ln for ln in v.splitlines() if len(ln) >= 16)  # PEM body lines


def redact(obj: Any, secrets: list[str]) -> Any:
    """``obj`` with every secret value and every ``user:pass@`` of a URL replaced by ``***``."""
    if isinstance(obj, str):
        for s in secrets:
            if s in obj:
                obj = obj.replace(s, MASK)
        return URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", obj)
    if isinstance(obj, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v, secrets) for v in obj]
    return obj


# facts -------------------------------------------------------------------------------------------
def facts_script(*, facts: bool, python: str | None = None, sources: dict[str, Any] | None = None,
                 fingerprint: str | None = None) -> str:
    """The program (testbed/scripts/facts.sh, POSIX sh) printing host facts; when ``python`` is given, the run's
    software: its Python (python3 when that one is not there) and pip freeze, after their fingerprint; when
    ``fingerprint`` is given, only the fingerprint of that Python's software; the commits of ``sources``.

    Every value reaches the shell as a quoted argument; the output is parsed by :func:`parse_fact_lines`.
    """
    args: list[str] = ["--host"] if facts else []
    if python is not None:
        args += ["--python", python or "python3"]
    elif fingerprint is not None:
        args += ["--fingerprint", fingerprint or "python3"]
    pairs = [[str(name), str((src or {}).get("path") or "")] for name, src in sorted((sources or {}).items())]
    args += ["--", *(w for pair in pairs if pair[1] for w in pair)]
    return scripts.program("facts.sh", *args)


def parse_fact_lines(lines: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(facts, software) from the ``@``-prefixed lines printed by :func:`facts_script` (software's
    ``_commits`` and ``_fingerprint`` are for collect, not for the manifest)."""
    facts: dict[str, Any] = {}
    software: dict[str, Any] = {}
    gpus: list[dict[str, str]] = []
    freeze: list[str] = []
    commits: dict[str, str] = {}
    for ln in lines:
        tag, _, rest = ln.partition(" ")
        if tag == "@F":
            key, _, value = rest.partition(" ")
            value = value.strip()
            if key in ("cpus", "memory_kb"):
                facts[key] = int(value) if value.isdigit() else None
            else:
                facts[key] = value or None
        elif tag == "@G":
            parts = [p.strip() for p in rest.split(",")]
            if parts and parts[0]:
                gpus.append(dict(zip(("name", "memory", "driver"), parts, strict=False)))
        elif tag == "@P":
            version, _, exe = rest.strip().partition(" ")
            software["python"] = {"version": version or None, "executable": exe or None}
        elif tag == "@Z":
            if rest.strip():
                freeze.append(rest.strip())
        elif tag == "@S":
            name, _, sha = rest.partition("\t")
            commits[name] = sha.strip()
        elif tag == "@Y":
            software["_fingerprint"] = rest.strip()
    if "memory_kb" in facts:
        kb = facts.pop("memory_kb")
        facts["memory_mb"] = kb // 1024 if isinstance(kb, int) else None
    if facts:
        facts["gpus"] = gpus
    if "python" in software or freeze:
        software["pip_freeze"] = freeze
    if "python" in software or freeze or commits:
        software["_commits"] = commits
    return facts, software


# manifest ----------------------------------------------------------------------------------------
def load(path: Path) -> Manifest:
    """The manifest at ``path`` (a run folder or the file itself); {} when missing or unreadable."""
    p = Path(path)
    p = p / MANIFEST if p.is_dir() else p
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # nested past Python's depth too
        return {}
    return cast(Manifest, data) if isinstance(data, dict) else {}


def _host_status(ranks: list[RankRecord]) -> tuple[str | None, int | None]:
    """One status and exit code for a host from its ranks (the first failure wins)."""
    if not ranks:
        return None, None
    codes = [r.exit_code for r in ranks]
    bad = [c for c in codes if c not in (0, None)]
    exit_code = bad[0] if bad else (None if None in codes else 0)
    statuses = [r.status for r in ranks]
    status = statuses[0] if len(set(statuses)) == 1 else next(
        (s for s in statuses if s not in ("succeeded", "running", "pending")), statuses[0])
    return status, exit_code


def build(store: Store, run_id: str, *, hosts: list[Host], facts: dict[str, dict[str, Any]],
          software: dict[str, Any], files: list[dict[str, Any]], provider: str | None,
          secrets: list[str] | None = None) -> Manifest:
    """The manifest of ``run_id`` from state, the gathered facts/software and the verified files."""
    run = store.run(run_id)
    if run is None:
        raise UsageError(f"no run '{run_id}'", where="state", fix="see `testbed list runs` for the recorded run ids")
    info = run.info
    ranks: dict[str, list[RankRecord]] = {}
    for r in store.run_ranks(run_id):
        ranks.setdefault(r.host, []).append(r)
    host_recs: list[ManifestHost] = []
    for h in hosts:
        status, code = _host_status(ranks.get(h.name, []))
        hf: dict[str, Any] = dict(facts.get(h.name) or {})
        accel = h.facts.get("accelerator_type") or (h.facts.get("tpu_type"))
        hf.setdefault("tpu", accel if accel else None)
        host_recs.append({"name": h.name, "address": h.address, "facts": hf, "exit_code": code, "status": status,
                          "ranks": [{"rank": r.rank, "status": r.status, "exit_code": r.exit_code,
                                     "reason": r.reason} for r in ranks.get(h.name, [])]})
    sources_out: dict[str, Any] = {}
    commits = software.get("_commits") or {}
    for name, src in sorted(info.sources.items()):
        src = src if isinstance(src, dict) else {}
        sources_out[name] = {"repo": src.get("repo"), "ref": src.get("ref"),
                             "commit": commits.get(name) or src.get("commit") or None}
        for extra in ("override", "uncommitted_changes"):
            if src.get(extra):
                sources_out[name][extra] = src[extra]
    events = [{"ts": iso(e.ts), "kind": e.kind, "host": e.host, "detail": e.detail} for e in store.events(run_id)]
    manifest: Manifest = {
        "schema": SCHEMA,
        "run_id": run_id,
        "suite": run.suite,
        "params": run.params,
        "campaign": run.campaign,
        "status": run.status,
        "reason": run.reason,
        "testbed": {"name": run.testbed, "provider": provider},
        "hosts": host_recs,
        "software": {"python": software.get("python") or {"version": None, "executable": info.python},
                     "pip_freeze": list(software.get("pip_freeze") or []),
                     "sources": sources_out},
        "testbed_version": SOURCE_VERSION,
        "started": iso(run.started),
        "ended": iso(run.ended),
        "events": events,
        "files": sorted(files, key=lambda f: (f["host"], f["path"])),
    }
    # what `testbed reproduce` needs to run it again: the suite file by hash, the profile, the faults
    suite_file: dict[str, Any] | None = {"path": info.suite_file, "sha256": info.suite_sha256} \
        if info.suite_sha256 else None
    if suite_file is not None and info.suite_files is not None:  # None: planned before testbed hashed them
        suite_file["files"] = dict(info.suite_files)
    if suite_file is not None and info.report_sha256:  # the report.py testbed report may run for it
        suite_file["report_sha256"] = info.report_sha256
    if suite_file is not None and info.suite_git:  # fetched from git: where from, at which commit
        suite_file["git"] = dict(info.suite_git)
    manifest["suite_file"] = suite_file
    if info.hardware:  # what the testbed's spec declared (hardware.gpu); the hosts' own nvidia-smi is in hosts
        manifest["testbed"] = {"name": run.testbed, "provider": provider, "hardware": dict(info.hardware)}
    manifest["profile"] = info.profile
    manifest["faults"] = list(info.faults)
    if info.reproduces:
        manifest["reproduces"] = info.reproduces
    if info.rehearsal is not None:  # a rehearsal on a local replica: what ran, what was probed; never a result
        manifest["rehearsal"] = info.rehearsal
    return cast(Manifest, redact(manifest, secret_values() if secrets is None else secrets))


def write(run_folder: Path, manifest: Manifest) -> Path:
    """Write ``run_folder/manifest.json`` atomically (a reader never sees half a file)."""
    run_folder.mkdir(parents=True, exist_ok=True)
    path = run_folder / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.tmp")
    try:
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # the previous manifest (if any) stays whole
        raise
    return path
