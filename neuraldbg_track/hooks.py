"""Which layers are watched, and the hooks that watch them.

Activation layers are leaf modules (no children; the root only if it is itself a leaf), minus
pass-through modules (Identity, Dropout, Flatten). Gradient layers are modules that own
parameters directly (``recurse=False``); a parameter shared by several modules is judged once,
under its first owner in ``named_modules()`` order. Layer names are bound in closures when the
hooks are installed: nothing is looked up per call and nothing is written onto the user's modules.
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Callable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .buffer import StepBuffer
from .config import ConfigError, WatchConfig
from .stats import AFFINE, CHANNEL_FIRST, NONNEGATIVE, PASS_THROUGH, Probe, first_tensor, output_bounds

ROOT_NAME = "<root>"


@dataclass(frozen=True)
class Layer:
    index: int
    name: str
    module: nn.Module
    probe: Probe | None                  # set when activations are watched
    params: tuple[nn.Parameter, ...]     # own trainable parameters judged for gradient health


def _wanted(name: str, module: nn.Module, cfg: WatchConfig) -> bool:
    if cfg.include and not any(fnmatchcase(name, p) for p in cfg.include):
        return False
    if any(fnmatchcase(name, p) for p in cfg.exclude):
        return False
    return not cfg.module_types or type(module).__name__ in cfg.module_types


def select_layers(model: nn.Module, cfg: WatchConfig) -> list[Layer]:
    """The watched layers, in model order. Patterns that match no layer are refused by name."""
    seen: set[int] = set()
    layers: list[Layer] = []
    names = [(name or ROOT_NAME, module) for name, module in model.named_modules()]
    for pattern_key in ("include", "exclude"):
        for pattern in getattr(cfg, pattern_key):
            if not any(fnmatchcase(n, pattern) for n, _ in names):
                sample = ", ".join(n for n, _ in names[:8])
                raise ConfigError(f"{pattern_key} pattern {pattern!r} matches no layer of "
                                  f"{type(model).__name__}; layer names look like: {sample}")
    for name, module in names:
        if not _wanted(name, module, cfg):
            continue
        params = []
        if cfg.gradients:
            for p in module.parameters(recurse=False):
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        is_leaf = next(iter(module.children()), None) is None
        probe = None
        if cfg.activations and is_leaf and not isinstance(module, PASS_THROUGH):
            probe = Probe(len(layers), isinstance(module, CHANNEL_FIRST), output_bounds(module),
                          cfg.thresholds.saturation_tolerance, isinstance(module, NONNEGATIVE),
                          dead_units=not isinstance(module, AFFINE))
        if probe is not None or params:
            layers.append(Layer(len(layers), name, module, probe, tuple(params)))
    return layers


class Gate:
    """What the hooks read on every call: whether this step is observed, and the root's mode."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.observing = True


def _forward_hook(probe: Probe, buffer: StepBuffer, gate: Gate) -> Callable:
    add, root, grad_enabled, tensor = buffer.add, gate.root, torch.is_grad_enabled, torch.Tensor

    def hook(module: nn.Module, inputs: object, output: object) -> None:
        # Only training passes count: no eval(), no no_grad/inference forwards.
        if not gate.observing or not root.training or not grad_enabled():
            return
        y = output if type(output) is tensor else first_tensor(output)
        if y is None or not y.is_floating_point() or y.numel() == 0:
            return
        add(probe, y)
    return hook


def _flush_hook(buffer: StepBuffer, gate: Gate) -> Callable:
    """On the root: the forward is over, so reduce the outputs batched during it (their memory is
    released before backward instead of at the optimizer step)."""
    def hook(module: nn.Module, inputs: object, output: object) -> None:
        if gate.observing:
            buffer.flush()
    return hook


class HookSet:
    """Owns every handle it registers and removes them all in :meth:`remove`."""

    def __init__(self) -> None:
        self.handles: list[RemovableHandle] = []

    def install_forward(self, layers: list[Layer], buffer: StepBuffer, gate: Gate) -> None:
        for layer in layers:
            if layer.probe is not None:
                self.handles.append(layer.module.register_forward_hook(_forward_hook(layer.probe, buffer, gate)))
        if any(layer.probe is not None for layer in layers):
            self.handles.append(gate.root.register_forward_hook(_flush_hook(buffer, gate)))

    def install_optimizer(self, optimizer: torch.optim.Optimizer, before: Callable[[], None],
                          after: Callable[[], None]) -> None:
        if not hasattr(optimizer, "register_step_pre_hook"):
            raise TypeError(f"{type(optimizer).__name__} has no register_step_pre_hook (torch.optim.Optimizer "
                            "subclasses have it); pass optimizer=None and call dbg.step() after each step")
        self.handles.append(optimizer.register_step_pre_hook(lambda opt, args, kwargs: before()))
        self.handles.append(optimizer.register_step_post_hook(lambda opt, args, kwargs: after()))

    def remove(self) -> None:
        while self.handles:
            self.handles.pop().remove()
