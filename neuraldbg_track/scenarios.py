"""Training scenarios with known ground truth: the failures neuraldbg-track exists for, and healthy runs.

Each :class:`Scenario` is a tiny model trained for a few dozen steps on CPU (a second or two), with
what must be found: the layers, event type and state of each injected failure and the step it was
injected at (:class:`Expect`), the cause and root layer the reasoner must name, and the failure
states that may follow as consequences. Healthy scenarios expect no event at all.
:func:`run_scenario` trains one under a :class:`~neuraldbg_track.NeuralDbg`; :mod:`.quality` scores them.

Layer names are ``named_modules()`` names: in an ``nn.Sequential`` MLP, Linear layers are ``"0"``,
``"2"``, ... and their activations ``"1"``, ``"3"``, ...; a root is right when it lies in the block
(the parameterised layer and its activation) where the fault was injected.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch import nn

from . import _models as m
from .events import EventType, SemanticEvent

GRAD, ACT = EventType.GRADIENT_HEALTH.value, EventType.ACTIVATION_REGIME.value


@dataclass(frozen=True)
class Expect:
    """A failure that must be reported: each of ``layers`` enters ``state`` (of ``event_type``)."""

    state: str
    layers: tuple[str, ...]
    event_type: str = GRAD
    onset: int | None = 0
    """The first step whose forward pass meets the fault (0: from the start); latency is measured from
    it. None for failures that build up over an unknown number of steps (no latency measured)."""


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    """What is injected: vanishing, exploding, divergence, dead, saturation, regime_change or healthy."""
    description: str
    setup: Callable[[], m.Setup]
    steps: int
    expect: tuple[Expect, ...] = ()
    also: frozenset[str] = frozenset()
    """Failure states that may follow as consequences (not counted as false events)."""
    cause: str | None = None
    """The cause the top hypothesis must name (see :data:`neuraldbg_track.reasoner.CAUSES`)."""
    root: tuple[str, ...] = ()
    """Layers the top hypothesis may name as the root (the injected block)."""

    @property
    def healthy(self) -> bool:
        return not self.expect


@dataclass
class ScenarioRun:
    """What one scenario produced: its events, the layer order and the reasoner's hypotheses."""

    scenario: Scenario
    events: list[SemanticEvent]
    execution_order: list[str]
    layers: list[str]
    steps: int
    patience: int
    hypotheses: list[Any] = field(default_factory=list)


def run_scenario(scenario: Scenario, thresholds: Mapping[str, Any] | None = None, threads: int = 1,
                 **options: Any) -> ScenarioRun:
    """Train ``scenario`` on ``threads`` CPU threads under a :class:`NeuralDbg` given ``thresholds`` and
    ``options`` (by default ``journal=False, console=False``; pass ``sinks=[...]``, ``journal=path``, a
    watch setting...). The global RNG and thread count are left as found."""
    from .debugger import NeuralDbg

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)  # tiny models: one thread is fastest, and results do not depend on it
    try:
        with torch.random.fork_rng(devices=[]):
            return _train(scenario, NeuralDbg, thresholds, {"journal": False, "console": False, **options})
    finally:
        torch.set_num_threads(previous)


def _train(scenario: Scenario, debugger: Any, thresholds: Any, options: dict) -> ScenarioRun:
    torch.manual_seed(0)
    s = scenario.setup()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if s.bf16 else contextlib.nullcontext()
    with debugger(s.model, s.optimizer, thresholds=thresholds, **options) as dbg:
        for step in range(scenario.steps):
            if s.inject is not None:
                s.inject(step, s)
            for micro in range(s.accumulate):
                x, y = s.batch(step, micro)
                with autocast:
                    loss = s.loss(s.model(x), y)
                (loss / s.accumulate).backward()
            s.optimizer.step()
            s.optimizer.zero_grad(set_to_none=True)
    return ScenarioRun(scenario, dbg.events, dbg.execution_order, [l.name for l in dbg.layers], dbg.step_count,
                       dbg.config.thresholds.patience, dbg.explain() if hasattr(dbg, "explain") else [])


def _at(step: int, action: Callable[[m.Setup], None]) -> Callable[[int, m.Setup], None]:
    """An injection that runs ``action`` just before training step ``step``."""
    def inject(i: int, s: m.Setup) -> None:
        if i == step:
            with torch.no_grad():
                action(s)
    return inject


def _spike_lr(step: int, factor: float) -> Callable[[int, m.Setup], None]:
    """The learning rate times ``factor`` for training step ``step`` only."""
    def inject(i: int, s: m.Setup) -> None:
        if i in (step, step + 1):
            for group in s.optimizer.param_groups:
                group["lr"] *= factor if i == step else 1 / factor
    return inject


def _freeze_scaled(index: int, factor: float) -> Callable[[m.Setup], None]:
    def action(s: m.Setup) -> None:
        s.model[index].weight.mul_(factor)
        s.model[index].weight.requires_grad_(False)
    return action


def _poison(index: int) -> Callable[[m.Setup], None]:
    def action(s: m.Setup) -> None:
        s.model[index].weight[0, 0] = float("inf")
    return action


MID = 30  # the step mid-run faults are injected at
LINEARS_12 = tuple(str(i) for i in range(0, 24, 2))
MLP3 = [16, 64, 64, 1]  # Linear "0", ReLU/Tanh "1", Linear "2", "3", Linear "4"


def _failures() -> list[Scenario]:
    fail = Scenario
    return [
        fail("vanishing_deep_sigmoid", "vanishing", "12 sigmoid layers, default init: the early gradients vanish",
             lambda: m.mlp_setup([16] + [32] * 12 + [1], nn.Sigmoid, lr=0.1), 40,
             (Expect("VANISHING", ("0", "2", "4")),), cause="vanishing_gradients"),
        fail("vanishing_saturated_head", "vanishing", "the last sigmoid pushed to its limit (bias -30): it "
             "saturates and every gradient before it vanishes",
             lambda: m.mlp_setup([16] + [32] * 12 + [1], nn.Sigmoid, lr=0.1, bias={22: -30.0}), 30,
             (Expect("SATURATED", ("23",), ACT), Expect("VANISHING", LINEARS_12)),
             cause="activation_saturation", root=("22", "23")),
        fail("vanishing_bottleneck_midrun", "vanishing", "tanh MLP; at step 30 Linear 6 is scaled by 1e-7 and "
             "frozen: the gradient of every layer before it vanishes",
             lambda: m.mlp_setup([16, 32, 32, 32, 32, 1], nn.Tanh, lr=0.05, inject=_at(MID, _freeze_scaled(6, 1e-7))),
             60, (Expect("VANISHING", ("0", "2", "4"), onset=MID),), cause="vanishing_gradients", root=("6", "7")),
        fail("exploding_large_init", "exploding", "6-layer ReLU MLP, no normalisation, every weight x4 at init "
             "(Adam brings them back)", lambda: m.mlp_setup([16] + [64] * 5 + [1], nn.ReLU, adam=1e-3, gain=4.0), 30,
             (Expect("EXPLODING", ("2", "4", "6", "8", "10")),), cause="exploding_gradients"),
        fail("exploding_layer_scale_midrun", "exploding", "Adam MLP; at step 30 the weights of Linear 2 grow x1000",
             lambda: m.mlp_setup([16, 64, 64, 64, 1], nn.ReLU, adam=1e-3,
                                 inject=_at(MID, lambda s: s.model[2].weight.mul_(1000.0))), 50,
             (Expect("EXPLODING", ("0", "4", "6"), onset=MID),), also=frozenset({"ANOMALOUS"}),
             cause="exploding_gradients", root=("2", "3")),
        fail("divergence_high_lr", "divergence", "SGD at lr=5 on a ReLU MLP: activations overflow, gradients NaN",
             lambda: m.mlp_setup(MLP3, nn.ReLU, lr=5.0), 20,
             (Expect("NON_FINITE", ("0", "2", "4"), onset=None),), also=frozenset({"EXPLODING", "ANOMALOUS", "DEAD"}),
             cause="divergence"),
        fail("divergence_nan_batch_midrun", "divergence", "healthy Adam MLP; at step 30 one batch holds a NaN",
             lambda: m.mlp_setup(MLP3, nn.ReLU, adam=1e-3, nan_at=MID), 40,
             (Expect("NON_FINITE", ("0", "2", "4"), onset=MID),), also=frozenset({"ANOMALOUS"}),
             cause="divergence", root=("0", "1")),
        fail("divergence_corrupt_weight_midrun", "divergence", "at step 30 one weight of Linear 2 becomes Inf",
             lambda: m.mlp_setup(MLP3, nn.ReLU, lr=0.01, inject=_at(MID, _poison(2))), 40,
             (Expect("NON_FINITE", ("0", "2", "4"), onset=MID),), also=frozenset({"ANOMALOUS"}),
             cause="divergence", root=("2", "3")),
        fail("dead_relu_bias_shift", "dead", "the bias of Linear 2 at -20: ReLU 3 never fires",
             lambda: m.mlp_setup(MLP3, nn.ReLU, lr=0.01, bias={2: -20.0}), 30,
             (Expect("DEAD", ("3",), ACT),), also=frozenset({"VANISHING"}), cause="dead_units", root=("2", "3")),
        fail("dead_relu_bias_shift_midrun", "dead", "at step 30 the bias of Linear 2 drops by 20",
             lambda: m.mlp_setup(MLP3, nn.ReLU, lr=0.01, inject=_at(MID, lambda s: s.model[2].bias.sub_(20.0))), 60,
             (Expect("DEAD", ("3",), ACT, onset=MID),), also=frozenset({"VANISHING", "ANOMALOUS"}),
             cause="dead_units", root=("2", "3")),
        fail("dead_relu_lr_spike_midrun", "dead", "the learning rate x300 for step 30 only: the huge update "
             "surges the activations and kills the ReLUs of layer 3",
             lambda: m.mlp_setup(MLP3, nn.ReLU, lr=0.1, target_shift=-3.0, inject=_spike_lr(MID, 300.0)), 60,
             (Expect("DEAD", ("3",), ACT, onset=MID + 1),), also=frozenset({"VANISHING", "EXPLODING", "ANOMALOUS"}),
             cause="dead_units"),
        fail("dead_relu_high_lr", "dead", "SGD at lr=1 from the start: the ReLUs of layer 3 die within steps",
             lambda: m.mlp_setup(MLP3, nn.ReLU, lr=1.0), 40,
             (Expect("DEAD", ("3",), ACT, onset=None),), also=frozenset({"VANISHING", "ANOMALOUS"}),
             cause="dead_units"),
        fail("saturation_tanh_large_inputs", "saturation", "tanh MLP fed inputs x100",
             lambda: m.mlp_setup(MLP3, nn.Tanh, lr=0.01, input_scale=100.0), 30,
             (Expect("SATURATED", ("1",), ACT),), also=frozenset({"VANISHING"}),
             cause="activation_saturation", root=("0", "1")),
        fail("saturation_sigmoid_input_scale_midrun", "saturation", "sigmoid MLP; from step 30 the inputs are x100",
             lambda: m.mlp_setup(MLP3, nn.Sigmoid, lr=0.05, scale_at=(MID, 100.0)), 60,
             (Expect("SATURATED", ("1",), ACT, onset=MID),), also=frozenset({"VANISHING", "ANOMALOUS"}),
             cause="activation_saturation", root=("0", "1")),
    ]


def _healthy() -> list[Scenario]:
    def ok(name: str, what: str, setup: Callable[[], m.Setup], steps: int) -> Scenario:
        return Scenario(name, "healthy", what, setup, steps)
    return [
        ok("healthy_mlp_sgd", "ReLU MLP, SGD", lambda: m.mlp_setup([16, 64, 64, 32, 1], nn.ReLU, lr=0.05), 120),
        ok("healthy_mlp_adam_accum", "ReLU MLP, Adam, 4-step gradient accumulation",
           lambda: m.mlp_setup([16, 64, 64, 32, 1], nn.ReLU, adam=1e-3, accumulate=4), 80),
        ok("healthy_tanh_mlp_adam_bf16", "tanh MLP, Adam, bf16 autocast",
           lambda: m.mlp_setup(MLP3, nn.Tanh, adam=1e-3, bf16=True), 120),
        ok("healthy_sigmoid_mlp_sgd", "4-layer sigmoid MLP, SGD",
           lambda: m.mlp_setup([16, 32, 32, 32, 1], nn.Sigmoid, lr=0.1), 120),
        ok("healthy_cnn_sgd", "small CNN, SGD with momentum", lambda: m.cnn_setup(sgd=0.05), 80),
        ok("healthy_cnn_adam_bf16", "small CNN, Adam, bf16 autocast", lambda: m.cnn_setup(adam=1e-3, bf16=True), 80),
        ok("healthy_lstm_adam", "LSTM, Adam", lambda: m.rnn_setup(nn.LSTM, adam=3e-3), 80),
        ok("healthy_gru_sgd_accum", "GRU, SGD, 2-step accumulation",
           lambda: m.rnn_setup(nn.GRU, sgd=0.1, accumulate=2), 80),
        ok("healthy_transformer_adam", "2-layer transformer encoder, Adam", lambda: m.transformer_setup(adam=1e-3), 80),
        ok("healthy_transformer_sgd_bf16_accum", "transformer, SGD, bf16 autocast, 2-step accumulation",
           lambda: m.transformer_setup(sgd=0.05, bf16=True, accumulate=2), 60),
    ]


SCENARIOS: dict[str, Scenario] = {s.name: s for s in _failures() + _healthy()}
