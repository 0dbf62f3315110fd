"""Device-side statistics: cheap reductions inside hooks, one host transfer per observed step.

Inside a forward hook only device reductions run (no ``.item()``, no ``.cpu()``); their small
results wait in a :class:`StepBuffer` until the optimizer step, where they are packed with the
gradient norms into one vector per device and moved to the host in a single transfer.

Activation statistics per layer: sum and L2 norm (mean, RMS and std follow), the number of *dead
units* (units whose largest |output| over the batch is exactly zero; the unit axis is the channel
axis for feature maps and the last axis otherwise) and, for bounded activations, the number of
outputs at the bounds. A non-finite activation shows as a non-finite sum or norm.
Gradient statistics per layer: the L2 norm of its own parameters' gradients; NaN and Inf poison
it, and on the rare step where it is not finite :func:`recheck_nonfinite` counts the bad values
(and tells a float32 overflow of huge but finite gradients from a real NaN/Inf).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Any, Iterable, Sequence

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
# Affine and normalising layers: an exactly-zero output unit there means zero weights, not a dead
# unit, so their outputs are not scanned for dead units (one kernel less per hook).
AFFINE = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.Embedding, nn.EmbeddingBag,
          nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, getattr(nn, "RMSNorm", nn.LayerNorm),
          nn.modules.rnn.RNNBase)
# Modules whose dim 1 is the channel (unit) axis even for 3-D outputs.
CHANNEL_FIRST = (nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm,
                 nn.modules.instancenorm._InstanceNorm, nn.GroupNorm)


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


@dataclass(frozen=True)
class Probe:
    """How one layer's output is reduced; fixed when hooks are installed."""

    index: int
    channel_first: bool
    bounds: tuple[float, float] | None
    tolerance: float
    nonnegative: bool = False  # outputs are >= 0 (ReLU family, sigmoid): max == 0 means dead
    dead_units: bool = True    # judge dead units (not on affine/normalising layers: see AFFINE)


@dataclass
class ActivationSample:
    """Device tensors produced by one hook call (nothing here is on the host)."""

    total: torch.Tensor            # () sum of the outputs
    norm: torch.Tensor             # () L2 norm of the outputs
    unit_peak: torch.Tensor | None  # (units,) max |output| per unit: 0 means the unit never fired
    saturated: torch.Tensor | None  # () outputs at the bounds
    numel: int


def sample_activation(probe: Probe, y: torch.Tensor) -> ActivationSample:
    """Reduce one output on its device with a few cheap kernels (sum, norm, amax; no Welford
    ``std_mean``, which costs ~30x more on CPU). Shapes are static, so this adds no graph break.
    No ``no_grad`` needed: everything derives from ``y.detach()``, which autograd does not track."""
    x = y.detach()
    if x.dtype != torch.float32 and x.dtype != torch.float64:
        x = x.float()
    ndim = x.dim()
    peak = None
    if probe.dead_units:
        magnitude = x if probe.nonnegative else x.abs()
        if ndim <= 1:
            peak = magnitude.reshape(-1)
        else:
            unit = 1 if (ndim >= 4 or (ndim == 3 and probe.channel_first)) else ndim - 1
            peak = magnitude.amax(dim=tuple(d for d in range(ndim) if d != unit))
    saturated = None
    if probe.bounds is not None:
        low, high = probe.bounds
        margin = probe.tolerance * (high - low)
        mid, half = (high + low) / 2, (high - low) / 2 - margin
        saturated = torch.count_nonzero((x - mid).abs() >= half)
    return ActivationSample(x.sum(), torch.linalg.vector_norm(x), peak, saturated, x.numel())


@dataclass(frozen=True)
class ActivationStats:
    mean: float
    std: float
    rms: float
    dead_fraction: float | None  # None where dead units are not judged (affine layers)
    saturated_fraction: float | None
    units: int

    @property
    def finite(self) -> bool:
        return math.isfinite(self.mean) and math.isfinite(self.std)


@dataclass(frozen=True)
class GradientStats:
    norm: float
    nonfinite: bool
    parameters: int
    nonfinite_count: int | None = None
    """Counted only on the rare step where ``nonfinite`` is set (it costs one more transfer)."""


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


class StepBuffer:
    """Collects one step's activation samples (latest per layer, so gradient accumulation
    keeps the last micro-batch) and packs them with gradient norms for one host transfer."""

    def __init__(self) -> None:
        self.activations: dict[int, ActivationSample] = {}

    def clear(self) -> None:
        self.activations.clear()

    @torch.no_grad()
    def gather(self, grad_groups: Sequence[tuple[int, Sequence[torch.Tensor]]]
               ) -> tuple[dict[int, ActivationStats], dict[int, GradientStats]]:
        """Pack everything on the device, transfer once per device, and unpack to host floats.

        ``grad_groups`` is ``[(layer_index, [grad, ...]), ...]`` for the layers with gradients.
        """
        samples = self.activations
        self.activations = {}
        by_device: dict[torch.device, list] = {}
        for index, sample in samples.items():
            by_device.setdefault(sample.total.device, []).append(("a", index, sample))
        for index, grads in grad_groups:
            by_device.setdefault(grads[0].device, []).append(("g", index, grads))
        acts: dict[int, ActivationStats] = {}
        grads_out: dict[int, GradientStats] = {}
        for device, items in by_device.items():
            _gather_device(device, items, acts, grads_out)
        return acts, grads_out


def _grad_norms(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-tensor L2 norms, batched by dtype with ``torch._foreach_norm`` (one launch per group),
    falling back to one norm per tensor where foreach is unavailable (e.g. sparse gradients).
    NaN and Inf poison the norm, so a non-finite gradient needs no second pass to be seen."""
    norms: list[torch.Tensor | None] = [None] * len(grads)
    groups: dict[torch.dtype, list[int]] = {}
    for i, g in enumerate(grads):
        if g.is_sparse:
            norms[i] = torch.linalg.vector_norm(g.coalesce().values().float())
        else:
            groups.setdefault(g.dtype, []).append(i)
    for members in groups.values():
        tensors = [grads[i] for i in members]
        try:
            result = torch._foreach_norm(tensors)
        except (RuntimeError, AttributeError, TypeError):  # private helper: keep a public fallback
            result = [torch.linalg.vector_norm(t) for t in tensors]
        for i, n in zip(members, result):
            norms[i] = n.float()
    return norms  # type: ignore[return-value]


@lru_cache(maxsize=64)
def _index(values: tuple[int, ...], device: torch.device, offset: int = 0) -> torch.Tensor:
    """An index tensor for a step's layout; layouts repeat every step, so it is built once."""
    return torch.tensor([v + offset for v in values], device=device)


def _gather_device(device: torch.device, items: list, acts: dict, grads_out: dict) -> None:
    act_items = [(i, s) for kind, i, s in items if kind == "a"]
    grad_items = [(i, g) for kind, i, g in items if kind == "g"]
    parts: list[torch.Tensor] = []
    if act_items:
        parts.append(torch.stack([t for _, s in act_items for t in (s.total, s.norm)]).float())
        # dead units per layer: units whose peak is 0, counted for all layers with one cumsum.
        peaks = [s.unit_peak for _, s in act_items if s.unit_peak is not None]
        if peaks:
            ends = _index(tuple(accumulate(p.numel() for p in peaks)), device, offset=-1)
            parts.append(torch.cat(peaks).float().eq(0).cumsum(0)[ends].float())
        sat = [s.saturated for _, s in act_items if s.saturated is not None]
        if sat:
            parts.append(torch.stack(sat).float())
    if grad_items:
        flat = [g for _, gs in grad_items for g in gs]
        owner = [k for k, (_, gs) in enumerate(grad_items) for _ in gs]
        index = _index(tuple(owner), device)
        sq = torch.zeros(len(grad_items), device=device).index_add_(0, index, torch.stack(_grad_norms(flat)).square())
        parts.append(sq.sqrt())
    host = torch.cat(parts).tolist()  # the one host transfer for this device and step
    pos = 0
    if act_items:
        n = len(act_items)
        dead_pos = 2 * n                                   # layout: sums | dead counts | saturated | grads
        sat_pos = dead_pos + sum(s.unit_peak is not None for _, s in act_items)
        pos = sat_pos + sum(s.saturated is not None for _, s in act_items)
        previous = 0.0
        for k, (index, sample) in enumerate(act_items):
            count = max(sample.numel, 1)
            mean, rms = host[2 * k] / count, host[2 * k + 1] / math.sqrt(count)
            std = math.sqrt(max(rms * rms - mean * mean, 0.0)) if math.isfinite(rms) else math.nan
            dead_fraction, units, saturated = None, 0, None
            if sample.unit_peak is not None:             # cumulative dead counts: difference them
                units = sample.unit_peak.numel()
                dead_fraction = (host[dead_pos] - previous) / max(units, 1)
                previous = host[dead_pos]
                dead_pos += 1
            if sample.saturated is not None:
                saturated = host[sat_pos] / count
                sat_pos += 1
            acts[index] = ActivationStats(mean, std, rms, dead_fraction, saturated, units)
    if grad_items:
        n = len(grad_items)
        for k, (index, gs) in enumerate(grad_items):
            norm = host[pos + k]
            grads_out[index] = GradientStats(norm, not math.isfinite(norm), len(gs))
