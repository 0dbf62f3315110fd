"""A step's statistics: batched, packed and moved to the host in one transfer.

Data flow of one observed step (see :class:`StepBuffer`):

1. forward hooks hand each watched output to the buffer. Outputs above :data:`TINY` elements are
   reduced at once, while they are still in cache (1-2 kernels: a sum of squares, a per-unit
   ``amax`` where dead units are judged). Tiny outputs, where a kernel launch costs far more than its work, wait
   and are stacked by shape and reduced together (a constant number of kernels per shape). Under
   ``torch.compile`` every output is reduced in the hook, so the reductions fuse into the graph.
2. when the root module's forward ends, everything is packed into one small vector per device and
   no reference to any output remains.
3. at the optimizer step the gradients are reduced (large ones: a BLAS ``dot`` each on CPU, one
   fused ``torch._foreach_norm`` elsewhere; tiny ones stacked by shape), and one ``tolist()`` per
   device moves it all to the host, where each layer's figures are unpacked and the gradient
   tensors of a layer combined.

Measured on CPU, in the training loop (not in isolation, where caches flatter every kernel):
deferring the reduction of mid-size outputs to a ``_foreach_norm`` at the end of the forward was
slower (they had left the cache), and so were a per-unit sum of squares (its temporary) and
``vector_norm`` over a ``dim`` (~8x slower than ``amax`` + ``vector_norm``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

import torch

from .stats import (LOW_PRECISION, ActivationSample, ActivationStats, GradientStats, Probe, at_bounds, batch_dims,
                    foreach_norms, is_compiling, l2_norm, sample_activation, sum_of_squares)


TINY = 4096
"""Tensors of at most this many elements are stacked by shape and reduced together: for them a
kernel launch (~3-5 us on CPU, even inside ``_foreach_norm``) costs far more than the work."""


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
    if probe.dead_units:
        magnitude = stacked if probe.nonnegative else stacked.abs()
        dims = batch_dims(ndim - 1, probe.channel_first)  # of one output; +1 for the stacked dim
        peaks = magnitude.reshape(m, -1) if dims is None else magnitude.amax(dim=tuple(d + 1 for d in dims))
        units = peaks.shape[1]
        parts.append(peaks.eq(0).sum(1, dtype=squares.dtype))
    else:
        parts.append(torch.zeros(m, device=device, dtype=squares.dtype))
    if probe.bounds is not None:
        parts.append(at_bounds(probe, stacked).sum(every, dtype=squares.dtype))
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
        if is_compiling():
            self.samples[probe.index] = sample_activation(probe, x)
            return
        if self.record_order:
            self.order[probe.index] = None
        numel = x.numel()
        if numel > TINY or probe.index in self.in_place:
            self.samples[probe.index] = sample_activation(probe, x)
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
        if is_compiling():
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
        reduced = [sum_of_squares(g) if not g.is_sparse else l2_norm(g.coalesce().values()) ** 2 for g in large] \
            if squared_large else foreach_norms(large)
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
