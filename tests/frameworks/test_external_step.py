"""``dbg.step(n)``: a loop (a framework callback) that numbers its own steps drives NeuralDbg."""
from __future__ import annotations

import pytest
import torch

from neuraldbg_track import NeuralDbg
from tests.helpers import regression_data, train
from tests.integrations.trackers import vanishing_sigmoid_mlp

from .expected import vanishing


def _run(first_step: int, steps: int, **options) -> NeuralDbg:
    model = vanishing_sigmoid_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = regression_data()
    with NeuralDbg(model, console=False, journal=False, **options) as dbg:
        train(model, optimizer, x, y, steps, on_step=lambda i: dbg.step(first_step + i))
    return dbg


def test_events_carry_the_loops_step_numbers():
    dbg = _run(1000, 6)  # e.g. a run resumed at global step 1000
    assert {step for _, step in vanishing(dbg.events)} == {1002} and dbg.step_count == 1006


def test_every_n_steps_is_judged_on_the_loops_numbers():
    dbg = _run(1001, 6, every_n_steps=2)  # 1001..1006: 1002, 1004 and 1006 are observed
    assert dbg.observed_steps == 3 and dbg.step_count == 1007


@pytest.mark.parametrize("bad", [-1, "3", 2.5])
def test_a_bad_step_number_is_refused(bad):
    with NeuralDbg(torch.nn.Linear(2, 2), console=False, journal=False) as dbg:
        with pytest.raises(ValueError, match="integer >= 0"):
            dbg.step(bad)
