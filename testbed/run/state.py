"""Run records in the state store: runs, run_hosts and events rows, plus the plan file of each run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from testbed import paths
from testbed.errors import UsageError
from testbed.state import Store

ACTIVE = ("pending", "running")
# every way a run ends: its status and the exit code of `testbed run` (and `wait`) for it
OUTCOMES = {"succeeded": 0, "failed": 1, "stopped": 3, "timed-out": 124}
ENDED = tuple(OUTCOMES)


def run_home(run_id: str) -> Path:
    """Controller-side files of a run: plan.json, supervisor.log, step logs."""
    p = paths.home() / "runs" / run_id
    p.mkdir(parents=True, exist_ok=True)
    return p


def save_plan(plan: dict[str, Any]) -> Path:
    p = run_home(plan["run_id"]) / "plan.json"
    p.write_text(json.dumps(plan, indent=1))
    return p


def load_plan(run_id: str) -> dict[str, Any]:
    p = paths.home() / "runs" / run_id / "plan.json"
    if not p.exists():
        raise UsageError(f"run '{run_id}' has no plan file", where=str(p), fix="it was made by another state home?")
    return json.loads(p.read_text())


def create(st: Store, plan: dict[str, Any], campaign: str | None = None) -> None:
    now = time.time()
    info = {"outputs": plan["outputs"], "run_dir": plan["run_dir"], "hosts": [h["name"] for h in plan["hosts"]],
            "faults": [f["name"] for f in plan["faults"]], "world_size": len(plan["ranks"]),
            "plan": str(save_plan(plan)), "attempt": 0, "fired": [], "recovered": [],
            "sources": plan.get("source_info") or {}}
    env = next((r.get("environment") for r in plan["ranks"] if r.get("environment")), None)
    if env:
        info["python"] = env.rstrip("/") + "/bin/python"  # the manifest's pip freeze is of the run's environment
    with st.tx() as db:
        db.execute("INSERT INTO runs(id, suite, testbed, params, status, campaign, created, info) "
                   "VALUES (?,?,?,?,?,?,?,?)", (plan["run_id"], plan["suite"], plan["testbed"],
                                                json.dumps(plan["params"]), "pending", campaign, now,
                                                json.dumps(info)))
        for r in plan["ranks"]:
            db.execute("INSERT INTO run_hosts(run_id, host, rank, status) VALUES (?,?,?,?)",
                       (plan["run_id"], r["host"], r["rank"], "pending"))


def get(st: Store, run_id: str) -> dict[str, Any] | None:
    rows = st.query("SELECT * FROM runs WHERE id=?", (run_id,))
    if not rows:
        return None
    d = dict(rows[0])
    d["params"] = json.loads(d["params"])
    d["info"] = json.loads(d["info"])
    return d


def require(st: Store, run_id: str) -> dict[str, Any]:
    r = get(st, run_id)
    if r is None:
        import difflib

        ids = [x["id"] for x in st.query("SELECT id FROM runs ORDER BY created DESC LIMIT 200")]
        close = difflib.get_close_matches(run_id, ids, n=1, cutoff=0.4)
        raise UsageError(f"no run '{run_id}'", where="state",
                         fix=(f"did you mean '{close[0]}'? " if close else "") + "see: testbed list runs")
    return r


def update(st: Store, run_id: str, *, only_active: bool = False, **fields: Any) -> bool:
    """Set columns of the run; ``info`` is merged. ``only_active``: only while pending/running."""
    with st.tx() as db:
        row = db.execute("SELECT status, info FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None or (only_active and row["status"] not in ACTIVE):
            return False
        if "info" in fields:
            fields["info"] = json.dumps({**json.loads(row["info"]), **fields["info"]})
        if fields:
            cols = ", ".join(f"{k}=?" for k in fields)
            db.execute(f"UPDATE runs SET {cols} WHERE id=?", (*fields.values(), run_id))  # noqa: S608
    return True


def set_rank(st: Store, run_id: str, host: str, rank: int, **fields: Any) -> None:
    with st.tx() as db:
        cols = ", ".join(f"{k}=?" for k in fields)
        db.execute(f"UPDATE run_hosts SET {cols} WHERE run_id=? AND host=? AND rank=?",  # noqa: S608
                   (*fields.values(), run_id, host, rank))


def ranks(st: Store, run_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in st.query("SELECT * FROM run_hosts WHERE run_id=? ORDER BY rank", (run_id,))]


def event(st: Store, run_id: str, kind: str, host: str | None = None, ts: float | None = None,
          info: dict[str, Any] | None = None, **more: Any) -> None:
    """One events row; ``info`` and ``more`` form its detail JSON."""
    detail = {**(info or {}), **more}
    with st.tx() as db:
        db.execute("INSERT INTO events(run_id, ts, kind, host, detail) VALUES (?,?,?,?,?)",
                   (run_id, ts or time.time(), kind, host, json.dumps(detail, default=str)))


def events(st: Store, run_id: str, after: int = 0) -> list[dict[str, Any]]:
    out = []
    for r in st.query("SELECT * FROM events WHERE run_id=? AND seq>? ORDER BY seq", (run_id, after)):
        d = dict(r)
        d["detail"] = json.loads(d["detail"])
        out.append(d)
    return out


def pid_alive(pid: int | None, token: str) -> bool:
    """Whether ``pid`` is alive and its command line mentions ``token`` (a run or campaign id)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ProcessLookupError):
        return False
    return token.encode() in cmd and stat.split(")")[-1].split()[0] != "Z"


def describe_exit(code: int) -> str:
    """``exit 3`` or ``signal 9 (SIGKILL)`` from a shell's exit status."""
    import signal

    if code > 128 and code - 128 < 65:
        try:
            return f"signal {code - 128} ({signal.Signals(code - 128).name})"
        except ValueError:
            return f"signal {code - 128}"
    if code == 96:
        return "exit 96 (the suite's environment does not exist on the host: apply its profile first)"
    if code == 97:
        return "exit 97 (the run folder or the step's working folder is missing on the host)"
    return f"exit {code}"
