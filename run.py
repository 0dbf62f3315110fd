#!/usr/bin/env python3
"""One entry point that sets itself up: ``python3 run.py demo``, ``python3 run.py test`` or
``python3 run.py bench`` (the overhead benchmark, ``benchmarks/bench_overhead.py``).

Creates ``.venv`` beside this file on first use, installs the CPU build of torch when no torch is
importable there (``torch==2.13.0`` by default, which avoids a multi-GB CUDA download; set
``NEURALDBG_TORCH`` to another pip spec to change it), installs this package with its extras
(re-installed only when pyproject.toml changes), then runs the demo or the test suite.
Extra arguments are passed on (``python3 run.py test -k journal``).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("NEURALDBG_VENV", ROOT / ".venv"))
PY = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
EXTRAS = "dev,all"
PACKAGE_DIRS = ("neuraldbg_track", "integrations", "conf")


def sh(*args: str, **kw) -> None:
    subprocess.run(args, check=True, **kw)


def setup() -> None:
    if not PY.exists():
        print(f"[setup] creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    has_torch = subprocess.run([str(PY), "-c", "import torch"], capture_output=True).returncode == 0
    if not has_torch:
        spec = os.environ.get("NEURALDBG_TORCH", "torch==2.13.0")
        print(f"[setup] installing {spec} (CPU build)", flush=True)
        sh(*pip, spec)
    # strict editable mode links each file, so a new module needs a re-install: hash the file list too
    files = sorted(str(p.relative_to(ROOT)) for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*")
                   if p.suffix in (".py", ".yaml"))
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + EXTRAS.encode()
                            + "\n".join(files).encode()).hexdigest()
    stamp = VENV / ".neuraldbg-installed"
    if not stamp.exists() or stamp.read_text() != digest:
        print(f"[setup] installing neuraldbg-track[{EXTRAS}] (first run takes a couple of minutes)", flush=True)
        # strict mode: a real file tree, so Hydra's plugin scan finds hydra_plugins.neuraldbg_track
        sh(*pip, "-e", f"{ROOT}[{EXTRAS}]", "--config-settings", "editable_mode=strict")
        stamp.write_text(digest)


def main(argv: list[str]) -> int:
    commands = {"demo": [str(ROOT / "examples" / "train.py")], "test": ["-m", "pytest"],
                "bench": [str(ROOT / "benchmarks" / "bench_overhead.py")]}
    if not argv or argv[0] not in commands:
        print(f"usage: python3 run.py {{{'|'.join(commands)}}} [args...]", file=sys.stderr)
        return 2
    setup()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([str(PY), *commands[argv[0]], *argv[1:]], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
