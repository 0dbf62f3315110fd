"""Real training on CPU: each failure the extractor exists for, and a healthy run that stays silent."""
import math

import torch
from torch import nn

from neuraldbg_track import NeuralDbg
from tests.helpers import by_layer, exploding_mlp, mlp, regression_data, train


def test_deep_sigmoid_mlp_early_layers_vanish():
    model = mlp([16] + [32] * 12 + [1], act=nn.Sigmoid)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = regression_data()
    with NeuralDbg(model, opt, console=False) as dbg:
        train(model, opt, x, y, steps=30)
    vanishing = {e.layer_name for e in dbg.events
                 if e.event_type == "gradient_health" and e.to_state == "VANISHING"}
    assert {"0", "2", "4"} <= vanishing          # the first Linear layers
    assert "24" not in vanishing                 # the output layer still learns
    first = by_layer(dbg.events, "gradient_health")["0"][0]
    assert (first.from_state, first.to_state) == ("UNKNOWN", "VANISHING")
    assert first.metadata["grad_norm"] < 1e-6 and first.metadata["threshold"] == 1e-6


def test_high_learning_rate_explodes_then_goes_non_finite():
    model = exploding_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = regression_data()
    with NeuralDbg(model, opt, console=False) as dbg:
        train(model, opt, x, y, steps=20)
    grad_events = [e for e in dbg.events if e.event_type == "gradient_health"]
    to_states = [e.to_state for e in grad_events]
    assert "EXPLODING" in to_states and "NON_FINITE" in to_states
    assert to_states.index("EXPLODING") < to_states.index("NON_FINITE")
    for e in grad_events:  # a NaN/Inf norm is never called healthy
        norm = e.metadata["grad_norm"]
        if isinstance(norm, str) or not math.isfinite(norm):
            assert e.to_state == "NON_FINITE"
    assert all(s["gradient_health"] == "NON_FINITE" for s in dbg.states().values() if "gradient_health" in s)


def test_relu_with_negative_bias_is_dead_from_first_observation():
    model = mlp([16, 64, 64, 1])
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = regression_data()
    with NeuralDbg(model, opt, console=False) as dbg:
        train(model, opt, x, y, steps=10)
    dead = [e for e in dbg.events if e.event_type == "activation_regime" and e.to_state == "DEAD"]
    assert [(e.layer_name, e.from_state) for e in dead] == [("3", "UNKNOWN")]
    assert dead[0].metadata["dead_fraction"] == 1.0 and dead[0].metadata["onset_step"] == 0


def test_tanh_with_large_inputs_saturates_only_tanh_layers():
    model = mlp([16, 64, 64, 1], act=nn.Tanh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = regression_data()
    with NeuralDbg(model, opt, console=False) as dbg:
        train(model, opt, x * 100, y, steps=10)
    saturated = {e.layer_name for e in dbg.events if e.to_state == "SATURATED"
                 and e.event_type == "activation_regime"}
    assert saturated == {"1"}   # the Tanh fed x100 inputs (the second Tanh sees |inputs| <= 1 x small weights)
    linear_names = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert not saturated & linear_names


def test_healthy_training_is_silent():
    model = mlp([16, 64, 64, 32, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = regression_data()
    with NeuralDbg(model, opt, console=False) as dbg:
        loss = train(model, opt, x, y, steps=200)
    assert dbg.events == []
    assert dbg.step_count == 200 and loss.item() < 0.5
    # every layer was observed and judged healthy (silence is not blindness)
    assert {s.get("gradient_health") for s in dbg.states().values()} >= {"HEALTHY"}
    assert len(dbg.states()) == 7


def test_bf16_autocast_training_is_observed_and_silent():
    model = mlp([16, 64, 64, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = regression_data()
    with NeuralDbg(model, opt, console=False) as dbg:
        g = torch.Generator().manual_seed(1)
        for _ in range(40):
            idx = torch.randint(0, len(x), (64,), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x[idx])
            loss = nn.functional.mse_loss(out.float(), y[idx])
            opt.zero_grad(); loss.backward(); opt.step()
    assert dbg.events == []
    assert dbg.states()["1"]["activation_regime"] == "NORMAL"
