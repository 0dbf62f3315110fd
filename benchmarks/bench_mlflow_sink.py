#!/usr/bin/env python3
"""Step time with and without ``MLflowSink`` delivering to a live ``mlflow server`` on loopback.

One process, identical models watched by NeuralDbg (journal on, console off): two without a
tracker (the second is an A/A check: its ratio shows the noise) and one with ``MLflowSink``. The loss is scaled by 1e-9 for ``--flip-every`` steps out of every 2x that many
(a loss-scaling bug), so every Linear layer goes VANISHING and back: many events, all the time.
Variants run interleaved in blocks (order rotated each round) so machine noise hits both alike;
the figure is the ratio of median step times. At the end both close and the delivery counts
(received / delivered / undelivered) are printed, so a fast but lossy sink would show.

    .venv/bin/python benchmarks/bench_mlflow_sink.py
    .venv/bin/python benchmarks/bench_mlflow_sink.py --rounds 40 --block 25
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import torch
from torch import nn

from neuraldbg_track import NeuralDbg
from neuraldbg_track.delivery import BackgroundSink
from neuraldbg_track.integrations.mlflow import MLflowSink


def start_server(root: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
           "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(cmd, stdout=open(root / "server.log", "w"), stderr=subprocess.STDOUT, cwd=root,
                            env=env, start_new_session=True)
    uri, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2).close()
            return proc, uri
        except OSError:
            time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    sys.exit(f"mlflow server did not start; see {root / 'server.log'}")


class Variant:
    def __init__(self, name: str, args, journal: Path, stack: ExitStack, sink=None) -> None:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width), nn.ReLU()]
        self.name, self.model, self.flip = name, nn.Sequential(*layers[:-1]), args.flip_every
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.x, self.y = torch.randn(args.batch, args.width), torch.randn(args.batch, args.width)
        self.times: list[float] = []
        self.step = 0
        self.dbg = stack.enter_context(NeuralDbg(self.model, self.opt, sinks=[sink] if sink else [],
                                                 console=False, journal=journal, thresholds={"patience": 1}))

    def run(self, steps: int, record: bool) -> None:
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = nn.functional.mse_loss(self.model(self.x), self.y)
            if (self.step // self.flip) % 2:
                loss = loss * 1e-9  # gradients fall below the vanishing threshold
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.step += 1
            if record:
                self.times.append(time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--flip-every", type=int, default=5)
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        proc, uri = start_server(root)
        try:
            sink = MLflowSink(tracking_uri=uri, experiment_name="bench")
            with ExitStack() as stack:
                variants = [Variant("journal only", args, root / "nd", stack),
                            Variant("journal only (A/A check)", args, root / "nd", stack),
                            Variant("journal + MLflowSink", args, root / "nd", stack, sink)]
                (bg,) = [s for s in variants[2].dbg.sinks.sinks if isinstance(s, BackgroundSink)]
                for v in variants:
                    v.run(args.warmup, record=False)
                for r in range(args.rounds):
                    for v in variants[r % 3:] + variants[: r % 3]:
                        v.run(args.block, record=True)
                t0 = time.perf_counter()
            close_s = time.perf_counter() - t0
            stats = bg.stats
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    base = statistics.median(variants[0].times)
    print(f"{args.layers}-layer MLP (width {args.width}, batch {args.batch}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads), {args.rounds}x{args.block} steps per variant, mlflow server at {uri}")
    print(f"{'variant':<28}{'events':>8}{'median ms':>11}{'p90 ms':>9}{'ratio':>8}")
    for v in variants:
        med, p90 = statistics.median(v.times), statistics.quantiles(v.times, n=10)[-1]
        print(f"{v.name:<28}{len(v.dbg.events):>8}{med * 1e3:>11.3f}{p90 * 1e3:>9.3f}{med / base:>8.3f}")
    print(f"MLflowSink delivery: received {stats.received}, delivered {stats.delivered}, undelivered "
          f"{stats.undelivered} {stats.reasons or ''}; close() took {close_s:.2f} s (all variants)")


if __name__ == "__main__":
    main()
