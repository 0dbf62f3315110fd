"""Files the CLI loaders read may be corrupt or hostile: a clear error (the CLI: one line, exit 1),
bounded memory, no code execution. Payload sanitising not covered by tests/integrations is here."""
from __future__ import annotations

import re
import tracemalloc
import zlib
from pathlib import Path

import pytest

from neuraldbg_track.cli import main
from neuraldbg_track.integrations._alerts import MAX_TITLE, title_for
from neuraldbg_track.integrations._wandb_offline import CHUNK, HEADER, OfflineRunError, read_offline_run
from neuraldbg_track.sinks.jsonl import MAX_LINE_BYTES, JournalError, read_journal

ROOT = Path(__file__).resolve().parents[2]
EVENT = ('{"event_type": "gradient_health", "layer_name": "fc", "step": 1, "from_state": "UNKNOWN", '
         '"to_state": "VANISHING", "confidence": 0.9, "metadata": {}}\n')


def _cli_error(capsys, path) -> str:
    assert main(["show", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("neuraldbg-track: error: ")
    return lines[0]


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path, capsys):
    journal = tmp_path / "run" / "events.jsonl"
    journal.parent.mkdir()
    journal.write_bytes(EVENT.encode() + b'{"x": "' + b"a" * (16 * MAX_LINE_BYTES) + b'"}\n')
    tracemalloc.start()
    try:
        with pytest.raises(JournalError, match=r"events.jsonl:2: line longer than"):
            read_journal(journal)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MAX_LINE_BYTES  # the 16 MiB line was never held in memory
    assert "line longer than" in _cli_error(capsys, journal.parent)


@pytest.mark.parametrize("line, why", [
    ("[1, 2]", "expected a JSON object with the event's fields, got list"),
    ('"text"', "got str"), ("null", "got NoneType"), ("42", "got int"),
    ('{"layer_name": "fc"}', "lacks field"),
    (('{"event_type": "gradient_health", "layer_name": "fc", "step": "x", "from_state": "A", "to_state": "B", '
      '"confidence": 0.5}'), "invalid literal for int()"),
])
def test_json_that_is_not_an_event_is_a_clear_error(tmp_path, capsys, line, why):
    journal = tmp_path / "run" / "events.jsonl"
    journal.parent.mkdir()
    journal.write_text(EVENT + line + "\n")
    with pytest.raises(JournalError, match=rf"events.jsonl:2: not a valid event .*{re.escape(why)}"):
        read_journal(journal)
    assert "events.jsonl:2: not a valid event" in _cli_error(capsys, journal)


def _chunk(payload: bytes, kind: int = 1) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF
    return CHUNK.pack(crc, len(payload), kind) + payload


@pytest.mark.parametrize("body, message", [
    (CHUNK.pack(0, 100, 1) + b"x" * 10, "is truncated"),
    (_chunk(b"\xff\xff\xff\xff not a protobuf record"), "is not a W&B record"),
    (_chunk(b"abc", kind=9), "unknown chunk type 9"),
])
def test_a_corrupt_wandb_offline_file_is_a_clear_error(tmp_path, capsys, body, message):
    run = tmp_path / "wandb" / "offline-run-20260101_000000-abc" / "run-abc.wandb"
    run.parent.mkdir(parents=True)
    run.write_bytes(HEADER.pack(b":W&B", 0xBEE1, 0) + body)
    with pytest.raises(OfflineRunError, match=message):
        read_offline_run(run)
    assert message in _cli_error(capsys, run)


def test_a_tensorboard_dir_with_garbage_event_files_is_a_clear_error(tmp_path, capsys):
    log_dir = tmp_path / "runs" / "x"
    log_dir.mkdir(parents=True)
    (log_dir / "events.out.tfevents.1700000000.host.1.0").write_bytes(b"\x00\x07garbage\xff" * 500)
    assert "TensorBoard log dir" in _cli_error(capsys, log_dir)


def test_no_loader_can_execute_code_from_a_file():
    sources = [p for d in ("neuraldbg_track", "integrations") for p in (ROOT / d).rglob("*.py")]
    assert len(sources) > 20
    unsafe = re.compile(r"\bimport pickle\b|\bpickle\.|\bdill\b|\bmarshal\.loads|\bcloudpickle\b|"
                        r"\byaml\.load\(|\beval\(|\bexec\(|torch\.load\((?![^)]*weights_only=True)")
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sources
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if unsafe.search(line.split("#")[0])]  # code, not comments
    assert hits == []


def test_wandb_alert_titles_fit_wandb_limit_and_carry_no_control_characters():
    title = title_for("custom\n" + "x" * 500, "STATE\t" * 40)
    assert len(title) <= MAX_TITLE and title.isprintable()
    assert title.startswith("neuraldbg: custom x")
