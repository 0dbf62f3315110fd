"""Hydra structured configs: everything NeuralDbg and its sinks take, validated at start-up.

Importing this module registers the schema in Hydra's ConfigStore as ``neuraldbg/schema``; the
presets (``default``, ``strict``, ``lenient``, one per sink) are YAML files in the package's
``conf/neuraldbg/`` that Hydra finds through our search-path plugin, so a user's app only adds
``- neuraldbg: default`` to its defaults list. Then::

    python train.py neuraldbg.sink=wandb
    python train.py neuraldbg.sinks=[mlflow,tensorboard] neuraldbg.thresholds.vanishing=1e-7
    python train.py neuraldbg=strict neuraldbg.patience=5
    python train.py neuraldbg.enabled=false

``sink`` is a value (an Enum), not a config group, so exactly ``neuraldbg.sink=wandb`` works.
Defaults are the library's own: the ``thresholds`` node is generated from :class:`Thresholds`.
Hydra stays optional: nothing in the core imports this module.
"""
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from enum import Enum
from typing import Dict, List, Optional

from hydra.core.config_store import ConfigStore

from .config import Thresholds

TOP_LEVEL_THRESHOLDS = ("patience", "hysteresis")  # set as neuraldbg.patience, not thresholds.patience


class SinkName(Enum):
    """Where events go besides the journal (``jsonl`` = the journal alone, ``none`` = nowhere)."""

    jsonl = "jsonl"
    mlflow = "mlflow"
    wandb = "wandb"
    tensorboard = "tensorboard"
    console = "console"
    none = "none"


ThresholdsConf = make_dataclass(
    "ThresholdsConf",
    [(f.name, f.type if isinstance(f.type, type) else {"float": float, "int": int}[f.type], field(default=f.default))
     for f in fields(Thresholds) if f.name not in TOP_LEVEL_THRESHOLDS and f.default is not MISSING],
)
ThresholdsConf.__doc__ = "Every field of neuraldbg_track.Thresholds but patience and hysteresis, same defaults."


@dataclass
class MLflowConf:
    tracking_uri: Optional[str] = None       # None: MLFLOW_TRACKING_URI, then mlflow's default
    experiment_name: Optional[str] = None
    run_name: Optional[str] = None
    table_file: str = "neuraldbg_events.json"


@dataclass
class WandbConf:
    project: Optional[str] = None
    mode: Optional[str] = None               # online / offline / disabled (None: WANDB_MODE or online)
    alert_states: List[str] = field(default_factory=lambda: ["VANISHING", "EXPLODING", "NON_FINITE"])
    alert_levels: Dict[str, str] = field(default_factory=dict)   # overrides, e.g. {VANISHING: ERROR}
    min_alert_interval_s: float = 300.0
    max_alerts: int = 20
    table_every: int = 100


@dataclass
class TensorBoardConf:
    log_dir: Optional[str] = None            # None: runs/<date>_<host> like SummaryWriter
    tag_prefix: str = "neuraldbg"


@dataclass
class NeuralDbgConf:
    enabled: bool = True
    sink: SinkName = SinkName.jsonl
    sinks: List[SinkName] = field(default_factory=list)
    journal: bool = True
    journal_dir: Optional[str] = None        # None: $NEURALDBG_DIR, then ./neuraldbg
    console: bool = True
    every_n_steps: int = 1
    max_events: int = 10_000
    patience: int = Thresholds.patience
    hysteresis: float = Thresholds.hysteresis
    include: List[str] = field(default_factory=list)
    exclude: List[str] = field(default_factory=list)
    module_types: List[str] = field(default_factory=list)
    activations: bool = True
    gradients: bool = True
    thresholds: ThresholdsConf = field(default_factory=ThresholdsConf)  # type: ignore[valid-type]
    mlflow: MLflowConf = field(default_factory=MLflowConf)
    wandb: WandbConf = field(default_factory=WandbConf)
    tensorboard: TensorBoardConf = field(default_factory=TensorBoardConf)



def register() -> None:
    """Put the schema in Hydra's ConfigStore (idempotent; done on import)."""
    ConfigStore.instance().store(group="neuraldbg", name="schema", node=NeuralDbgConf)


register()
