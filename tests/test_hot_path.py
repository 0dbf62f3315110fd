"""The hot path: one host transfer per observed step, none otherwise, and no tensor kept past a step."""
import gc
import weakref

import torch
from torch import nn

from neuraldbg_track import NeuralDbg
from tests.helpers import mlp

TRANSFERS = ("item", "tolist", "cpu", "numpy")


def _count_transfers(monkeypatch, calls):
    for name in TRANSFERS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)


def _steps(model, opt, x, y, n, per_step_calls, calls):
    for _ in range(n):
        before = len(calls)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        per_step_calls.append(calls[before:])


def test_one_host_transfer_per_observed_step_and_none_otherwise(monkeypatch):
    model = mlp([16, 32, 32, 32, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    calls: list[str] = []
    _count_transfers(monkeypatch, calls)
    plain: list[list[str]] = []
    _steps(model, opt, x, y, 3, plain, calls)
    assert all(c == [] for c in plain)                 # the loop itself makes none
    watched: list[list[str]] = []
    with NeuralDbg(model, opt, console=False, journal=False, every_n_steps=3):
        _steps(model, opt, x, y, 9, watched, calls)
    assert [c for c in watched] == [["tolist"], [], []] * 3


def test_no_tensor_outlives_its_step():
    model = mlp([16, 32, 32, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    refs: list[weakref.ref] = []
    handles = [m.register_forward_hook(lambda m, i, o: refs.append(weakref.ref(o))) for m in model]
    with NeuralDbg(model, opt, console=False, journal=False) as dbg:
        for _ in range(3):
            loss = nn.functional.mse_loss(model(torch.randn(64, 16)), torch.randn(64, 1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            del loss
        assert dbg._buffer.pending == 0
    for h in handles:
        h.remove()
    gc.collect()
    assert len(refs) == 15 and all(r() is None for r in refs)


def test_outputs_are_released_when_the_forward_ends():
    """Tiny outputs wait in a batch during the forward; the root's hook reduces and packs them, so
    backward never runs with extra references to activations."""
    model = mlp([16, 32, 32, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, opt, console=False, journal=False) as dbg:
        held = []
        reduce_batch = dbg._buffer._reduce_batch
        dbg._buffer._reduce_batch = lambda: (held.append(len(dbg._buffer._batch)), reduce_batch())
        out = model(torch.randn(64, 16))
        assert held == [5]                           # all five outputs were batched (tiny)...
        assert dbg._buffer._batch == [] and dbg._buffer.samples == {}  # ...and released at the end
        # stacked by shape and kind: the two (64, 32) Linear outputs, the two ReLU outputs, the (64, 1) head
        assert [len(b.layout) for b in dbg._buffer.blocks[torch.device("cpu")]] == [2, 2, 1]
        out.sum().backward()
        opt.step()
        assert dbg._buffer.pending == 0
