"""Read a run back from wherever it was logged: one loader per source, one :class:`Timeline` out.

``load_timeline(spec)`` takes what a user types:

====================================  ===========================================================
``path/to/events.jsonl``              a JSONL journal (``run.json`` beside it gives layers, steps)
``path/to/<run_id>/``                 a journal's run directory
``path/``                             a directory holding exactly one run (journal, TensorBoard
                                      log dir or W&B offline run) somewhere under it
``runs/<name>/``                      a TensorBoard log dir written by ``TensorBoardSink``
``wandb/offline-run-*/`` or ``wandb/``  a W&B offline run (or the ``wandb`` dir holding one)
``mlflow:RUN_ID``                     an MLflow run (``tracking_uri``, else ``MLFLOW_TRACKING_URI``,
``mlflow:EXPERIMENT/RUN_NAME``        else MLflow's default)
``wandb:ENTITY/PROJECT/RUN_ID``       a W&B run through the public API (needs network and login)
====================================  ===========================================================

Every failure a user can cause raises :class:`TimelineError` naming the source.
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable

from .events import SemanticEvent
from .sinks.jsonl import EVENTS_FILE, JournalError, read_journal, read_run_info
from .timeline import Timeline, TimelineError, event_key

PREFIX = "neuraldbg"
_SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".mypy_cache", ".pytest_cache"}
_SPECS = ("a journal file or run directory, a directory holding one run, a TensorBoard log dir, a W&B "
          "offline run dir, mlflow:RUN_ID, mlflow:EXPERIMENT/RUN_NAME or wandb:ENTITY/PROJECT/RUN_ID")


def load_timeline(spec: str | os.PathLike, *, tracking_uri: str | None = None) -> Timeline:
    """The timeline of the run ``spec`` names (see the module doc for the forms it takes)."""
    text = str(spec)
    if text.startswith("mlflow:"):
        return load_mlflow(text[len("mlflow:"):], tracking_uri=tracking_uri)
    if text.startswith("wandb:"):
        return load_wandb_api(text[len("wandb:"):])
    path = Path(text).expanduser()
    if not path.exists():
        scheme = text.split(":", 1)[0] if ":" in text and "/" not in text.split(":", 1)[0] else None
        what = f"unknown source {scheme + ':'!r} in {text!r}" if scheme else f"{text}: no such file or directory"
        raise TimelineError(f"{what}; expected {_SPECS}")
    if path.is_file():
        if path.suffix == ".wandb":
            return load_wandb_offline(path)
        if "tfevents" in path.name:
            return load_tensorboard(path.parent)
        return load_journal(path)
    runs = find_runs(path)
    if not runs:
        raise TimelineError(f"{path}: no neuraldbg run found under it; expected {_SPECS}")
    if len(runs) > 1:
        listed = "; ".join(f"{kind} {p}" for kind, p in runs[:10])
        listed += f"; … {len(runs) - 10} more" if len(runs) > 10 else ""
        raise TimelineError(f"{path} holds {len(runs)} runs ({listed}); pass one of them")
    kind, found = runs[0]
    return {"journal": load_journal, "tensorboard": load_tensorboard, "wandb": load_wandb_offline}[kind](found)


def find_runs(root: Path) -> list[tuple[str, Path]]:
    """Every run under ``root`` as ``(kind, path)``: journal run dirs, TensorBoard log dirs (a dir
    with ``*tfevents*`` files) and W&B run files (``run-*.wandb``). Symlinks are not followed."""
    found: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        here = Path(folder)
        if EVENTS_FILE in files:
            found.append(("journal", here))
        if any("tfevents" in f for f in files):
            found.append(("tensorboard", here))
        found += [("wandb", here / f) for f in sorted(files) if f.startswith("run-") and f.endswith(".wandb")]
    return found


def _unique(events: Iterable[SemanticEvent]) -> list[SemanticEvent]:
    """Events without repeats (a tracker may hold an event twice after a retried delivery)."""
    return list({event_key(e): e for e in events}.values())


# ---- JSONL journal -----------------------------------------------------------------------------
def load_journal(path: str | os.PathLike) -> Timeline:
    """A journal file or run directory; ``run.json`` beside it gives the layers and the step count."""
    try:
        events = read_journal(path)
    except JournalError as exc:  # names file:line
        raise TimelineError(str(exc)) from None
    run_dir = Path(path) if Path(path).is_dir() else Path(path).parent
    try:
        info = read_run_info(path)
    except (ValueError, OSError) as exc:
        raise TimelineError(f"{run_dir / 'run.json'}: not readable as JSON ({exc})") from None
    steps = info.get("steps")
    return Timeline.build(info.get("run_id") or run_dir.name, f"journal:{run_dir}", events,
                          layers=info.get("layers"), steps=steps if isinstance(steps, int) else None, info=info)


# ---- TensorBoard -------------------------------------------------------------------------------
def load_tensorboard(log_dir: str | os.PathLike) -> Timeline:
    """A log dir written by ``TensorBoardSink``, read from its exact ``<prefix>/event_json`` tag."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util import tensor_util
    except ImportError:
        raise TimelineError(f'{log_dir}: reading TensorBoard logs needs pip install "neuraldbg-track[tensorboard]"') \
            from None
    from .integrations.tensorboard import EVENT_JSON_TAG

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0, "scalars": 1})  # 0: keep every event
    acc.Reload()
    tags = [t for t in acc.Tags().get("tensors", []) if t.endswith("/" + EVENT_JSON_TAG)]
    if not tags:
        raise TimelineError(f"{log_dir}: no '<prefix>/{EVENT_JSON_TAG}' tag in this TensorBoard log dir; "
                            "was it written by neuraldbg-track's TensorBoardSink (this version or later)?")
    tag = f"{PREFIX}/{EVENT_JSON_TAG}" if f"{PREFIX}/{EVENT_JSON_TAG}" in tags else sorted(tags)[0]
    events = []
    for item in acc.Tensors(tag):
        raw = tensor_util.make_ndarray(item.tensor_proto).reshape(-1)[0]
        try:
            events.append(SemanticEvent.from_dict(json.loads(raw.decode("utf-8"))))
        except (ValueError, TypeError, KeyError) as exc:
            raise TimelineError(f"{log_dir}: tag {tag} at step {item.step}: not a valid event ({exc})") from None
    return Timeline.build(Path(log_dir).resolve().name, f"tensorboard:{log_dir}", _unique(events),
                          info={"tag": tag})


# ---- Weights & Biases --------------------------------------------------------------------------
def _table_key(keys: Iterable[str], where: str) -> str:
    keys = sorted({k for k in keys if k.endswith("/timeline_table")})
    if not keys:
        raise TimelineError(f"{where}: no '<prefix>/timeline_table' logged; was it tracked with WandbSink?")
    return f"{PREFIX}/timeline_table" if f"{PREFIX}/timeline_table" in keys else keys[0]


def _table_events(rows: Iterable[dict[str, Any]], where: str) -> list[SemanticEvent]:
    events = []
    for number, row in enumerate(rows, 1):
        try:
            metadata = json.loads(row.get("metadata") or "{}")
            events.append(SemanticEvent(event_type=row["event_type"], layer_name=str(row["layer"]),
                                        step=row["step"], from_state=row["from_state"], to_state=row["to_state"],
                                        confidence=row["confidence"], metadata=metadata))
        except (ValueError, TypeError, KeyError) as exc:
            raise TimelineError(f"{where}: timeline table row {number}: not a valid event ({exc})") from None
    return _unique(events)


def _dropped_note(summary: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """A W&B table keeps 10,000 rows: say so when the run had more events (the journal has them all)."""
    dropped = summary.get(f"{key.rsplit('/', 1)[0]}/timeline_rows_dropped") or 0
    if dropped:
        warnings.warn(f"{where}: the W&B timeline table lacks the run's last {dropped} events "
                      "(a table keeps 10,000 rows); the run's JSONL journal has them all", stacklevel=3)
    return {"timeline_rows_dropped": dropped} if dropped else {}


def load_wandb_offline(path: str | os.PathLike) -> Timeline:
    """An offline run directory (``wandb/offline-run-*``), the ``wandb`` dir holding one, or the file."""
    from .integrations._wandb_offline import OfflineRunError, read_offline_run

    try:
        run = read_offline_run(path)
        key = _table_key((k for row in run.history for k in row), str(path))
        rows = run.table(key)
    except (OfflineRunError, OSError) as exc:
        raise TimelineError(str(exc)) from None
    except ImportError:
        raise TimelineError(f'{path}: reading W&B runs needs pip install "neuraldbg-track[wandb]"') from None
    run_id = run.path.stem[len("run-"):] if run.path.stem.startswith("run-") else run.path.stem
    return Timeline.build(run_id, f"wandb-offline:{run.path.parent}", _table_events(rows, str(run.path)),
                          info={"table": key, **_dropped_note(run.summary, key, str(run.path))})


def load_wandb_api(path: str) -> Timeline:
    """``entity/project/run_id`` through ``wandb.Api()`` (network and a login needed; not exercised
    by the test suite, which runs offline)."""
    where = f"wandb:{path}"
    if path.count("/") != 2 or not all(path.split("/")):
        raise TimelineError(f"{where}: expected wandb:ENTITY/PROJECT/RUN_ID")
    try:
        import wandb
    except ImportError:
        raise TimelineError(f'{where}: reading W&B runs needs pip install "neuraldbg-track[wandb]"') from None
    try:
        run = wandb.Api().run(path)
        summary = dict(run.summary_metrics)
        key = _table_key(summary, where)
        ref = summary.get(key)  # the summary keeps the last table logged; else look through the history
        if not (isinstance(ref, dict) and "path" in ref):
            refs = [row[key] for row in run.scan_history(keys=[key]) if isinstance(row.get(key), dict)]
            ref = refs[-1] if refs and "path" in refs[-1] else None
        if ref is None:
            raise TimelineError(f"{where}: {key} holds no table file")
        with tempfile.TemporaryDirectory() as tmp:
            run.file(ref["path"]).download(root=tmp, replace=True)
            doc = json.loads((Path(tmp) / ref["path"]).read_text(encoding="utf-8"))
    except TimelineError:
        raise
    except Exception as exc:  # wandb.errors.CommError and friends: name the run, no traceback
        raise TimelineError(f"{where}: {type(exc).__name__}: {exc}") from None
    rows = [dict(zip(doc["columns"], row)) for row in doc["data"]]
    info = {"table": key, "url": getattr(run, "url", None), **_dropped_note(summary, key, where)}
    return Timeline.build(run.name or run.id, where, _table_events(rows, where), info=info)


# ---- MLflow ------------------------------------------------------------------------------------
def _mlflow_client(tracking_uri: str | None, where: str):
    try:
        import mlflow
    except ImportError:
        raise TimelineError(f'{where}: reading MLflow runs needs pip install "neuraldbg-track[mlflow]"') from None
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or mlflow.get_tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise TimelineError(f"{where}: no MLflow store at {uri} (it would be created empty); "
                            "pass --tracking-uri or set MLFLOW_TRACKING_URI")
    return mlflow.MlflowClient(uri), uri


def load_mlflow(ref: str, *, tracking_uri: str | None = None) -> Timeline:
    """``RUN_ID`` or ``EXPERIMENT/RUN_NAME`` (split at the last ``/``) from the table MLflowSink logs."""
    where = f"mlflow:{ref}"
    if not ref:
        raise TimelineError(f"{where}: expected mlflow:RUN_ID or mlflow:EXPERIMENT/RUN_NAME")
    client, uri = _mlflow_client(tracking_uri, where)
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(ref) if "/" not in ref else _run_by_name(client, ref, where, uri)
        table_file = run.data.tags.get(f"{PREFIX}.table", "neuraldbg_events.json")
        folder = os.path.dirname(table_file) or None
        if table_file not in {f.path for f in client.list_artifacts(run.info.run_id, folder)}:
            raise TimelineError(f"{where}: run {run.info.run_id} has no {table_file} artifact; "
                                "was it tracked with MLflowSink?")
        with tempfile.TemporaryDirectory() as tmp:
            table = json.loads(Path(client.download_artifacts(run.info.run_id, table_file, tmp)).read_text("utf-8"))
    except MlflowException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TimelineError(f"{where}: {first} (tracking URI {uri})") from None
    # the table is read as JSON, not with mlflow.load_table: pandas would turn layer "0" into 0
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    name = run.info.run_name or run.info.run_id
    return Timeline.build(name, f"mlflow:{run.info.run_id}", _table_events(rows, where),
                          info={"run_id": run.info.run_id, "tracking_uri": uri, "status": run.info.status})


def _run_by_name(client: Any, ref: str, where: str, uri: str) -> Any:
    experiment_name, run_name = ref.rsplit("/", 1)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        names = [e.name for e in client.search_experiments(max_results=20)]
        raise TimelineError(f"{where}: no experiment {experiment_name!r} at {uri} (experiments: {', '.join(names)})")
    quoted = run_name.replace("'", "\\'")
    runs = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{quoted}'", max_results=20)
    if not runs:
        raise TimelineError(f"{where}: no run named {run_name!r} in experiment {experiment_name!r} at {uri}")
    if len(runs) > 1:
        ids = ", ".join(r.info.run_id for r in runs)
        raise TimelineError(f"{where}: {len(runs)} runs are named {run_name!r} ({ids}); pass mlflow:RUN_ID")
    return runs[0]
