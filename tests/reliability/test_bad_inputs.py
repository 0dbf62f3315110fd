"""Bad inputs through real tiny training: no crash, a correct classification (non-finite is never
healthy) or a clear error. Shared/frozen parameters, in-place ops, dict outputs, nested contexts and
step() outside the context are covered in tests/test_hooks.py."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from neuraldbg_track import NeuralDbg
from neuraldbg_track.reliability import hook_count

HEALTHY = {"HEALTHY", "NORMAL"}


def _train(model, x, y, steps=6, loss_fn=nn.functional.mse_loss, **settings):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, opt, console=False, journal=False, **settings) as dbg:
        for _ in range(steps):
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert hook_count(model, opt) == 0
    return dbg


def _net(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(dtype)


@pytest.mark.parametrize("where", ["input", "loss"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_inputs_and_loss_are_never_judged_healthy(where, value):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    if where == "input":
        x[0, 0] = value
        dbg = _train(_net(), x, y)
    else:
        dbg = _train(_net(), x, y, loss_fn=lambda out, t: (out * value).mean())
    grads = {layer: s["gradient_health"] for layer, s in dbg.states().items() if "gradient_health" in s}
    assert set(grads) == {"0", "2"} and set(grads.values()) == {"NON_FINITE"}
    acts = {s.get("activation_regime") for s in dbg.states().values()} - {None}
    assert acts and not acts & HEALTHY
    assert all(e.to_state not in HEALTHY for e in dbg.events)


def test_a_model_without_parameters_is_watched_without_events():
    model = nn.ReLU()
    with NeuralDbg(model, console=False, journal=False) as dbg:
        for _ in range(3):
            model(torch.randn(4, 4))
            dbg.step()
    assert [l.params for l in dbg.layers] == [()] and dbg.events == []
    assert dbg.states() == {"<root>": {"activation_regime": "NORMAL"}} and dbg.step_count == 3


def test_two_thousand_modules_are_all_watched():
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(2000)])
    dbg = _train(model, torch.randn(4, 2), torch.randn(4, 2), steps=2)
    assert len(dbg.layers) == 2000 and len(dbg.states()) == 2000
    assert dbg.execution_order[:2] == ["0", "1"] and len(dbg.execution_order) == 2000


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_parameters_are_judged(dtype):
    dbg = _train(_net(dtype), torch.randn(16, 4, dtype=dtype), torch.randn(16, 1, dtype=dtype))
    assert dbg.states()["0"] == {"gradient_health": "HEALTHY", "activation_regime": "NORMAL"}
    assert dbg.states()["2"]["gradient_health"] == "HEALTHY"


class _Side(nn.Module):
    """Returns no tensor at all, or tensors inside containers with non-tensors beside them."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x):
        return {"none": None, "count": 3, "text": "str", "nested": [self.inner(x)]}


class _NonTensor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.side, self.out, self.nothing = _Side(), nn.Linear(4, 1), nn.Identity()

    def forward(self, x):
        self.nothing(None)
        return self.out(self.side(x)["nested"][0])


def test_non_tensor_outputs_do_not_break_observation():
    dbg = _train(_NonTensor(), torch.randn(16, 4), torch.randn(16, 1))
    states = dbg.states()
    assert states["out"] == {"gradient_health": "HEALTHY", "activation_regime": "NORMAL"}
    assert states["side.inner"]["activation_regime"] == "NORMAL"
    assert "nothing" not in states  # returned None: nothing to judge


class DuckOptimizer:
    """Has step/zero_grad but not torch.optim.Optimizer's step hooks."""

    def step(self) -> None: ...

    def zero_grad(self) -> None: ...


def test_an_optimizer_without_step_hooks_is_refused_at_attach_with_what_to_do():
    model = _net()
    dbg = NeuralDbg(model, DuckOptimizer(), console=False, journal=False)
    with pytest.raises(TypeError, match=r"DuckOptimizer has no register_step_pre_hook.*optimizer=None.*dbg\.step\(\)"):
        dbg.attach()
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0
    with NeuralDbg(model, console=False, journal=False):  # the failed attach left the model free
        pass
