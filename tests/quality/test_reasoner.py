"""The reasoner's rules on hand-built event streams, and on real runs of the scenario suite.

Hand-built layout (an MLP in ``nn.Sequential`` order): Linear "0", act "1", Linear "2", act "3",
Linear "4", act "5", Linear "6"; the Linear layers have parameters.
"""
from __future__ import annotations

import json

import pytest

from neuraldbg_track import SemanticEvent
from neuraldbg_track.episodes import Order
from neuraldbg_track.reasoner import CAUSES, explain

GRAD, ACT = "gradient_health", "activation_regime"
ORDER = [str(i) for i in range(7)]
SIZES = {"0": 1088, "2": 4160, "4": 4160, "6": 65}


def ev(layer, state, onset, *, kind=GRAD, frm=None, conf=0.75, step=None, **md):
    healthy = "HEALTHY" if kind == GRAD else "NORMAL"
    return SemanticEvent(kind, layer, onset + 2 if step is None else step, frm or healthy, state, conf,
                         {"onset_step": onset, **md})


def vanish(layer, onset, **kw):
    return ev(layer, "VANISHING", onset, grad_norm=1e-9, **kw)


def test_no_failure_gives_one_no_failure_found_hypothesis():
    (h,) = explain([], ORDER)
    assert (h.cause, h.root_layer, h.confidence) == ("none", None, 1.0) and not h.is_failure
    assert h.statement.startswith("No failure found") and set(CAUSES) >= {"none", h.cause}


def test_vanishing_is_lost_at_the_first_layer_with_parameters_after_the_block():
    events = [vanish("0", 30), vanish("2", 30)]
    (h,) = explain(events, ORDER, sizes=SIZES)
    assert h.cause == "vanishing_gradients" and h.root_layer == "4" and h.onset_step == 30
    assert "lost passing back through 4" in h.statement and set(h.supporting) == set(events)
    (h,) = explain(events, ORDER)  # no sizes (a tracker run): the vanishing layer nearest the output
    assert h.root_layer == "2"


def test_vanishing_that_spreads_stays_one_hypothesis_and_says_where_it_went():
    (h,) = explain([vanish("0", 0), vanish("2", 0), vanish("4", 40)], ORDER, sizes=SIZES)
    assert h.root_layer == "4" and "spreading toward the output by step 40" in h.statement
    (h,) = explain([vanish("4", 0), vanish("2", 40), vanish("0", 45)], ORDER, sizes=SIZES)
    assert h.root_layer == "6" and "spreading toward the input by step 45" in h.statement


def test_a_saturated_layer_downstream_explains_the_vanishing_before_it():
    sat = ev("5", "SATURATED", 10, kind=ACT, saturated_fraction=0.97)
    (h,) = explain([vanish("0", 10), vanish("2", 10), vanish("4", 10), sat], ORDER, sizes=SIZES)
    assert h.cause == "activation_saturation" and h.root_layer == "5"
    assert len(h.chain) == 2 and "passes back almost no gradient" in h.chain[1]
    assert h.statement == ("5 saturates from step 10 (97% of its outputs at the limits); "
                           "the gradients of 3 layer(s) before it vanish.")


def test_a_saturated_layer_upstream_of_the_vanishing_does_not_explain_it():
    hs = explain([ev("1", "SATURATED", 10, kind=ACT), vanish("4", 10)], ORDER, sizes=SIZES)
    assert sorted(h.cause for h in hs) == ["activation_saturation", "vanishing_gradients"]
    assert all(len(h.chain) == 1 for h in hs)


def test_an_effect_that_came_first_is_not_explained_by_a_later_cause():
    early, late_sat = vanish("0", 5), ev("5", "SATURATED", 20, kind=ACT)
    top, other = explain([early, late_sat], ORDER, sizes=SIZES)
    assert top.cause == "vanishing_gradients" and other.cause == "activation_saturation"
    assert other.contradicting == (early,)           # a failure began before it and it explains none
    assert other.confidence == pytest.approx(0.75 * 1 / 2, abs=1e-3)


def test_a_cause_that_recovered_before_the_effect_began_is_not_linked():
    sat = ev("5", "SATURATED", 5, kind=ACT)
    back = ev("5", "NORMAL", 10, kind=ACT, frm="SATURATED")
    hs = explain([sat, back, vanish("0", 30)], ORDER, sizes=SIZES)
    assert len(hs) == 2 and all(len(h.chain) == 1 for h in hs)
    (h,) = explain([sat, back], ORDER)
    assert "recovered by step 12" in h.statement


def test_an_activation_jump_upstream_is_the_root_of_dead_units_and_the_vanishing_they_cause():
    shift = ev("2", "ANOMALOUS", 30, kind=ACT, rms=20.0, baseline_rms=0.25, shift_decades=1.9)
    dead = ev("3", "DEAD", 30, kind=ACT, dead_fraction=1.0)
    (h,) = explain([vanish("0", 30), vanish("2", 30), shift, dead], ORDER, sizes=SIZES)
    assert h.cause == "dead_units" and h.root_layer == "2"
    assert [c.split(":")[0] for c in h.chain] == ["step 30"] * 3
    assert "moved x80" in h.chain[0] and "dead" in h.chain[1] and "vanished" in h.chain[2]
    assert h.statement.startswith("100% of the units of 3 die at step 30 after the activations of 2 moved x80")


def test_an_activation_jump_downstream_does_not_explain_dead_units_and_counts_against_them():
    shift = ev("4", "ANOMALOUS", 5, kind=ACT, conf=0.25, rms=5.8, baseline_rms=0.36)
    dead = ev("3", "DEAD", 7, kind=ACT, conf=0.66, dead_fraction=0.98)
    top, second = explain([shift, dead], ORDER, sizes=SIZES)
    assert (top.cause, top.root_layer) == ("dead_units", "3") and top.contradicting == (shift,)
    assert top.confidence == pytest.approx(0.66 * 1 / 2, abs=1e-3)  # evidence x supporting / (supporting + against)
    assert (second.cause, second.confidence) == ("activation_shift", 0.25)


def test_gradients_that_explode_then_overflow_are_a_divergence_rooted_where_the_explosion_began():
    boom = [ev(l, "EXPLODING", 10, grad_norm=n) for l, n in (("0", 2e3), ("2", 5e3), ("4", 3e3))]
    nan = [ev(l, "NON_FINITE", 14, frm="EXPLODING", conf=1.0, step=14, grad_norm="nan") for l in ("0", "2", "4")]
    (h,) = explain(boom + nan, ORDER, sizes=SIZES)
    assert (h.cause, h.root_layer, h.onset_step, h.confidence) == ("divergence", "2", 10, 1.0)
    assert "after gradients exploded from step 10" in h.statement and "overflowed" in h.chain[1]


def test_non_finite_values_are_traced_forward_in_execution_order_not_name_order():
    events = [ev(l, "ANOMALOUS", 30, kind=ACT, conf=1.0, step=30, rms="nan", nonfinite=True) for l in ("a", "b")]
    events += [ev(l, "NON_FINITE", 30, conf=1.0, step=30, grad_norm="nan") for l in ("a", "b")]
    (h,) = explain(events, ["b", "a"])
    assert (h.cause, h.root_layer) == ("divergence", "b")
    assert "NaN/Inf first in the activations of b" in h.chain[0]


def test_an_explosion_starting_in_the_largest_layer_is_called_step_size_scale():
    events = [ev("big", "EXPLODING", 5, grad_norm=2e3), ev("small", "EXPLODING", 5, grad_norm=9e3),
              ev("tiny", "EXPLODING", 8, grad_norm=1.5e3)]
    sizes = {"big": 100_000, "small": 1_000, "tiny": 10}
    (h,) = explain(events, ["small", "big", "tiny"], sizes=sizes)
    assert h.root_layer == "big" and "the largest layer (100,000 parameters)" in h.statement
    (h,) = explain(events, ["small", "big", "tiny"])  # sizes unknown: the largest gradient
    assert h.root_layer == "small" and "largest layer" not in h.statement


def test_dead_units_following_an_explosion_are_part_of_its_chain():
    events = [ev("0", "EXPLODING", 5, grad_norm=4e4), ev("2", "EXPLODING", 5, grad_norm=6e4),
              ev("3", "DEAD", 8, kind=ACT, dead_fraction=0.95)]
    (h,) = explain(events, ORDER, sizes=SIZES)
    assert h.cause == "exploding_gradients" and "pushed the units below zero" in h.chain[1]
    assert "then dead units in 3 (step 8)" in h.statement


def test_hypotheses_are_ranked_by_confidence_and_serialise_to_json():
    weak = ev("5", "SATURATED", 3, kind=ACT, conf=0.2)
    strong = [ev("0", "NON_FINITE", 40, conf=1.0, step=40, grad_norm="nan")]
    hs = explain([weak] + strong, ORDER)
    assert [h.cause for h in hs] == ["divergence", "activation_saturation"]
    assert hs[0].confidence > hs[1].confidence
    doc = json.loads(json.dumps([h.to_dict() for h in hs], allow_nan=False))
    assert doc[0]["supporting"][0]["layer_name"] == "0" and doc[0]["cause"] == "divergence"


def test_same_kind_failures_far_apart_after_a_recovery_are_separate_episodes():
    events = [vanish("0", 0), ev("0", "HEALTHY", 10, frm="VANISHING"), vanish("0", 100, step=102)]
    assert len(explain(events, ORDER)) == 2
    assert len(explain(events[:1] + events[2:], ORDER)) == 1  # never recovered: one episode that stayed


def test_layers_without_hooks_are_placed_before_the_next_layer_that_ran():
    order = Order(["embed", "norm1", "linear1"], ["embed", "attn", "linear1", "norm1"], ["zz"])
    assert order.names == ["embed", "norm1", "attn", "linear1", "zz"]


# ---- real runs of the scenario suite --------------------------------------------------------------
def test_real_saturation_explains_every_vanishing_layer_before_it(suite_runs):
    run = suite_runs["vanishing_saturated_head"]
    (h,) = run.hypotheses
    vanishing = {e for e in run.events if e.to_state == "VANISHING"}
    assert h.root_layer == "23" and vanishing <= set(h.supporting) and len(vanishing) == 12


def test_real_bias_shift_chain_runs_jump_dead_vanishing(suite_runs):
    (h,) = suite_runs["dead_relu_bias_shift_midrun"].hypotheses
    assert [c.split(": ")[1].split(" ")[0:2] for c in h.chain] == [["the", "activations"], ["100%", "of"],
                                                                   ["gradients", "vanished"]]


def test_real_layer_scale_explosion_is_traced_to_the_scaled_layer(suite_runs):
    run = suite_runs["exploding_layer_scale_midrun"]
    top = run.hypotheses[0]
    shifted = [e.layer_name for e in run.events if e.to_state == "ANOMALOUS"]
    assert top.root_layer == "2" == min(shifted, key=run.execution_order.index) and len(shifted) == 5
    assert "after the activations of 2 moved x1," in top.statement
