"""TensorBoardSink against real event files, read back with EventAccumulator."""
from __future__ import annotations

import re
import sys

import pytest
import torch
from tensorboard.plugins.custom_scalar import layout_pb2
from torch.utils.tensorboard import SummaryWriter

from neuraldbg_track import NeuralDbg, SemanticEvent
from neuraldbg_track.integrations.tensorboard import TensorBoardSink, event_markdown, md_escape
from tests.helpers import regression_data, train
from tests.integrations.trackers import tb_reader, tb_texts, vanishing_sigmoid_mlp


@pytest.fixture(scope="module")
def vanishing_tb(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("tb") / "run"
    torch.manual_seed(0)
    model = vanishing_sigmoid_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = regression_data()
    with NeuralDbg(model, opt, sinks=[TensorBoardSink(log_dir=str(log_dir))], console=False,
                   journal=False) as dbg:
        train(model, opt, x, y, steps=30)
    return dbg.events, tb_reader(log_dir)


def test_every_event_is_one_markdown_table_row_under_one_tag(vanishing_tb):
    events, acc = vanishing_tb
    assert len(events) == 13
    text_tags = [t for t in acc.Tags()["tensors"] if t.endswith("/text_summary")]
    # one tag for the events; the post-mortem at close has its own
    assert sorted(text_tags) == ["neuraldbg/events/text_summary", "neuraldbg/hypotheses/text_summary"]
    texts = tb_texts(acc, "neuraldbg/events")
    assert texts == [(e.step, event_markdown(e)) for e in events]
    header, rule, row = texts[0][1].split("\n")
    assert header.startswith("| step | layer |") and row.startswith(f"| 2 | {events[0].layer_name} | ")
    assert "UNKNOWN → **VANISHING**" in row and "grad\\_norm = " in row


def test_state_codes_statistics_and_counts_are_scalars(vanishing_tb):
    events, acc = vanishing_tb
    tags = set(acc.Tags()["scalars"])
    for e in events:
        (state,) = acc.Scalars(f"neuraldbg/state/{e.event_type}/{e.layer_name}")
        assert (state.step, state.value) == (e.step, 2.0)  # VANISHING and activation SATURATED rank 2
        if e.event_type == "gradient_health":
            (norm,) = acc.Scalars(f"neuraldbg/grad_norm/{e.layer_name}")
            assert norm.value == pytest.approx(e.metadata["grad_norm"], rel=1e-6, abs=1e-45)
    (sat,) = acc.Scalars(f"neuraldbg/saturated_fraction/{events[-1].layer_name}")
    assert sat.value == pytest.approx(events[-1].metadata["saturated_fraction"])
    assert f"neuraldbg/rms/{events[-1].layer_name}" in tags
    assert [s.value for s in acc.Scalars("neuraldbg/events/total")] == list(range(1, 14))
    assert acc.Scalars("neuraldbg/events/gradient_health")[-1].value == 12
    assert acc.Scalars("neuraldbg/failing_layers")[-1].value == 13


def test_custom_scalars_layout_covers_every_scalar(vanishing_tb):
    _, acc = vanishing_tb
    (config,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    titles = [c.title for c in layout.category]
    assert titles == ["neuraldbg gradient_health", "neuraldbg activation_regime", "neuraldbg events"]
    charts = {ch.title: list(ch.multiline.tag) for c in layout.category for ch in c.chart}
    assert "state codes (0 HEALTHY, 1 SATURATED, 2 VANISHING, 3 EXPLODING, 4 NON_FINITE)" in charts
    patterns = [p for tags in charts.values() for p in tags]
    for tag in acc.Tags()["scalars"]:
        assert any(re.fullmatch(p, tag) for p in patterns), tag


def test_adopts_a_writer_and_leaves_it_open(tmp_path):
    writer = SummaryWriter(str(tmp_path / "mine"))
    sink = TensorBoardSink(writer=writer, layout=False)
    event = SemanticEvent("activation_regime", "enc.1", 7, "NORMAL", "DEAD", 0.8,
                          {"dead_fraction": 1.0, "rms": 0.0})
    sink.emit(event)
    sink.close()
    writer.add_scalar("loss", 0.5, 8)  # still the user's, still open
    writer.close()
    acc = tb_reader(tmp_path / "mine")
    assert [s.value for s in acc.Scalars("loss")] == [0.5]
    assert tb_texts(acc, "neuraldbg/events") == [(7, event_markdown(event))]
    assert [s.value for s in acc.Scalars("neuraldbg/state/activation_regime/enc.1")] == [3.0]
    assert "custom_scalars__config__" not in acc.Tags()["tensors"]


def test_default_log_dir_is_under_runs_like_summary_writer(tmp_path):
    sink = TensorBoardSink()
    assert sink.log_dir is None and not (tmp_path / "runs").exists()  # nothing until the first event
    sink.emit(SemanticEvent("gradient_health", "fc", 1, "HEALTHY", "EXPLODING", 0.9, {"grad_norm": 5e3}))
    sink.close()
    assert sink.log_dir.startswith("runs") and (tmp_path / sink.log_dir).is_dir()
    with pytest.raises(RuntimeError, match="after close"):
        sink.emit(SemanticEvent("gradient_health", "fc", 2, "EXPLODING", "HEALTHY", 0.9))


def test_markdown_special_characters_in_names_and_metadata_are_escaped():
    event = SemanticEvent("gradient_health", "blocks|0.*attn*_[x]<b>\nnext", 3, "HEALTHY", "NON_FINITE", 1.0,
                          {"grad_norm": float("nan")})
    row = event_markdown(event).split("\n")
    assert len(row) == 3  # a newline in a name cannot break the table
    cells = re.split(r"(?<!\\)\|", row[2])[1:-1]
    assert len(cells) == 6 and cells[1].strip() == md_escape(event.layer_name)
    assert "<b>" not in row[2] and "\\*attn\\*" in row[2] and "grad\\_norm = nan" in row[2]


def test_missing_tensorboard_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    sink = TensorBoardSink()
    with pytest.raises(ImportError, match=r'pip install "neuraldbg-track\[tensorboard\]"'):
        sink.emit(SemanticEvent("gradient_health", "fc", 1, "HEALTHY", "EXPLODING", 0.9))
