"""The job's answer in the experiment tracker beside the training run: Weights & Biases, MLflow, TensorBoard.

What is logged comes from the Python API alone (:func:`values`: ``Job.verdict``, ``Job.summary()``'s per-iteration
figures and job shares, ``Job.breakdown``, ``Job.whatif()``); each tracker only writes it its own way:

* scalars ``tracekit/median_iteration_ms``, ``tracekit/<class>_share`` (compute, overlapped, exposed_comm, memory,
  idle), ``tracekit/scaling_factor``, ``tracekit/ranks``, ``tracekit/iterations``;
* per iteration (x axis ``tracekit/iteration``): ``tracekit/iteration_ms``, ``tracekit/exposed_comm_ms``;
* the verdict: ``tracekit/verdict`` (its kind), ``tracekit/headline``, ``tracekit/verdict_text``;
* tables ``tracekit/breakdown`` (per rank and iteration, ms) and ``tracekit/whatif`` (the replays).

Each library is imported only when its tracker is asked for (``pip install 'tracekit[wandb]'``, ``[mlflow]``,
``[tensorboard]``); a missing one, or a tracker that refuses (no W&B login, an MLflow server down), is a one-line
TraceError. docs/integrations/trackers.md shows each.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.model.diagnostics import TraceError

if TYPE_CHECKING:
    from tracekit.api import Job

TRACKERS = ("wandb", "mlflow", "tensorboard")
#: the pip extra of each tracker and the module it needs
NEEDS = {"wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboard"}
PREFIX = "tracekit"
CLASSES = ("compute", "overlapped", "exposed_comm", "memory", "idle")
BREAKDOWN_COLUMNS = ("rank", "iteration", "wall_ns", *[f"{c}_ns" for c in CLASSES], "wait_ns", "transfer_ns")


@dataclass(frozen=True)
class Values:
    """What goes to a tracker, taken from a :class:`tracekit.Job` (see the module docstring for the names)."""

    name: str
    kind: str
    headline: str
    text: str
    scalars: dict[str, float]
    #: per iteration: ``iteration, iteration_ms, exposed_comm_ms``
    iterations: list[dict[str, Any]]
    #: per rank and iteration window: ``rank, iteration`` and the classes in ms
    breakdown: list[dict[str, Any]]
    #: the what-if rows (``Job.whatif``), empty where the job has nothing to re-cost (then ``whatif_note`` says why)
    whatif: list[dict[str, Any]]
    whatif_note: str | None = None

    def table(self, rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
        """``rows`` as columns and rows of values (the shape every tracker's table takes)."""
        cols = list(rows[0]) if rows else []
        return cols, [[r.get(c) for c in cols] for r in rows]


def parse(text: str | Sequence[str] | None) -> list[str]:
    """``--log wandb,mlflow`` (repeatable) as a list of tracker names; an unknown one is a one-line error."""
    if not text:
        return []
    items = [text] if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in items:
        for name in (s.strip().lower() for s in str(item).split(",")):
            if name and name not in TRACKERS:
                raise TraceError(None, f"--log: {name!r} is not a tracker (one of {', '.join(TRACKERS)})")
            if name and name not in out:
                out.append(name)
    return out


def default_whatif(job: Job) -> dict[str, Any]:
    """The scenarios logged unless others are given: at the job's line rate, twice and four times it (else 1, 10 and
    100 Gbit/s at full efficiency), each with compression 1 and 4, and the stragglers' excess removed."""
    rate = job.line_rate_bps
    bands: list[Any] = [None, 2 * rate, 4 * rate] if rate else ["1gbit", "10gbit", "100gbit"]
    out: dict[str, Any] = {"bandwidth": bands, "compression": [1, 4], "stragglers_removed": job.n_ranks > 1}
    if not rate:
        out["efficiency"] = "full"
    return out


def values(job: Job, *, whatif: Mapping[str, Any] | None = None, name: str | None = None) -> Values:
    """What the trackers log for ``job``: from ``Job.verdict``, ``Job.summary()``, ``Job.breakdown`` and
    ``Job.whatif(**whatif)`` (default :func:`default_whatif`)."""
    verdict = job.verdict
    summary = job.summary()
    shares = summary["job"]
    scalars = {f"{c}_share": float(shares[f"{c}_share"]) for c in CLASSES if shares.get(f"{c}_share") is not None}
    if shares.get("median_iteration_ns") is not None:
        scalars["median_iteration_ms"] = shares["median_iteration_ns"] / 1e6
    if verdict.scaling_factor is not None:
        scalars["scaling_factor"] = float(verdict.scaling_factor)
    scalars["ranks"], scalars["iterations"] = float(job.n_ranks), float(job.n_iterations)
    iterations = [{"iteration": int(r["iteration"]), "iteration_ms": r["iteration_ns"] / 1e6,
                   "exposed_comm_ms": (r["mean_exposed_comm_ns"] or 0) / 1e6} for r in summary["iterations"]]
    cols = [c for c in BREAKDOWN_COLUMNS if c in job.breakdown.columns]
    breakdown = [{_ms(k): (x / 1e6 if k.endswith("_ns") and x is not None else x) for k, x in row.items()}
                 for row in job.breakdown.select(cols).iter_rows(named=True)]
    rows: list[dict[str, Any]] = []
    note = None
    try:
        table = job.whatif(**(default_whatif(job) if whatif is None else dict(whatif)))
        rows = [{k: _cell(k, v) for k, v in r.items()} for r in table.to_dicts()]
    except TraceError as exc:  # nothing to re-cost (no communication): the verdict says so already
        note = exc.message
    return Values(name=name or _job_name(job), kind=verdict.kind, headline=verdict.headline, text=verdict.text,
                  scalars=scalars, iterations=iterations, breakdown=breakdown, whatif=rows, whatif_note=note)


def _cell(column: str, value: Any) -> Any:
    """A what-if cell as the trackers' tables take it: a range's sources as their text (``variation ±7 %, …``),
    other lists (the per-link rates) as their repr, scalars as they are."""
    if column == "range_sources":
        from tracekit.analysis.ranges import sources_of, sources_text

        return sources_text(sources_of(value))
    return str(value) if isinstance(value, list | tuple) else value


def _ms(column: str) -> str:
    """``compute_ns`` -> ``compute_ms`` (the tables are logged in ms)."""
    return column[:-3] + "_ms" if column.endswith("_ns") else column


def _job_name(job: Job) -> str:
    """``tracekit-<folder of the traces>`` (the folder above one named tracekit…, e.g. ``tracekit-traces``)."""
    first = Path(job.paths[0]).absolute() if job.paths else Path("job")
    folder = first if first.is_dir() else first.parent
    if folder.name.startswith("tracekit") and folder.parent.name:
        folder = folder.parent
    return f"tracekit-{folder.name}" if folder.name else "tracekit"


def log(job: Job | Values, to: str | Sequence[str], *, log_dir: str | os.PathLike[str] | None = None,
        project: str | None = None, name: str | None = None, whatif: Mapping[str, Any] | None = None) -> list[str]:
    """Log ``job`` (or its :func:`values`) to each tracker of ``to`` (names of :data:`TRACKERS`); returns where each
    went, one line each. ``log_dir``: the folder each tracker writes under by its own convention — W&B's
    ``<log_dir>/wandb/``, an MLflow file store ``<log_dir>/mlruns``, TensorBoard's ``<log_dir>/runs/<name>`` (an MLflow
    tracking URI, ``sqlite:///…`` or ``http://…``, goes to MLflow as it is); without it W&B and MLflow use their own
    settings and TensorBoard ``./runs/<name>``. ``project``: the W&B project, the MLflow experiment (default
    ``tracekit``); ``name``: the run's name (default ``tracekit-<folder of the traces>``). Logs into the W&B or MLflow
    run already active in this process where no ``log_dir`` is given."""
    names = parse(to)
    vals = job if isinstance(job, Values) else values(job, whatif=whatif, name=name)
    writers = {"wandb": to_wandb, "mlflow": to_mlflow, "tensorboard": to_tensorboard}
    return [writers[t](vals, log_dir=log_dir, project=project) for t in names]


def _require(tracker: str) -> Any:
    import importlib

    try:
        return importlib.import_module(NEEDS[tracker])
    except ImportError:
        raise TraceError(None, f"--log {tracker} needs {NEEDS[tracker]}, which is not installed: "
                               f"pip install 'tracekit[{tracker}]'") from None


@contextlib.contextmanager
def _refusal(tracker: str) -> Iterator[None]:
    """A tracker's own failure (no login, a server down, a folder it cannot write) as one line."""
    try:
        yield
    except TraceError:
        raise
    except Exception as exc:
        text = " ".join(str(exc).split())
        raise TraceError(None, f"--log {tracker}: {type(exc).__name__}: {text[:300]}") from exc


# ---------------------------------------------------------------------------------------------------- W&B


def to_wandb(v: Values, *, log_dir: str | os.PathLike[str] | None = None, project: str | None = None) -> str:
    """Into the active W&B run (``wandb.run``) when there is one and no ``log_dir`` is given, else into a run of its
    own in ``project`` (``WANDB_MODE=offline`` keeps it on disk)."""
    wandb = _require("wandb")
    with _refusal("wandb"):
        run = wandb.run if log_dir is None else None
        own = run is None
        if own:
            folder = None if log_dir is None else _folder("wandb", log_dir)
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
            run = wandb.init(project=project or PREFIX, name=v.name, dir=None if folder is None else str(folder),
                             reinit="create_new", settings=wandb.Settings(silent=True, console="off"))
        step = f"{PREFIX}/iteration"
        run.define_metric(step)
        run.define_metric(f"{PREFIX}/iteration_ms", step_metric=step)
        run.define_metric(f"{PREFIX}/exposed_comm_ms", step_metric=step)
        for it in v.iterations:
            run.log({f"{PREFIX}/{k}": val for k, val in it.items()})
        tables = {f"{PREFIX}/{t}": wandb.Table(*v.table(rows)) for t, rows in
                  (("breakdown", v.breakdown), ("whatif", v.whatif)) if rows}
        if tables:
            run.log(tables)
        run.summary.update({**{f"{PREFIX}/{k}": val for k, val in v.scalars.items()},
                            f"{PREFIX}/verdict": v.kind, f"{PREFIX}/headline": v.headline,
                            f"{PREFIX}/verdict_text": v.text})
        where = f"wandb: run {run.name or run.id} ({run.dir})"
        if own:
            run.finish()
    return where


# ---------------------------------------------------------------------------------------------------- MLflow


@contextlib.contextmanager
def _file_store_allowed(uri: str) -> Iterator[None]:
    """MLflow 3 refuses a ``file:`` store unless ``MLFLOW_ALLOW_FILE_STORE`` is set; a folder given to log into is
    asked for explicitly, so it is allowed for this write alone (the variable is put back after)."""
    if not uri.startswith("file:") or "MLFLOW_ALLOW_FILE_STORE" in os.environ:
        yield
        return
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)


def is_uri(log_dir: str | os.PathLike[str]) -> bool:
    """Whether ``log_dir`` is a URI (``file:``, ``sqlite:``, ``http(s):``, ``databricks``) rather than a folder."""
    text = os.fspath(log_dir)
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", text)) and not re.match(r"^[a-zA-Z]:[\\/]", text)


def _folder(tracker: str, log_dir: str | os.PathLike[str]) -> Path:
    """``log_dir`` as a folder (a URI is MLflow's alone)."""
    if is_uri(log_dir):
        raise TraceError(None, f"--log {tracker}: --log-dir {os.fspath(log_dir)!r} is a URI; {tracker} writes to a "
                               "folder")
    return Path(log_dir)


def _tracking_uri(log_dir: str | os.PathLike[str]) -> str:
    return os.fspath(log_dir) if is_uri(log_dir) else (Path(log_dir) / "mlruns").resolve().as_uri()


def to_mlflow(v: Values, *, log_dir: str | os.PathLike[str] | None = None, project: str | None = None) -> str:
    """Into the active MLflow run when there is one and no ``log_dir`` is given, else into a new run of experiment
    ``project`` at ``log_dir`` (a tracking URI, or a folder: the file store ``<log_dir>/mlruns``) or MLflow's own
    tracking URI."""
    mlflow = _require("mlflow")
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    with _refusal("mlflow"):
        active = mlflow.active_run() if log_dir is None else None
        uri = _tracking_uri(log_dir) if log_dir is not None else mlflow.get_tracking_uri()
        with _file_store_allowed(uri):
            client = MlflowClient(tracking_uri=uri)
            if active is not None:
                run_id = active.info.run_id
            else:
                exp = client.get_experiment_by_name(project or PREFIX)
                exp_id = exp.experiment_id if exp is not None else client.create_experiment(project or PREFIX)
                run_id = client.create_run(exp_id, run_name=v.name).info.run_id
            now = int(time.time() * 1000)
            metrics = [Metric(f"{PREFIX}.{k}", val, now, 0) for k, val in v.scalars.items()]
            metrics += [Metric(f"{PREFIX}.{k}", float(it[k]), now, it["iteration"])
                        for it in v.iterations for k in ("iteration_ms", "exposed_comm_ms")]
            for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
                client.log_batch(run_id, metrics=metrics[i:i + 1000])
            client.log_batch(run_id, params=[Param(f"{PREFIX}.verdict", v.kind)],
                             tags=[RunTag(f"{PREFIX}.headline", v.headline[:5000])])
            client.log_text(run_id, v.text + "\n", f"{PREFIX}/verdict.txt")
            for t, rows in (("breakdown", v.breakdown), ("whatif", v.whatif)):
                if rows:
                    client.log_dict(run_id, rows, f"{PREFIX}/{t}.json")
            if active is None:
                client.set_terminated(run_id)
    return f"mlflow: run {run_id} at {uri}"


# ---------------------------------------------------------------------------------------------------- TensorBoard


def to_tensorboard(v: Values, *, log_dir: str | os.PathLike[str] | None = None, project: str | None = None) -> str:
    """An event file in ``<log_dir>/runs/<run name>`` (default ``./runs/<run name>``): the scalars, the per-iteration
    series (step = the iteration), and the verdict and the tables as text (Markdown), written by TensorBoard's own
    event writer."""
    _require("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    def scalar(tag: str, value: float) -> summary_pb2.Summary.Value:
        return summary_pb2.Summary.Value(tag=tag, simple_value=float(value))

    def text(tag: str, body: str) -> summary_pb2.Summary.Value:
        meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[body.encode()],
                                        tensor_shape=tensor_shape_pb2.TensorShapeProto(
                                            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
        return summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor)

    folder = (Path("runs") if log_dir is None else _folder("tensorboard", log_dir) / "runs") / v.name
    with _refusal("tensorboard"):
        folder.mkdir(parents=True, exist_ok=True)
        writer = EventFileWriter(str(folder), filename_suffix=".tracekit")
        now = time.time()

        def add(step: int, values_: list[summary_pb2.Summary.Value]) -> None:
            writer.add_event(event_pb2.Event(wall_time=now, step=step, summary=summary_pb2.Summary(value=values_)))

        add(0, [scalar(f"{PREFIX}/{k}", val) for k, val in v.scalars.items()])
        for it in v.iterations:
            add(it["iteration"], [scalar(f"{PREFIX}/{k}", it[k]) for k in ("iteration_ms", "exposed_comm_ms")])
        texts = [text(f"{PREFIX}/verdict", f"**{v.kind}**\n\n{v.text}")]
        texts += [text(f"{PREFIX}/{t}", markdown_table(*v.table(rows))) for t, rows in
                  (("breakdown", v.breakdown), ("whatif", v.whatif)) if rows]
        add(0, texts)
        writer.close()
    return f"tensorboard: {folder}"


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (what TensorBoard's text plugin draws as one)."""
    def cell(x: Any) -> str:
        return f"{x:.4g}" if isinstance(x, float) else "" if x is None else str(x)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)
