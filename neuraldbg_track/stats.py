"""Device-side statistics of one layer: which layers are judged how, and the reductions.

Activation statistics per layer: the sum of squares (RMS follows; NaN/Inf poison it, so a
non-finite output shows as a non-finite RMS), the number of *dead units* (units whose largest
|output| over the batch is exactly zero; the unit axis is the channel axis for feature maps and
the last axis otherwise) and, for bounded activations, the number of outputs at the bounds.
Gradient statistics per layer: the L2 norm of its own parameters' gradients; on the rare step where
it is not finite :func:`recheck_nonfinite` counts the bad values (and tells a float32 overflow of
huge but finite gradients from a real NaN/Inf).

No mean or std: a sum costs one more kernel per hook (~5 us on CPU) and no rule reads it; the RMS
carries the level that the ANOMALOUS rule judges. How a step's statistics are batched, packed and
moved to the host: :mod:`neuraldbg_track.buffer`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import torch
from torch import nn

# Bounded activations: output range (low, high). Saturation is judged only on these.
# Hardtanh (and its subclass ReLU6) carry their own range; see output_bounds.
BOUNDED_OUTPUTS: dict[type, tuple[float, float]] = {
    nn.Tanh: (-1.0, 1.0), nn.Sigmoid: (0.0, 1.0), nn.Softsign: (-1.0, 1.0), nn.Hardsigmoid: (0.0, 1.0),
}
# Modules whose output only repeats their input: watching them costs kernels and tells nothing new.
PASS_THROUGH = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                nn.Flatten, nn.Unflatten)
# Modules whose outputs are never negative, so the per-unit peak needs no abs().
NONNEGATIVE = (nn.ReLU, nn.ReLU6, nn.Sigmoid, nn.Hardsigmoid, nn.Softplus, nn.Softmax)
# Affine, normalising and pooling layers: an exactly-zero output unit there means zero weights or a
# dead unit upstream (judged where it dies), not a dead unit of their own, so their outputs are not
# scanned for dead units (one or two kernels less per hook).
AFFINE = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.Embedding, nn.EmbeddingBag,
          nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, getattr(nn, "RMSNorm", nn.LayerNorm),
          nn.modules.rnn.RNNBase, nn.MultiheadAttention,  # attention ends in its out_proj (a Linear)
          nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd, nn.modules.pooling._AdaptiveAvgPoolNd,
          nn.modules.pooling._AdaptiveMaxPoolNd)
# Modules whose dim 1 is the channel (unit) axis even for 3-D outputs.
CHANNEL_FIRST = (nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm,
                 nn.modules.instancenorm._InstanceNorm, nn.GroupNorm)
LOW_PRECISION = (torch.float16, torch.bfloat16)
is_compiling = torch.compiler.is_compiling  # bound once: called on every hook; dynamo still sees through it


def output_bounds(module: nn.Module) -> tuple[float, float] | None:
    """The (low, high) range of a bounded activation module, or None for unbounded outputs."""
    if isinstance(module, nn.Hardtanh):  # also covers ReLU6
        return (float(module.min_val), float(module.max_val))
    for kind, bounds in BOUNDED_OUTPUTS.items():
        if isinstance(module, kind):
            return bounds
    return None


def first_tensor(output: Any) -> torch.Tensor | None:
    """The tensor to judge from a module output: itself, or the first tensor of a tuple/list/dict."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        values: Iterable[Any] = output
    elif isinstance(output, dict):
        values = output.values()
    else:
        return None
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
    return None


class Probe(NamedTuple):
    """How one layer's output is reduced; fixed when hooks are installed."""

    index: int
    channel_first: bool
    bounds: tuple[float, float] | None
    tolerance: float
    nonnegative: bool = False  # outputs are >= 0 (ReLU family, sigmoid): max == 0 means dead
    dead_units: bool = True    # judge dead units (not on affine/normalising layers: see AFFINE)


class ActivationSample(NamedTuple):
    """Device tensors reduced from one output (nothing here is on the host)."""

    square: torch.Tensor            # () sum of squares of the outputs (RMS follows; NaN/Inf poison it)
    unit_peak: torch.Tensor | None  # (units,) max |output| per unit: 0 means the unit never fired
    saturated: torch.Tensor | None  # () outputs at the bounds
    numel: int


class ActivationStats(NamedTuple):
    rms: float
    dead_fraction: float | None  # None where dead units are not judged (affine layers)
    saturated_fraction: float | None
    units: int

    @property
    def finite(self) -> bool:
        return math.isfinite(self.rms)


class GradientStats(NamedTuple):
    norm: float
    nonfinite: bool
    parameters: int
    nonfinite_count: int | None = None
    """Counted only on the rare step where ``nonfinite`` is set (it costs one more transfer)."""


def unit_peak(probe: Probe, x: torch.Tensor) -> torch.Tensor | None:
    """Max |output| per unit (None where dead units are not judged). Measured in the training loop
    on CPU, ``amax`` + ``vector_norm`` beat a per-unit sum of squares (its temporary costs more
    than the pass it saves) and ``vector_norm`` over a ``dim`` (~8x slower)."""
    if not probe.dead_units:
        return None
    magnitude = x if probe.nonnegative else x.abs()
    dims = batch_dims(x.dim(), probe.channel_first)
    return magnitude.reshape(-1) if dims is None else magnitude.amax(dim=dims)


@lru_cache(maxsize=32)
def batch_dims(ndim: int, channel_first: bool) -> tuple[int, ...] | None:
    """The dims reduced to get per-unit values: all but the unit axis (the channel axis for
    feature maps, the last axis otherwise); None for 0-D/1-D outputs, where each element is a unit."""
    if ndim <= 1:
        return None
    unit = 1 if (ndim >= 4 or (ndim == 3 and channel_first)) else ndim - 1
    return tuple(d for d in range(ndim) if d != unit)


def at_bounds(probe: Probe, x: torch.Tensor) -> torch.Tensor:
    """Which outputs of a bounded activation sit within ``tolerance`` of its range's ends."""
    low, high = probe.bounds  # type: ignore[misc]
    mid, half = (high + low) / 2, (high - low) / 2 - probe.tolerance * (high - low)
    return (x - mid if mid else x).abs() >= half


def saturated_count(probe: Probe, x: torch.Tensor) -> torch.Tensor | None:
    return None if probe.bounds is None else torch.count_nonzero(at_bounds(probe, x))


def l2_norm(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dtype=torch.float32 if x.dtype in LOW_PRECISION else None)


def sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """``dot(x, x)`` (BLAS) where it applies: on CPU ~3x faster than ``vector_norm`` on large
    tensors and no slower on small ones; half precision and non-contiguous tensors take the norm
    (in float32) and square it."""
    if (x.dtype is torch.float32 or x.dtype is torch.float64) and x.is_contiguous():
        flat = x.view(-1)
        return torch.dot(flat, flat)
    norm = l2_norm(x)
    return norm * norm


def sample_activation(probe: Probe, x: torch.Tensor) -> ActivationSample:
    """Reduce one detached output on its device: its sum of squares, the per-unit peak where dead
    units are judged, the count at the bounds for bounded activations; no Welford ``std_mean``
    (~30x slower on CPU). Shapes are static, so under ``torch.compile`` this adds no graph break."""
    return ActivationSample(sum_of_squares(x), unit_peak(probe, x), saturated_count(probe, x), x.numel())


def foreach_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-tensor L2 norms, one ``torch._foreach_norm`` launch per (device, dtype) group, in float32
    for half-precision inputs; a public per-tensor fallback where foreach is unavailable (sparse
    gradients, or a build without the private helper). NaN and Inf poison the norm."""
    norms: list[Any] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        if t.is_sparse:
            norms[i] = l2_norm(t.coalesce().values())
        else:
            groups.setdefault((t.device, t.dtype), []).append(i)
    for (_, dtype), members in groups.items():
        group = [tensors[i] for i in members]
        try:
            if dtype in LOW_PRECISION:
                result = torch._foreach_norm(group, 2, dtype=torch.float32)
            else:
                result = torch._foreach_norm(group)
        except (RuntimeError, AttributeError, TypeError):  # private helper: keep a public fallback
            result = [l2_norm(t) for t in group]
        for i, n in zip(members, result):
            norms[i] = n
    return norms


@torch.no_grad()
def recheck_nonfinite(stats: GradientStats, grads: Sequence[torch.Tensor]) -> GradientStats:
    """Rare path for a non-finite norm: count NaN/Inf values; if there are none, the float32 sum of
    squares overflowed, so recompute the norm in float64 (a huge gradient is EXPLODING, not NaN)."""
    dense = [g.coalesce().values() if g.is_sparse else g for g in grads]
    bad = sum(int((~torch.isfinite(g)).sum()) for g in dense)
    if bad:
        return GradientStats(stats.norm, True, stats.parameters, bad)
    norm = math.sqrt(sum(float(torch.linalg.vector_norm(g.double())) ** 2 for g in dense))
    return GradientStats(norm, not math.isfinite(norm), stats.parameters, 0)
