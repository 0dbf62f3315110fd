"""The README demo runs and shows what it promises (docs cannot rot)."""
import importlib.util
from pathlib import Path

from neuraldbg_track import read_journal

DEMO = Path(__file__).resolve().parents[1] / "examples" / "train.py"


def _demo_config(*overrides):
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(version_base="1.3", config_dir=str(DEMO.parent / "conf")):
        return compose(config_name="train", overrides=list(overrides))


def test_demo_reports_vanishing_early_layers(capsys):
    spec = importlib.util.spec_from_file_location("demo_train", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    dbg = demo.run(_demo_config("steps=40"))
    vanishing = {e.layer_name for e in dbg.events if e.to_state == "VANISHING"}
    assert {"blocks.0.fc", "blocks.1.fc"} <= vanishing and "head" not in vanishing
    out = capsys.readouterr()
    assert f"journal: {dbg.journal_path}" in out.out and "blocks.0.fc" in out.err
    assert read_journal(dbg.journal_path) == dbg.events
