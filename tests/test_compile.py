"""torch.compile after attach: same events as eager, and no graph break added by the extractor."""
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

from neuraldbg_track import NeuralDbg
from tests.helpers import mlp, regression_data, train


def _events(compiled: bool):
    torch.manual_seed(0)
    model = mlp([16] + [32] * 12 + [1], act=nn.Sigmoid)   # its first layers' gradients vanish
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt, console=False, journal=False) as dbg:
        run = torch.compile(model) if compiled else model
        train(run, opt, *regression_data(), steps=6)
    return [(e.step, e.layer_name, e.event_type, e.from_state, e.to_state) for e in dbg.events], dbg


def test_compiled_model_gives_the_same_events_without_graph_breaks():
    torch._dynamo.reset()
    counters.clear()
    eager, _ = _events(compiled=False)
    compiled, dbg = _events(compiled=True)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert compiled == eager and len(eager) >= 2
    assert dbg.states()["1"]["activation_regime"] == "NORMAL"   # forward hooks ran inside the graph
