"""Build a NeuralDbg from a Hydra/OmegaConf node (``cfg.neuraldbg``), failing before training starts.

Type, enum and unknown-key errors come from OmegaConf (they name the key and the allowed values);
range errors from :class:`Thresholds` / :class:`WatchConfig`, re-worded with the ``neuraldbg.`` key a
Hydra user types. See :mod:`neuraldbg_track.hydra_conf` for the schema.
"""
from __future__ import annotations

import re
from dataclasses import fields
from typing import Any, Callable

from torch import nn

from .config import ConfigError, Thresholds, WatchConfig
from .debugger import NeuralDbg

PREFIX = "neuraldbg"


def validated(cfg: Any):
    """``cfg`` (a DictConfig, dict or NeuralDbgConf) merged onto the schema: wrong types, unknown keys
    and bad sink names raise here."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from .hydra_conf import NeuralDbgConf

    try:
        return OmegaConf.merge(OmegaConf.structured(NeuralDbgConf), cfg if cfg is not None else {})
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        where = f" (key: {PREFIX}.{key})" if key else ""
        raise ConfigError(f"bad neuraldbg config{where}: {str(exc).splitlines()[0]}") from None


def _prefixed(exc: ConfigError) -> ConfigError:
    message = re.sub(r"thresholds\.(patience|hysteresis)\b", r"\1", str(exc))
    message = re.sub(r"(?<![\w.])(thresholds\.\w+|every_n_steps|max_events|include|exclude|module_types"
                     r"|patience|hysteresis)", PREFIX + r".\1", message)
    return ConfigError(message)


def watch_config(conf: Any) -> WatchConfig:
    threshold_names = {f.name for f in fields(Thresholds)}
    values = {k: v for k, v in dict(conf.thresholds).items() if k in threshold_names}
    values.update(patience=conf.patience, hysteresis=conf.hysteresis)
    try:
        return WatchConfig(every_n_steps=conf.every_n_steps, max_events=conf.max_events,
                           include=list(conf.include), exclude=list(conf.exclude),
                           module_types=list(conf.module_types), activations=conf.activations,
                           gradients=conf.gradients, thresholds=Thresholds(**values))
    except ConfigError as exc:
        raise _prefixed(exc) from None


def _mlflow(conf: Any):
    from .integrations.mlflow import MLflowSink
    c = conf.mlflow
    return MLflowSink(tracking_uri=c.tracking_uri, experiment_name=c.experiment_name, run_name=c.run_name,
                      table_file=c.table_file)


def _wandb(conf: Any):
    from .integrations.wandb import WandbSink
    c = conf.wandb
    return WandbSink(project=c.project, alert_states=list(c.alert_states), alert_levels=dict(c.alert_levels),
                     min_alert_interval_s=c.min_alert_interval_s, max_alerts=c.max_alerts,
                     table_every=c.table_every, init_kwargs={"mode": c.mode} if c.mode else None)


def _tensorboard(conf: Any):
    from .integrations.tensorboard import TensorBoardSink
    return TensorBoardSink(log_dir=conf.tensorboard.log_dir, tag_prefix=conf.tensorboard.tag_prefix)


TRACKERS: dict[str, Callable[[Any], Any]] = {"mlflow": _mlflow, "wandb": _wandb, "tensorboard": _tensorboard}


def chosen_sinks(conf: Any) -> list[str]:
    names = [conf.sink.name] + [s.name for s in conf.sinks]
    return list(dict.fromkeys(names))


def from_config(cfg: Any, model: nn.Module, optimizer=None, **extra: Any) -> NeuralDbg:
    """``NeuralDbg`` configured from ``cfg`` (e.g. ``cfg.neuraldbg`` of a Hydra app)."""
    conf = validated(cfg)
    watch = watch_config(conf)
    names = chosen_sinks(conf)
    sinks = list(extra.pop("sinks", ()))
    if conf.enabled:
        for name in names:
            if name in TRACKERS:
                try:
                    sinks.append(TRACKERS[name](conf))
                except (ValueError, TypeError) as exc:
                    raise ConfigError(f"{PREFIX}.{name}: {exc}") from None
    journal: Any = conf.journal_dir if (conf.journal and conf.journal_dir) else conf.journal
    console = conf.console or "console" in names
    try:
        return NeuralDbg(model, optimizer, sinks=sinks, journal=journal, console=console, config=watch,
                         enabled=conf.enabled, **extra)
    except ConfigError as exc:  # e.g. an include pattern that matches no layer
        raise _prefixed(exc) from None
