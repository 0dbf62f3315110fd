"""Device-side statistics: cheap reductions, one host transfer per observed step.

Data flow of one observed step (see :class:`StepBuffer`):

1. forward hooks hand each watched output to the buffer. Outputs above :data:`TINY` elements are
   reduced at once, while they are still in cache (1-2 kernels: a norm, a per-unit ``amax`` where
   dead units are judged). Tiny outputs, where a kernel launch costs far more than its work, wait
   and are stacked by shape and reduced together (a constant number of kernels per shape). Under
   ``torch.compile`` every output is reduced in the hook, so the reductions fuse into the graph.
2. when the root module's forward ends, everything is packed into one small vector per device and
   no reference to any output remains.
3. at the optimizer step the gradient norms are added (``torch._foreach_norm`` for large
   gradients, stacked by shape for tiny ones), and one ``tolist()`` per device moves it all to
   the host, where each layer's figures are unpacked and the gradient tensors of a layer combined.

Measured on CPU, in the training loop (not in isolation, where caches flatter every kernel):
deferring the reduction of mid-size outputs to a ``_foreach_norm`` at the end of the forward was
slower (they had left the cache), and so were a per-unit sum of squares (its temporary) and
``vector_norm`` over a ``dim`` (~8x slower than ``amax`` + ``vector_norm``).

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
_is_compiling = torch.compiler.is_compiling  # bound once: called on every hook; dynamo still sees through it


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


def _unit_peak(probe: Probe, x: torch.Tensor) -> torch.Tensor | None:
    """Max |output| per unit (None where dead units are not judged). Measured in the training loop
    on CPU, ``amax`` + ``vector_norm`` beat a per-unit sum of squares (its temporary costs more
    than the pass it saves) and ``vector_norm`` over a ``dim`` (~8x slower)."""
    if not probe.dead_units:
        return None
    magnitude = x if probe.nonnegative else x.abs()
    dims = _batch_dims(x.dim(), probe.channel_first)
    return magnitude.reshape(-1) if dims is None else magnitude.amax(dim=dims)


@lru_cache(maxsize=32)
def _batch_dims(ndim: int, channel_first: bool) -> tuple[int, ...] | None:
    """The dims reduced to get per-unit values: all but the unit axis (the channel axis for
    feature maps, the last axis otherwise); None for 0-D/1-D outputs, where each element is a unit."""
    if ndim <= 1:
        return None
    unit = 1 if (ndim >= 4 or (ndim == 3 and channel_first)) else ndim - 1
    return tuple(d for d in range(ndim) if d != unit)


def _saturated(probe: Probe, x: torch.Tensor) -> torch.Tensor | None:
    if probe.bounds is None:
        return None
    low, high = probe.bounds
    margin = probe.tolerance * (high - low)
    mid, half = (high + low) / 2, (high - low) / 2 - margin
    return torch.count_nonzero((x - mid if mid else x).abs() >= half)


def _norm(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, dtype=torch.float32 if x.dtype in LOW_PRECISION else None)


def _sum_of_squares(x: torch.Tensor) -> torch.Tensor:
    """``dot(x, x)`` (BLAS) where it applies: on CPU ~3x faster than ``vector_norm`` on large
    tensors and no slower on small ones; half precision and non-contiguous tensors take the norm
    (in float32) and square it."""
    if (x.dtype is torch.float32 or x.dtype is torch.float64) and x.is_contiguous():
        flat = x.view(-1)
        return torch.dot(flat, flat)
    norm = _norm(x)
    return norm * norm


def sample_activation(probe: Probe, x: torch.Tensor) -> ActivationSample:
    """Reduce one detached output on its device: its sum of squares, the per-unit peak where dead
    units are judged, the count at the bounds for bounded activations; no Welford ``std_mean``
    (~30x slower on CPU). Shapes are static, so under ``torch.compile`` this adds no graph break."""
    return ActivationSample(_sum_of_squares(x), _unit_peak(probe, x), _saturated(probe, x), x.numel())


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


TINY = 4096
"""Tensors of at most this many elements are reduced as one flattened batch: for them a kernel
launch (~3-5 us on CPU, even inside ``_foreach_norm``) costs far more than the work."""


class _Block(NamedTuple):
    """Statistics of some layers packed into one vector on one device: [sums of squares (n) |
    dead-unit counts (n) | saturated counts (one per bounded layer)]. ``layout``: per layer (index,
    numel, units judged for deadness (0: none), position of its saturated count or -1)."""

    vector: torch.Tensor
    layout: list[tuple[int, int, int, int]]


def _dead_counts(peaks: list[tuple[int, torch.Tensor]], n: int, device: torch.device, dtype: torch.dtype
                 ) -> torch.Tensor:
    """Units whose peak is exactly 0, per layer slot; ``peaks`` is [(slot, per-unit peaks)]."""
    if not peaks:
        return torch.zeros(n, device=device, dtype=dtype)
    flat = torch.cat([p for _, p in peaks]) if len(peaks) > 1 else peaks[0][1]
    counts = [p.numel() for _, p in peaks]
    slots = _slots(tuple(k for k, _ in peaks), tuple(counts), device)
    return torch.zeros(n, device=device, dtype=dtype).index_add_(0, slots, flat.eq(0).to(dtype))


@lru_cache(maxsize=256)
def _slots(positions: tuple[int, ...], counts: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """For concatenated per-unit values: the layer slot of each (``counts[k]`` values go to
    ``positions[k]``). Layouts repeat every step, so each is built once."""
    # built on the host and copied: repeat_interleave on an accelerator reads the output size back (a sync)
    return torch.repeat_interleave(torch.tensor(positions), torch.tensor(counts)).to(device)


def _pack(samples: list[tuple[int, ActivationSample]], device: torch.device) -> _Block:
    """Samples reduced one layer at a time, packed with a constant number of kernels."""
    n = len(samples)
    sat = [s.saturated for _, s in samples if s.saturated is not None]
    squares = torch.stack([s.square for _, s in samples])
    peaks = [(k, s.unit_peak) for k, (_, s) in enumerate(samples) if s.unit_peak is not None]
    parts = [squares, _dead_counts(peaks, n, device, squares.dtype)]
    if sat:
        parts.append(torch.stack(sat).to(squares.dtype))
    layout, sat_pos = [], 2 * n
    for i, s in samples:
        layout.append((i, s.numel, 0 if s.unit_peak is None else s.unit_peak.numel(),
                       -1 if s.saturated is None else sat_pos))
        sat_pos += s.saturated is not None
    return _Block(torch.cat(parts), layout)


def _tiny_block(items: list[tuple[Probe, torch.Tensor]], device: torch.device) -> _Block:
    """Tiny outputs of one shape, dtype and probe kind, stacked into one tensor (one copy, ~0.3 us
    per output where a kernel costs ~3-5 us) and reduced along the stacked dim: sums of squares,
    dead units from one ``amax``, outputs at the bounds."""
    probe = items[0][0]
    stacked = torch.stack([x for _, x in items])
    if stacked.dtype in LOW_PRECISION:
        stacked = stacked.float()
    m, ndim = len(items), stacked.dim()
    every = tuple(range(1, ndim))
    squares = (stacked * stacked).sum(every)
    parts = [squares]
    units = 0
    if probe.bounds is not None:
        low, high = probe.bounds
        margin = probe.tolerance * (high - low)
        mid, half = (high + low) / 2, (high - low) / 2 - margin
        saturated = ((stacked - mid if mid else stacked).abs() >= half).sum(every, dtype=squares.dtype)
    if probe.dead_units:
        magnitude = stacked if probe.nonnegative else stacked.abs()
        dims = _batch_dims(ndim - 1, probe.channel_first)  # of one output; +1 for the stacked dim
        peaks = magnitude.reshape(m, -1) if dims is None else magnitude.amax(dim=tuple(d + 1 for d in dims))
        units = peaks.shape[1]
        parts.append(peaks.eq(0).sum(1, dtype=squares.dtype))
    else:
        parts.append(torch.zeros(m, device=device, dtype=squares.dtype))
    if probe.bounds is not None:
        parts.append(saturated)
    layout = [(p.index, x.numel(), units, 2 * m + j if probe.bounds is not None else -1)
              for j, (p, x) in enumerate(items)]
    return _Block(torch.cat(parts), layout)


def _unpack(host: list[float], block: _Block, acts: dict) -> None:
    n = len(block.layout)
    for k, (index, numel, units, sat) in enumerate(block.layout):
        count = numel or 1
        acts[index] = ActivationStats(math.sqrt(host[k] / count), host[n + k] / units if units else None,
                                      host[sat] / count if sat >= 0 else None, units)


class StepBuffer:
    """One step's activation statistics (latest per layer, so gradient accumulation keeps the
    last micro-batch), packed per device when the forward ends and moved to the host with the
    gradient norms in one transfer at the optimizer step.

    Outputs are reduced inside their hook while they are still in cache. Tiny outputs (at most
    :data:`TINY` elements), where a kernel launch costs more than its work, wait in a batch that is
    reduced with a constant number of kernels (at the end of the forward, when it holds
    :attr:`batch_bytes`, or at the step). A batched output may be changed by a later in-place op
    (``ReLU(inplace=True)`` after a Linear): its version counter tells; that sample is dropped and
    the layer is reduced inside its hook from then on (``in_place``).
    """

    batch_bytes = 1024 * 1024

    def __init__(self) -> None:
        self.samples: dict[int, ActivationSample] = {}
        self.order: dict[int, None] = {}
        """Layer indices in the order their hooks ran, recorded while ``record_order`` is set."""
        self.record_order = True
        self.in_place: set[int] = set()
        self.blocks: dict[torch.device, list[_Block]] = {}
        self._batch: list[tuple[Probe, torch.Tensor, int]] = []
        self._batch_bytes = 0

    def add(self, probe: Probe, y: torch.Tensor) -> None:
        """Take one layer output (called from its forward hook)."""
        x = y.detach()
        if _is_compiling():
            self.samples[probe.index] = sample_activation(probe, x)
            return
        if self.record_order:
            self.order[probe.index] = None
        numel = x.numel()
        if numel > TINY or probe.index in self.in_place:
            self.samples[probe.index] = ActivationSample(_sum_of_squares(x), _unit_peak(probe, x),
                                                         _saturated(probe, x), numel)
            return
        self._batch.append((probe, x, x._version))
        self._batch_bytes += numel * x.element_size()
        if self._batch_bytes >= self.batch_bytes:
            self._reduce_batch()

    def _reduce_batch(self) -> None:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        groups: dict[tuple, list] = {}
        for probe, x, version in batch:
            if x._version != version:  # changed in place after its hook: wrong values, drop it
                self.in_place.add(probe.index)
            else:  # stackable together, and reduced the same way
                # probe[1:]: all but the layer index, i.e. how the output is reduced
                groups.setdefault((x.shape, x.dtype, x.device, probe[1:]), []).append((probe, x))
        for (_, _, device, *_), items in groups.items():
            self.blocks.setdefault(device, []).append(_tiny_block(items, device))

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
            by_device.setdefault(sample.square.device, []).append((index, sample))
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
            _gather_device(device, blocks.get(device, []), grads_by_device.get(device, []), acts, grads_out)
        return acts, grads_out


def _gather_device(device: torch.device, blocks: list[_Block], grad_items: list, acts: dict, grads_out: dict) -> None:
    """One vector: [blocks... | large gradients: sums of squares (CPU) or norms | sums of squares
    of tiny ones, stacked by shape]; the host combines each layer's tensors."""
    parts = [b.vector for b in blocks]
    large, owners = [], []
    tiny: dict[tuple, tuple[list, list]] = {}
    for k, (_, gs) in enumerate(grad_items):
        for g in gs:
            if g.is_sparse or g.numel() > TINY:
                large.append(g)
                owners.append(k)
            else:
                group = tiny.setdefault((g.shape, g.dtype), ([], []))
                group[0].append(g)
                group[1].append(k)
    squared_large = device.type == "cpu"  # CPU: one BLAS dot per tensor; elsewhere one fused foreach launch
    if large:
        reduced = [_sum_of_squares(g) if not g.is_sparse else _norm(g.coalesce().values()) ** 2 for g in large] \
            if squared_large else _foreach_norms(large)
        parts.append(torch.stack(reduced).float())
    for grads, slots in tiny.values():
        stacked = torch.stack(grads)
        if stacked.dtype in LOW_PRECISION:
            stacked = stacked.float()
        parts.append((stacked * stacked).sum(tuple(range(1, stacked.dim()))))
        owners += slots
    host = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()  # the one host transfer
    pos = 0
    for block in blocks:  # later blocks (later forwards of the step) overwrite earlier ones
        size = block.vector.numel()
        _unpack(host[pos:pos + size], block, acts)
        pos += size
    square_sums = [0.0] * len(grad_items)
    values = host[pos:]
    for k, value in zip(owners[:len(large)], values):
        square_sums[k] += value if squared_large else value * value
    for k, square in zip(owners[len(large):], values[len(large):]):
        square_sums[k] += square
    for k, (index, gs) in enumerate(grad_items):
        norm = math.sqrt(square_sums[k])
        grads_out[index] = GradientStats(norm, not math.isfinite(norm), len(gs))
