"""Device-side statistics: cheap reductions, one host transfer per observed step.

Forward hooks hand each watched output to a :class:`StepBuffer`. In eager mode small outputs are
not reduced at once: the buffer keeps a reference and reduces a batch of them together (one
``torch._foreach_norm`` for all their norms) when the root forward ends, when the batch reaches
:attr:`StepBuffer.batch_bytes`, or at the optimizer step, whichever comes first. Large outputs,
and every output under ``torch.compile`` (where the reductions fuse into the graph), are reduced
inside the hook. Nothing is read on the host until the optimizer step, where all results are packed
with the gradient norms into one vector per device and moved in a single transfer.

Activation statistics per layer: the L2 norm (RMS follows; NaN/Inf poison it, so a non-finite
output shows as a non-finite RMS), the number of *dead units* (units whose largest |output| over
the batch is exactly zero; the unit axis is the channel axis for feature maps and the last axis
otherwise) and, for bounded activations, the number of outputs at the bounds.
Gradient statistics per layer: the L2 norm of its own parameters' gradients; on the rare step where
it is not finite :func:`recheck_nonfinite` counts the bad values (and tells a float32 overflow of
huge but finite gradients from a real NaN/Inf).

Why no mean/std: a sum costs one more kernel per hook (~5 us on CPU) and no rule reads it; the
RMS carries the level that the ANOMALOUS rule judges.
"""
from __future__ import annotations

import math
from functools import lru_cache
from itertools import accumulate
from typing import Any, Iterable, NamedTuple, Sequence

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
LOW_PRECISION = (torch.float16, torch.bfloat16)


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

    norm: torch.Tensor              # () L2 norm of the outputs
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


def _unit_peak(probe: Probe, x: torch.Tensor) -> torch.Tensor | None:
    """Max |output| per unit (None where dead units are not judged). Measured in the training loop
    on CPU, ``amax`` + ``vector_norm`` beat a per-unit sum of squares (its temporary costs more
    than the pass it saves) and ``vector_norm`` over a ``dim`` (~8x slower)."""
    if not probe.dead_units:
        return None
    magnitude = x if probe.nonnegative else x.abs()
    ndim = x.dim()
    if ndim <= 1:
        return magnitude.reshape(-1)
    unit = 1 if (ndim >= 4 or (ndim == 3 and probe.channel_first)) else ndim - 1
    return magnitude.amax(dim=tuple(d for d in range(ndim) if d != unit))


def _saturated(probe: Probe, x: torch.Tensor) -> torch.Tensor | None:
    if probe.bounds is None:
        return None
    low, high = probe.bounds
    margin = probe.tolerance * (high - low)
    mid, half = (high + low) / 2, (high - low) / 2 - margin
    return torch.count_nonzero((x - mid if mid else x).abs() >= half)


def _norm(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dtype=torch.float32 if x.dtype in LOW_PRECISION else None)


def sample_activation(probe: Probe, x: torch.Tensor) -> ActivationSample:
    """Reduce one detached output on its device: one norm kernel (per unit where dead units are
    judged), plus a count at the bounds for bounded activations; no Welford ``std_mean``, which
    costs ~30x more on CPU. Shapes are static, so under ``torch.compile`` this adds no graph break."""
    return ActivationSample(_norm(x), _unit_peak(probe, x), _saturated(probe, x), x.numel())


def _foreach_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per-tensor L2 norms, one ``torch._foreach_norm`` launch per (device, dtype) group, in float32
    for half-precision inputs; a public per-tensor fallback where foreach is unavailable (sparse
    gradients, or a build without the private helper). NaN and Inf poison the norm."""
    norms: list[Any] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        if t.is_sparse:
            norms[i] = _norm(t.coalesce().values())
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
            result = [_norm(t) for t in group]
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


class _Block(NamedTuple):
    """Activation statistics of some layers packed into one vector on one device: [norms |
    saturated counts | cumulative dead-unit counts]; ``layout`` has, per layer, (index, numel,
    units, position of its norm, of its cumulative dead count, of its saturated count), None where
    absent."""

    vector: torch.Tensor
    layout: list[tuple[int, int, int, int, int | None, int | None]]


@lru_cache(maxsize=64)
def _ends(units: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Where each layer's units end in the concatenated peaks; layouts repeat, so built once."""
    return torch.tensor(list(accumulate(units)), device=device) - 1


def _pack(samples: list[tuple[int, ActivationSample]], device: torch.device) -> _Block:
    """A constant number of kernels however many layers there are."""
    sat = [s.saturated for _, s in samples if s.saturated is not None]
    parts = [torch.stack([s.norm for _, s in samples] + sat)]
    peaks = [s.unit_peak for _, s in samples if s.unit_peak is not None]
    if peaks:  # dead units of all layers: units whose peak is 0, counted with one cumsum
        flat = torch.cat(peaks) if len(peaks) > 1 else peaks[0]
        parts.append(flat.eq(0).cumsum(0)[_ends(tuple(p.numel() for p in peaks), device)])
    sat_pos = dead_pos = len(samples)
    dead_pos += len(sat)
    layout = []
    for k, (index, s) in enumerate(samples):
        dead = sat_at = None
        units = 0
        if s.unit_peak is not None:
            dead, dead_pos, units = dead_pos, dead_pos + 1, s.unit_peak.numel()
        if s.saturated is not None:
            sat_at, sat_pos = sat_pos, sat_pos + 1
        layout.append((index, s.numel, units, k, dead, sat_at))
    return _Block(torch.cat(parts) if len(parts) > 1 else parts[0], layout)


def _unpack(host: list[float], layout: list, acts: dict) -> None:
    previous = 0.0
    for index, numel, units, norm, dead, sat in layout:
        count = numel or 1
        dead_fraction = None
        if dead is not None:  # cumulative dead counts: difference them
            dead_fraction, previous = (host[dead] - previous) / (units or 1), host[dead]
        acts[index] = ActivationStats(host[norm] / math.sqrt(count), dead_fraction,
                                      None if sat is None else host[sat] / count, units)


class StepBuffer:
    """One step's activation samples (latest per layer, so gradient accumulation keeps the last
    micro-batch), packed per device when the forward ends and moved to the host with the gradient
    norms in one transfer at the optimizer step.

    Outputs are reduced inside their hook while they are still in cache. Only tiny outputs (up to
    :attr:`defer_bytes`), where a kernel launch costs more than its work, wait in a batch that one
    ``torch._foreach_norm`` reduces (at the end of the forward, when the batch holds
    :attr:`batch_bytes`, or at the step). A batched output may be changed by a later in-place op
    (``ReLU(inplace=True)`` after a Linear): its version counter tells, that sample is dropped and
    the layer is reduced inside its hook from then on (``in_place``).
    """

    defer_bytes = 16 * 1024
    batch_bytes = 512 * 1024

    def __init__(self) -> None:
        self.samples: dict[int, ActivationSample | None] = {}
        """Reduced, not yet packed; in the order the layers ran (batched ones are filled in by flush)."""
        self.in_place: set[int] = set()
        self.blocks: dict[torch.device, list[_Block]] = {}
        self._batch: list[tuple[Probe, torch.Tensor, int]] = []
        self._batch_bytes = 0

    def add(self, probe: Probe, y: torch.Tensor) -> None:
        """Take one layer output (called from its forward hook)."""
        x = y.detach()
        if torch.compiler.is_compiling() or probe.index in self.in_place:
            self.samples[probe.index] = sample_activation(probe, x)
            return
        size = x.numel() * x.element_size()
        if size > self.defer_bytes:
            self.samples[probe.index] = sample_activation(probe, x)
            return
        self._batch.append((probe, x, x._version))
        self.samples[probe.index] = None  # keeps the call order; set by _reduce_batch
        self._batch_bytes += size
        if self._batch_bytes >= self.batch_bytes:
            self._reduce_batch()

    def _reduce_batch(self) -> None:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        kept = []
        for item in batch:
            if item[1]._version == item[2]:
                kept.append(item)
            else:
                self.in_place.add(item[0].index)
                if self.samples.get(item[0].index) is None:
                    self.samples.pop(item[0].index, None)
        norms = _foreach_norms([x for _, x, _ in kept])
        samples = self.samples
        for (probe, x, _), norm in zip(kept, norms):
            samples[probe.index] = ActivationSample(norm, _unit_peak(probe, x), _saturated(probe, x), x.numel())

    def flush(self) -> None:
        """Reduce the batch and pack what this forward produced (the root's forward hook calls
        this; ``gather`` does too). Afterwards no output of the step is referenced."""
        if torch.compiler.is_compiling():
            return
        if self._batch:
            self._reduce_batch()
        if not self.samples:
            return
        samples, self.samples = self.samples, {}
        by_device: dict[torch.device, list] = {}
        for index, sample in samples.items():
            if sample is not None:
                device = sample.norm.device
                by_device.setdefault(device, []).append((index, sample))
        for device, items in by_device.items():
            self.blocks.setdefault(device, []).append(_pack(items, device))

    def clear(self) -> None:
        self.samples.clear()
        self.blocks.clear()
        self._batch, self._batch_bytes = [], 0

    @property
    def pending(self) -> int:
        """Outputs or statistics still held on the device for this step."""
        return len(self._batch) + len(self.samples) + sum(len(b) for b in self.blocks.values())

    def gather(self, grad_groups: Sequence[tuple[int, Sequence[torch.Tensor]]]
               ) -> tuple[dict[int, ActivationStats], dict[int, GradientStats]]:
        """Pack the gradient norms beside the activation blocks, transfer once per device, and
        unpack to host floats. ``grad_groups`` is ``[(layer_index, [grad, ...]), ...]``."""
        self.flush()
        blocks, self.blocks = self.blocks, {}
        grads_by_device: dict[torch.device, list] = {}
        for index, grads in grad_groups:
            grads_by_device.setdefault(grads[0].device, []).append((index, grads))
        acts: dict[int, ActivationStats] = {}
        grads_out: dict[int, GradientStats] = {}
        for device in {**blocks, **grads_by_device}:
            _gather_device(blocks.get(device, []), grads_by_device.get(device, []), acts, grads_out)
        return acts, grads_out


def _gather_device(blocks: list[_Block], grad_items: list, acts: dict, grads_out: dict) -> None:
    flat = [g for _, gs in grad_items for g in gs]
    parts = [b.vector for b in blocks]
    if flat:
        parts.append(torch.stack(_foreach_norms(flat)))
    host = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()  # the one host transfer
    pos = 0
    for block in blocks:  # later blocks (later forwards of the step) overwrite earlier ones
        size = block.vector.numel()
        _unpack(host[pos:pos + size], block.layout, acts)
        pos += size
    for index, gs in grad_items:
        if len(gs) == 1:
            norm = host[pos]
        else:  # the layer's norm from its tensors' norms: sqrt of the sum of squares
            norm = math.sqrt(math.fsum(n * n for n in host[pos:pos + len(gs)]))
        pos += len(gs)
        grads_out[index] = GradientStats(norm, not math.isfinite(norm), len(gs))
