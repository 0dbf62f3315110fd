"""Read back a W&B offline run (``wandb/offline-run-*/run-<id>.wandb``); wandb ships no reader.

The file is a 7-byte header (``:W&B``, uint16 0xBEE1, uint8 version 0) followed by LevelDB log
framing: 32 KiB blocks of chunks, each with a 7-byte header (crc32 uint32, length uint16, type
uint8: 1 full, 2 first, 3 middle, 4 last); a block tail shorter than a header is zero padding.
Each reassembled record is a ``wandb.proto.wandb_internal_pb2.Record``. Read it after ``finish()``.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

MAGIC = b":W&B"
HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class OfflineRunError(ValueError):
    """The file is not a W&B offline run file, or it is corrupt; the message says where."""


def run_file(path: str | os.PathLike) -> Path:
    """The ``.wandb`` file for an offline run directory, a ``wandb`` directory holding exactly
    one offline run, or the file itself."""
    p = Path(path)
    if p.is_file():
        return p
    found = sorted(p.glob("run-*.wandb")) or sorted(p.glob("offline-run-*/run-*.wandb")) \
        or sorted(p.glob("wandb/offline-run-*/run-*.wandb"))
    if len(found) != 1:
        raise OfflineRunError(f"expected one offline run file under {p}, found {len(found)} "
                              f"({[str(f) for f in found][:5]}); pass the run directory or the .wandb file")
    return found[0]


def iter_records(path: str | os.PathLike) -> Iterator[Any]:
    """Every ``Record`` of the run file, in write order (checksums verified)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    p = run_file(path)
    data = p.read_bytes()
    if len(data) < HEADER.size:
        raise OfflineRunError(f"{p}: {len(data)} bytes, shorter than the 7-byte W&B header")
    magic, ident, version = HEADER.unpack_from(data)
    if magic != MAGIC or ident != 0xBEE1 or version != 0:
        raise OfflineRunError(f"{p}: header {data[:7]!r} is not a W&B run file (expected ':W&B', 0xBEE1, 0)")
    pos, parts = HEADER.size, []
    while pos < len(data):
        room = BLOCK - pos % BLOCK
        if room < CHUNK.size:  # block trailer: zero padding
            pos += room
            continue
        if pos + CHUNK.size > len(data):
            break
        crc, length, kind = CHUNK.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zeros: the unwritten tail of a file still being written
            if data.count(0, pos) != len(data) - pos:
                raise OfflineRunError(f"{p}: zeroed bytes at {pos} before more data: the file is still being "
                                      "written; read it after the run finished and wandb exited "
                                      "(wandb.teardown() or the end of the process)")
            break
        start, pos = pos + CHUNK.size, pos + CHUNK.size + length
        chunk = data[start:pos]
        if len(chunk) < length:
            raise OfflineRunError(f"{p}: chunk at byte {start - CHUNK.size} is truncated "
                                  "(was the run finished before reading?)")
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise OfflineRunError(f"{p}: checksum mismatch in the chunk at byte {start - CHUNK.size}")
        if kind in (FULL, FIRST):
            parts = [chunk]
        elif kind in (MIDDLE, LAST):
            parts.append(chunk)
        else:
            raise OfflineRunError(f"{p}: unknown chunk type {kind} at byte {start - CHUNK.size}")
        if kind in (FULL, LAST):
            record = pb.Record()
            try:
                record.ParseFromString(b"".join(parts))
            except DecodeError as exc:  # a corrupt record with a valid checksum
                raise OfflineRunError(f"{p}: the record ending at byte {pos} is not a W&B record "
                                      f"({type(exc).__name__}: {exc})") from None
            yield record
            parts = []


def _put(target: dict[str, Any], item: Any) -> None:
    """Store a history/summary/config item; ``nested_key`` items rebuild the nested dict."""
    keys = [item.key] if item.key else list(item.nested_key)
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    try:
        target[keys[-1]] = json.loads(item.value_json)
    except ValueError as exc:
        raise OfflineRunError(f"the value of {'/'.join(keys)!r} is not JSON ({exc})") from None


@dataclass
class OfflineRun:
    """What one offline run file holds, as plain Python data."""

    path: Path
    alerts: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def files_dir(self) -> Path:
        return self.path.parent / "files"

    def table_paths(self, key: str) -> list[Path]:
        """Files of every table logged under ``key``, oldest first (from the history rows)."""
        return [self.files_dir / row[key]["path"] for row in self.history
                if isinstance(row.get(key), dict) and row[key].get("_type") == "table-file"]

    def table(self, key: str) -> list[dict[str, Any]]:
        """The rows of the last table logged under ``key``, as dicts keyed by column."""
        paths = self.table_paths(key)
        if not paths:
            raise OfflineRunError(f"{self.path}: no table logged under {key!r}; history keys: "
                                  f"{sorted({k for row in self.history for k in row})[:20]}")
        try:
            doc = json.loads(paths[-1].read_text(encoding="utf-8"))
            return [dict(zip(doc["columns"], row)) for row in doc["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise OfflineRunError(f"{paths[-1]}: not a W&B table file ({type(exc).__name__}: {exc})") from None


def read_offline_run(path: str | os.PathLike) -> OfflineRun:
    """Alerts, history rows, summary, config and metric definitions of an offline run."""
    run = OfflineRun(run_file(path))
    for record in iter_records(run.path):
        kind = record.WhichOneof("record_type")
        if kind == "alert":
            a = record.alert
            run.alerts.append({"title": a.title, "text": a.text, "level": a.level,
                               "wait_duration_ms": a.wait_duration})
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                _put(row, item)
            run.history.append(row)
        elif kind == "summary":
            for item in record.summary.update:
                _put(run.summary, item)
        elif kind == "config":
            for item in record.config.update:
                _put(run.config, item)
        elif kind == "metric":
            m = record.metric
            run.metrics.append({"name": m.name, "glob_name": m.glob_name, "step_metric": m.step_metric})
    return run
