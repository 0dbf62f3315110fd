"""The statistics the hot path moves to the host equal the same statistics computed directly from
the layer outputs and gradients, on every path: reduced in the hook, batched as tiny outputs,
packed at the end of the forward, and after a later in-place op changed an output."""
import math

import pytest
import torch
from torch import nn

import neuraldbg_track.buffer as stats_module
from neuraldbg_track import NeuralDbg
from tests.helpers import mlp


class Mixed(nn.Module):
    """Linear, ReLU with dead units, Tanh pushed to its bounds, GELU (signed), a 3-D output and a
    parameter-free layer: every kind of probe the buffer reduces."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1, self.relu = nn.Linear(8, width), nn.ReLU()
        self.fc2, self.tanh = nn.Linear(width, width), nn.Tanh()
        self.seq = nn.Linear(width, width)
        self.gelu, self.head = nn.GELU(), nn.Linear(width, 1)
        with torch.no_grad():
            self.fc1.bias[: width // 2] = -100.0  # half the ReLU units never fire
            self.fc2.weight.mul_(20.0)           # tanh saturates

    def forward(self, x):
        h = self.tanh(self.fc2(self.relu(self.fc1(x))))
        h = self.gelu(self.seq(h.unsqueeze(1).expand(-1, 3, -1)))  # (batch, 3, width)
        return self.head(h.mean(1))


def expected_activation(module: nn.Module, y: torch.Tensor, tolerance=0.01):
    y = y.double()
    rms = y.pow(2).mean().sqrt().item()
    if isinstance(module, (nn.Linear,)):
        dead = None
    else:
        peak = y.abs().amax(dim=tuple(range(y.dim() - 1)))
        dead = (peak == 0).double().mean().item()
    sat = None
    if isinstance(module, nn.Tanh):
        sat = (y.abs() >= 1 - 2 * tolerance).double().mean().item()
    return rms, dead, sat


def observe_one_step(model, x, monkeypatch=None):
    """Run one training step; return (what the debugger computed, what the outputs really were)."""
    truth, captured = {}, {}
    names = {m: n for n, m in model.named_modules()}
    handles = [m.register_forward_hook(lambda m, i, o: truth.__setitem__(names[m], (m, o.detach().clone())))
               for m in model.modules() if next(m.children(), None) is None]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with NeuralDbg(model, opt, console=False, journal=False) as dbg:
        gather = dbg._buffer.gather

        def spy(groups):
            acts, grads = gather(groups)
            captured.update(acts={dbg.layers[i].name: s for i, s in acts.items()},
                            grads={dbg.layers[i].name: s for i, s in grads.items()})
            return acts, grads
        dbg._buffer.gather = spy
        model(x).pow(2).mean().backward()
        opt.step()
        captured["order"] = dbg.execution_order
    for h in handles:
        h.remove()
    return captured, truth


@pytest.mark.parametrize("width, tiny", [(16, True), (2048, False)], ids=["batched-tiny", "in-hook"])
def test_activation_and_gradient_statistics_match_a_direct_computation(width, tiny):
    torch.manual_seed(0)
    model = Mixed(width)
    x = torch.randn(4, 8)
    assert (4 * width <= stats_module.TINY) == tiny  # the parametrisation really covers both paths
    captured, truth = observe_one_step(model, x)
    assert set(captured["acts"]) == set(truth)
    # the forward order, although tiny outputs are reduced after the large ones
    assert captured["order"] == ["fc1", "relu", "fc2", "tanh", "seq", "gelu", "head"]
    for name, (module, y) in truth.items():
        got = captured["acts"][name]
        rms, dead, sat = expected_activation(module, y)
        assert got.rms == pytest.approx(rms, rel=1e-5), name
        assert got.dead_fraction == (None if dead is None else pytest.approx(dead)), name
        assert got.saturated_fraction == (None if sat is None else pytest.approx(sat)), name
    assert captured["acts"]["relu"].dead_fraction >= 0.5
    assert captured["acts"]["tanh"].saturated_fraction > 0.25
    for name, module in model.named_modules():
        params = [p.grad for p in module.parameters(recurse=False)]
        if params:
            norm = math.sqrt(sum(g.double().pow(2).sum().item() for g in params))
            assert captured["grads"][name].norm == pytest.approx(norm, rel=1e-3), name  # float32 over 4M values


def test_mixed_large_and_tiny_gradients_of_one_layer_combine():
    """A layer whose weight is large (foreach norm) and bias tiny (flattened batch)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64))
    captured, _ = observe_one_step(model, torch.randn(32, 128))
    w, b = model[0].weight.grad, model[0].bias.grad
    assert w.numel() > stats_module.TINY >= b.numel()
    expected = math.sqrt(w.double().pow(2).sum().item() + b.double().pow(2).sum().item())
    assert captured["grads"]["0"].norm == pytest.approx(expected, rel=1e-6)


def test_output_changed_in_place_later_is_dropped_then_reduced_in_its_hook():
    """Linear -> ReLU(inplace=True): the batched Linear output is overwritten by the ReLU before
    the batch is reduced. The first step must not report post-ReLU values as the Linear's; from
    the next step the Linear is reduced inside its hook, with its true (pre-ReLU) statistics."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(inplace=True), nn.Linear(16, 1))
    x = torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = []
    with NeuralDbg(model, opt, console=False, journal=False) as dbg:
        gather = dbg._buffer.gather
        dbg._buffer.gather = lambda groups: seen.append(gather(groups)) or seen[-1]
        for _ in range(2):
            model(x).pow(2).mean().backward()
            opt.step()
        assert dbg._buffer.in_place == {0}
    first, second = seen[0][0], seen[1][0]
    assert 0 not in first and 1 in first                    # dropped, not reported wrong
    pre_relu = model[0](x).detach().double()
    assert second[0].rms == pytest.approx(pre_relu.pow(2).mean().sqrt().item(), rel=1e-5)


def test_fast_path_emits_exactly_the_events_of_the_full_classification():
    """Most observations only compute the state; forcing every one through the full verdict must
    give the same events (same steps, states, confidence and evidence)."""
    def run(force_full):
        torch.manual_seed(0)
        model = mlp([16, 32, 32, 32, 1], act=nn.Sigmoid)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        x, y = torch.randn(64, 16), torch.randn(64, 1)
        with NeuralDbg(model, opt, console=False, journal=False) as dbg:
            if force_full:
                dbg._detector.settled = lambda track, state: False
            for _ in range(60):
                loss = nn.functional.mse_loss(model(x) * 50, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return [e.to_dict() for e in dbg.events]
    fast = run(False)
    assert fast and fast == run(True)


class Transposed(nn.Module):
    def forward(self, x):
        return x.t()  # a non-contiguous output: no BLAS dot, the norm path


@pytest.mark.parametrize("width", [16, 2048], ids=["batched-tiny", "in-hook"])
def test_half_precision_and_non_contiguous_outputs(width):
    """bfloat16 outputs are reduced in float32; a non-contiguous output takes the norm path."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, width), nn.ReLU(), Transposed(), nn.Tanh()).to(torch.bfloat16)
    captured, truth = observe_one_step(model, torch.randn(4, 8, dtype=torch.bfloat16))
    for name, (module, y) in truth.items():
        expected = y.double().pow(2).mean().sqrt().item()
        assert captured["acts"][name].rms == pytest.approx(expected, rel=1e-3), name
    assert not truth["2"][1].is_contiguous()


def test_sparse_embedding_gradient_norm():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 8, sparse=True), nn.Flatten(), nn.Linear(24, 1))
    x = torch.randint(0, 100, (4, 3))
    captured = {}
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with NeuralDbg(model, opt, console=False, journal=False) as dbg:
        gather = dbg._buffer.gather
        dbg._buffer.gather = lambda groups: captured.setdefault("out", gather(groups))
        model(x).sum().backward()
        grad = model[0].weight.grad
        opt.step()
    assert grad.is_sparse
    norm = grad.coalesce().values().double().pow(2).sum().sqrt().item()
    assert captured["out"][1][0].norm == pytest.approx(norm, rel=1e-5)
