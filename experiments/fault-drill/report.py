"""fault-drill's report: loss over global step, failure and restart marked; did training resume from a checkpoint?

Loaded by testbed from this folder (testbed.results, API 3) whenever it reports a run of this suite. Each rank
writes ``train_log.csv``: ``time,attempt,epoch,step,loss`` (time in unix seconds)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from testbed import results

results.require(3)

HEADER = ("time", "attempt", "epoch", "step", "loss")
MARKS = {"fault": "tab:red", "failed": "tab:red", "recovery": "tab:green"}


@dataclass(frozen=True)
class TrainRow:
    time: float
    attempt: int
    epoch: int
    step: int
    loss: float


def parse_train_log(src: Path | str) -> results.Parsed[TrainRow]:
    """Rows of one rank's training log; a truncated last line is skipped and noted."""
    rows, notes = results.csv_rows(src, HEADER, lambda d: TrainRow(float(d["time"]), int(d["attempt"]),
                                                                  int(d["epoch"]), int(d["step"]), float(d["loss"])))
    return results.Parsed(rows, notes)


def global_steps(rows: list[TrainRow]) -> list[int]:
    """A monotone step index for each row.

    If ``step`` restarts at each epoch (within one attempt, epoch goes up while step goes down),
    the global step is ``epoch * steps_per_epoch + step`` with ``steps_per_epoch = max(step) + 1``;
    otherwise ``step`` already counts across epochs and is used as is.
    """
    per_epoch = False
    for a, b in itertools.pairwise(rows):
        if a.attempt == b.attempt and b.epoch > a.epoch and b.step <= a.step:
            per_epoch = True
            break
    if not per_epoch:
        return [r.step for r in rows]
    spe = max(r.step for r in rows) + 1
    return [r.epoch * spe + r.step for r in rows]


@dataclass(frozen=True)
class Logged:
    host: str
    rank: int
    gstep: int
    row: TrainRow


def load_logs(run: results.RunDir, rep: results.Report) -> list[Logged]:
    logged: list[Logged] = []
    for i, (host, path) in enumerate(run.files(r"train_log\.csv")):
        parsed = parse_train_log(path)
        rep.skip([f"{host}/{run.rel(path).split('/', 1)[-1]}: {s}" for s in parsed.skipped])
        rank = results.rank_of(path.relative_to(run.path / host), i)
        rows = sorted(parsed.rows, key=lambda r: r.time)
        logged += [Logged(host, rank, g, r) for g, r in zip(global_steps(rows), rows, strict=True)]
    return logged


def nearest_step(logged: list[Logged], ts: float) -> int | None:
    """The global step of the row logged nearest in time to ``ts``."""
    if not logged:
        return None
    return min(logged, key=lambda lg: abs(lg.row.time - ts)).gstep


@results.reporter(tables=["train_log", "event_steps"])
def report(run: results.RunDir, rep: results.Report) -> None:
    logged = load_logs(run, rep)
    rep.heading("Training loss")
    if not logged:
        rep.text("No train_log.csv was found under any host folder.")
        rep.check("training resumed from checkpoint", None, "no train_log.csv")
        return
    rep.table("train_log", ["host", "rank", "attempt", "epoch", "step", "global_step", "time", "loss"],
              [[lg.host, lg.rank, lg.row.attempt, lg.row.epoch, lg.row.step, lg.gstep, results.Timestamp(lg.row.time),
                lg.row.loss]
               for lg in logged], "Training log, all ranks")

    marks: list[tuple[float, str, str]] = []
    ev_rows = []
    for ev in run.events:
        kind, ts = str(ev.get("kind")), results.event_time(ev.get("ts"))
        if kind not in MARKS or ts is None:
            continue
        step = nearest_step(logged, float(ts))
        ev_rows.append([kind, ev.get("host"), results.Timestamp(float(ts)), step])
        if step is not None and kind not in {m[1].split(" ")[0] for m in marks} \
                and not (kind == "failed" and any(m[1].startswith("fault") for m in marks)):
            marks.append((float(step), f"{kind} ({ev['host']})" if ev.get("host") else kind, MARKS[kind]))
    rep.table("event_steps", ["kind", "host", "ts", "nearest_global_step"], ev_rows,
              "Fault and recovery events mapped to the nearest logged step (by time)")

    ranks = sorted({lg.rank for lg in logged})
    series = {}
    for attempt in sorted({lg.row.attempt for lg in logged}):
        xs, ys = results.mean_by([(lg.gstep, lg.row.loss) for lg in logged if lg.row.attempt == attempt])
        label = f"attempt {attempt}" + (f" (mean of {results.plural(len(ranks), 'rank')})" if len(ranks) > 1 else "")
        series[label] = (xs, ys)
    rep.figure("loss", results.plotting.lines(series, xlabel="global step", ylabel="loss", vlines=marks,
                                              title="Loss with failure and restart"),
               "Loss over global step, one solid line per attempt; "
               + (f"vertical lines: {results.plotting.vline_key(marks)}." if marks else
                  "no fault or restart was logged."),
               key=True)

    _checks(logged, rep)


def _checks(logged: list[Logged], rep: results.Report) -> None:
    after = sorted((lg for lg in logged if lg.row.attempt >= 1), key=lambda lg: lg.row.time)
    if not after:
        rep.check("training resumed from checkpoint", False, "no rows with attempt >= 1 (no restart logged)")
    else:
        first = min(lg.gstep for lg in after if lg.row.time == after[0].row.time)
        rep.check("training resumed from checkpoint", first > 0,
                  f"first step after restart is {first}" + ("" if first > 0 else " (started over from 0)"))
    ordered = sorted(logged, key=lambda lg: (lg.row.time, lg.rank))
    first_loss, last_loss = ordered[0].row.loss, ordered[-1].row.loss
    rep.check("final loss below first loss", last_loss < first_loss, f"first {first_loss:.4g}, final {last_loss:.4g}")
