"""The neuraldbg-track command, run as a user runs it: a subprocess, real journals, real files."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from neuraldbg_track import SemanticEvent
from neuraldbg_track.cli import main
from neuraldbg_track.compare import compare
from neuraldbg_track.plot import plot_timelines
from neuraldbg_track.sources import load_timeline
from neuraldbg_track.timeline import Timeline
from tests.compare.runs import SHIFT

SCRIPT = Path(sys.executable).parent / "neuraldbg-track"  # the installed console script
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}  # this checkout, even before a re-install


def cli(*args, script=False):
    cmd = [str(SCRIPT)] if script else [sys.executable, "-m", "neuraldbg_track.cli"]
    env = ENV
    return subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, timeout=120, env=env)


def flat(text):
    """The words of rich's output: lines joined (rich wraps long ones), table rules dropped."""
    return " ".join(re.sub(r"[│┃]", " ", text).split())


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_compare_prints_the_shift_writes_the_picture_and_json_matches_the_api(journals, tmp_path, capsys):
    picture = tmp_path / "out" / "cmp.png"
    done = cli("compare", journals["early"], journals["late"], "--plot", picture, script=True)
    assert done.returncode == 0, done.stderr
    out = flat(done.stdout)
    assert f"run B's layers 0, 2, 4 and 6 vanish {SHIFT} steps later than run A's" in out
    assert f"B +{SHIFT} steps" in out and "only in B" in out and f"picture: {picture}" in out
    width, height = png_size(picture)
    assert width == 1100 and 400 < height < 3000 and picture.stat().st_size > 10_000

    assert main(["compare", str(journals["early"]), str(journals["late"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = compare([load_timeline(journals["early"]), load_timeline(journals["late"])]).to_dict()
    assert doc == json.loads(json.dumps({**expected, "plot": None}))
    assert doc["onsets"][0]["shift_vs_A"] == {"A": 0, "B": SHIFT}


def test_show_lists_events_first_failures_and_final_states(journals, capsys):
    done = cli("show", journals["late"])
    assert done.returncode == 0, done.stderr
    out = flat(done.stdout)
    assert "First failure per kind" in out and "Final state per layer" in out
    assert f"gradient VANISHING {SHIFT} 0, 2, 4, 6 4: 0, 2, 4, 6" in out
    assert f"Summary: Run late: gradient VANISHING from step {SHIFT} (4 layers, first 0)" in out
    assert main(["show", str(journals["late"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"]["first_failures"]["activation SATURATED"] == {"step": SHIFT, "first_layers": ["7"],
                                                                    "layers": ["7"]}
    assert doc["final_states"]["7"] == {"gradient_health": "HEALTHY", "activation_regime": "SATURATED"}
    assert len(doc["events"]) == len(load_timeline(journals["late"]).events) and doc["run"]["steps"] == 120


def test_user_mistakes_are_one_line_errors_without_traceback(journals, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(journals["early"], bad)
    lines = (bad / "events.jsonl").read_text().splitlines(keepends=True)
    lines[1] = "{not json\n"
    (bad / "events.jsonl").write_text("".join(lines))
    several = tmp_path / "several"
    for name, run_dir in journals.items():
        shutil.copytree(run_dir, several / name)
    cases = [(["show", bad], f"{bad / 'events.jsonl'}:2: not a valid event"),
             (["compare", journals["early"], "tensorbord:runs/x"], "unknown source 'tensorbord:'"),
             (["show", tmp_path / "no-such-run"], f"{tmp_path / 'no-such-run'}: no such file or directory"),
             (["compare", several, journals["late"]], f"{several} holds 2 runs")]
    for args, message in cases:
        done = cli(*args)
        assert done.returncode == 1, (args, done.stdout)
        assert done.stderr.startswith("neuraldbg-track: error: ") and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert done.stdout == ""


def test_in_process_errors_and_warnings(journals, tmp_path, capsys):
    assert main(["compare", str(journals["early"])]) == 1
    assert "compare needs at least two runs" in capsys.readouterr().err
    cut = tmp_path / "cut"
    shutil.copytree(journals["early"], cut)
    (cut / "events.jsonl").write_text((cut / "events.jsonl").read_text()[:-10])
    assert main(["show", str(cut), "--json"]) == 0
    captured = capsys.readouterr()
    assert "neuraldbg-track: warning: " in captured.err and "incomplete last line ignored" in captured.err
    assert json.loads(captured.out)["run"]["name"] == "early"


def test_the_picture_scales_with_the_number_of_layers(tmp_path):
    def timeline(n):
        names = [f"blocks.{i}.fc" for i in range(n)]
        events = [SemanticEvent("gradient_health", name, 5 + i, "HEALTHY", "VANISHING", 0.9, {"onset_step": 3 + i})
                  for i, name in enumerate(names[: n // 2])]
        return Timeline.build("t", "test", events, layers=names, steps=400)

    sizes = {n: png_size(plot_timelines([timeline(n), timeline(n)], tmp_path / f"{n}.png")) for n in (9, 60, 150)}
    assert sizes[9][1] < sizes[60][1] < sizes[150][1] <= 2 * 12 * 100 + 200  # rows grow, then a panel is capped
    assert all(w == 1100 for w, _ in sizes.values())
