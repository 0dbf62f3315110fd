"""Hook lifecycle and the awkward models: eval passes, in-place ops, tuples, frozen and shared weights."""
import pytest
import torch
from torch import nn

from neuraldbg_track import ConfigError, NeuralDbg
from tests.helpers import mlp, regression_data, train


def _hook_counts(model, opt):
    forward = sum(len(m._forward_hooks) for m in model.modules())
    optim = len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks)
    return forward, optim


def test_hooks_installed_on_enter_and_removed_on_exit():
    model = mlp([8, 16, 16, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = NeuralDbg(model, opt, console=False)
    assert _hook_counts(model, opt) == (0, 0)
    with dbg:
        # leaf modules (3 Linear + 2 ReLU) are watched; the Sequential container gets one hook that
        # only reduces the outputs batched during its forward
        assert _hook_counts(model, opt) == (6, 2)
        assert len(model._forward_hooks) == 1
    assert _hook_counts(model, opt) == (0, 0)


def test_hooks_removed_when_training_raises(tmp_path):
    model = mlp([8, 16, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(ZeroDivisionError):
        with NeuralDbg(model, opt, console=False) as dbg:
            train(model, opt, torch.randn(64, 8), torch.randn(64, 1), steps=3)
            1 / 0
    assert _hook_counts(model, opt) == (0, 0)
    info = (dbg.journal_path.parent / "run.json").read_text()
    assert '"status": "stopped by ZeroDivisionError"' in info and '"steps": 3' in info


def _train_with_side_passes(side_pass, steps=40):
    """Training where ``side_pass(model, x)`` runs between backward() and step(), so anything it
    wrongly recorded would be what the step observes."""
    model = mlp([16, 64, 64, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = regression_data()
    crazy = torch.full((64, 16), 1e4)  # 4 decades off the baseline: ANOMALOUS if observed
    with NeuralDbg(model, opt, console=False) as dbg:
        for i in range(steps):
            loss = nn.functional.mse_loss(model(x[:64]), y[:64])
            opt.zero_grad()
            loss.backward()
            if i >= 10:
                side_pass(model, crazy)
            opt.step()
    return dbg


def test_eval_and_no_grad_passes_are_not_observed():
    def evaluate(model, crazy):
        model.eval()
        model(crazy)
        model.train()
        with torch.no_grad():
            model(crazy)
        with torch.inference_mode():
            model(crazy)

    assert _train_with_side_passes(evaluate).events == []


def test_same_side_pass_in_training_mode_is_observed():
    """Control for the test above: the same inputs in a training forward do produce events."""
    dbg = _train_with_side_passes(lambda model, crazy: model(crazy))
    act = [e for e in dbg.events if e.event_type == "activation_regime"]
    assert act and act[0].to_state == "ANOMALOUS" and act[0].metadata["onset_step"] == 10


class Tricky(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.relu = nn.ReLU(inplace=True)
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.tied = nn.Linear(16, 16)
        self.tied_again = nn.Linear(16, 16)
        self.tied_again.weight = self.tied.weight      # shared parameter
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        h = self.relu(self.embed(x))
        h, _ = self.lstm(h)                              # tuple output
        h = self.tied_again(self.tied(self.frozen(h)))
        return {"out": self.head(h).mean(dim=1)}         # dict output


def test_inplace_relu_lstm_frozen_shared_and_dict_outputs():
    model = Tricky()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    x, y = torch.randn(64, 5, 8), torch.randn(64, 1)
    with NeuralDbg(model, opt, console=False) as dbg:
        for _ in range(20):
            loss = nn.functional.mse_loss(model(x)["out"], y)
            opt.zero_grad(); loss.backward(); opt.step()
    states = dbg.states()
    assert states["lstm"]["activation_regime"] == "NORMAL"          # tuple output was read
    assert states["relu"]["activation_regime"] == "NORMAL"          # in-place op survived
    assert "gradient_health" not in states["frozen"]                # no grads, no judgement
    assert states["tied"]["gradient_health"] == "HEALTHY"
    # the shared weight is judged once, under its first owner; tied_again keeps only its bias
    tied_again = next(l for l in dbg.layers if l.name == "tied_again")
    assert [p is model.tied_again.bias for p in tied_again.params] == [True]


def test_compiled_module_is_refused_with_instructions():
    model = mlp([4, 4])
    with pytest.raises(TypeError, match="Attach first, then compile"):
        NeuralDbg(torch.compile(model))


def test_nested_contexts_on_one_model_are_refused():
    model = mlp([4, 4])
    with NeuralDbg(model, console=False, journal=False):
        with pytest.raises(RuntimeError, match="already watched"):
            NeuralDbg(model, console=False, journal=False).attach()
    with NeuralDbg(model, console=False, journal=False):  # free again after exit
        pass


def test_step_outside_context_and_with_optimizer_are_refused():
    model = mlp([4, 4])
    dbg = NeuralDbg(model, console=False, journal=False)
    with pytest.raises(RuntimeError, match="outside the NeuralDbg context"):
        dbg.step()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt, console=False, journal=False) as dbg2:
        with pytest.raises(RuntimeError, match="counted from the optimizer"):
            dbg2.step()


def test_include_exclude_and_module_types_select_layers():
    model = mlp([4, 8, 8, 1])
    names = lambda **kw: [l.name for l in NeuralDbg(model, journal=False, **kw).layers]
    assert names() == ["0", "1", "2", "3", "4"]
    assert names(module_types=["Linear"]) == ["0", "2", "4"]
    assert names(include=["0", "4"]) == ["0", "4"]
    assert names(exclude=["1", "3"]) == ["0", "2", "4"]
    with pytest.raises(ConfigError, match="include pattern 'encoder.*' matches no layer"):
        NeuralDbg(model, include=["encoder.*"])


def test_disabled_installs_nothing():
    model = mlp([4, 8, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, opt, enabled=False) as dbg:
        assert _hook_counts(model, opt) == (0, 0)
        train(model, opt, torch.randn(64, 4), torch.randn(64, 1), steps=2)
    assert dbg.events == [] and dbg.journal_path is None
