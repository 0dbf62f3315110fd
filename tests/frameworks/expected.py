"""What the framework tests expect, and how they read events back from a TensorBoard run.

They train ``vanishing_sigmoid_mlp`` (as ``net``): its 12 Linear layers vanish at step 2 and its last
sigmoid saturates."""
from __future__ import annotations

import json

from neuraldbg_track import SemanticEvent
from tests.integrations.trackers import tb_reader

VANISHING = {(f"net.{i}", 2) for i in range(0, 24, 2)}  # (layer, step) of every VANISHING event


def vanishing(events) -> set[tuple[str, int]]:
    return {(e.layer_name, e.step) for e in events if e.to_state == "VANISHING"}


def tensorboard_events(log_dir, prefix: str = "neuraldbg") -> tuple[list[SemanticEvent], set[str]]:
    """The events a TensorBoardSink wrote under ``log_dir`` and every scalar tag found there."""
    from tensorboard.util import tensor_util

    acc = tb_reader(log_dir)
    tensors = acc.Tensors(f"{prefix}/event_json") if f"{prefix}/event_json" in acc.Tags()["tensors"] else []
    events = [SemanticEvent.from_dict(json.loads(tensor_util.make_ndarray(t.tensor_proto).item().decode()))
              for t in tensors]
    return events, set(acc.Tags()["scalars"]) | set(acc.Tags()["tensors"])
