#!/usr/bin/env python3
"""Per-step overhead of neuraldbg-track against the same loop without it, in one process.

Every variant trains its own copy of the model; variants run interleaved in rounds (a block of
20 steps each, order rotated every round) so machine noise hits all of them alike. The figure is
the median over blocks of the mean step time in a block, printed as a ratio to the plain loop of
the same workload (compiled variants: to the compiled plain loop). Blocks of 20 steps hold two
observed steps of an every-10 variant, so its figure is the amortised cost users pay (a median of
single steps would only see the unobserved ones). The median single step is printed too. Journal
and console are off: this measures the extractor, not disk or terminal I/O.

    .venv/bin/python benchmarks/bench_overhead.py                 # MLP-20, CNN, transformer, naive reference
    .venv/bin/python benchmarks/bench_overhead.py --scaling       # MLPs of ~20, 100, 400, 1000 modules
    .venv/bin/python benchmarks/bench_overhead.py --compile --wandb --memory
    .venv/bin/python benchmarks/bench_overhead.py --rss          # peak RSS, each variant in its own process
    python3 run.py bench --all                                    # all of the above (sets up .venv first)
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from typing import Callable

import torch
from torch import nn

from neuraldbg_track import NeuralDbg


# ---- workloads ----------------------------------------------------------------------------------
def mlp(layers: int, width: int = 256) -> nn.Module:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class Encoder(nn.Module):
    def __init__(self, d: int = 256) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)
        self.head = nn.Linear(d, d)

    def forward(self, x):
        return self.head(self.encoder(x))


WORKLOADS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[torch.Tensor, torch.Tensor]]]] = {
    "MLP-20 (w256, b64)": (lambda: mlp(20), lambda: (torch.randn(64, 256), torch.randn(64, 256))),
    "CNN (3 conv, b32 32x32)": (SmallCNN, lambda: (torch.randn(32, 3, 32, 32), torch.randn(32, 10))),
    "Transformer enc (4L, d256, b16x32)": (Encoder, lambda: (torch.randn(16, 32, 256), torch.randn(16, 32, 256))),
}


def scaling_workloads() -> dict:
    out = {}
    for layers, width in ((10, 128), (50, 64), (200, 32), (500, 16)):
        make = (lambda n=layers, w=width: mlp(n, w))
        data = (lambda w=width: (torch.randn(32, w), torch.randn(32, w)))
        out[f"MLP {2 * layers - 1} modules (w{width})"] = (make, data)
    return out


# ---- the naive reference: the design our anchors use --------------------------------------------
def attach_naive(model: nn.Module, stack: ExitStack) -> None:
    """Per-layer .item() statistics in forward hooks plus full backward hooks (upstream NeuralDBG)."""
    stats: list[float] = []

    def fwd(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            o = output.detach()
            stats.extend([o.norm().item(), o.mean().item(), o.std().item(), (o == 0).float().mean().item(),
                          (o.abs() > 0.95).float().mean().item()])

    def bwd(module, grad_input, grad_output):
        g = grad_output[0]
        if g is not None:
            stats.extend([g.norm().item(), g.abs().max().item()])

    handles = []
    for m in model.modules():
        if next(m.children(), None) is None and not isinstance(m, nn.ReLU):  # in-place-safe leaves
            handles += [m.register_forward_hook(fwd), m.register_full_backward_hook(bwd)]
    stack.callback(lambda: [h.remove() for h in handles])
    stack.callback(stats.clear)


# ---- measurement ----------------------------------------------------------------------------------
class Variant:
    def __init__(self, name: str, make_model, make_data, stack: ExitStack, mode: str, compile_: bool = False,
                 **dbg_kw) -> None:
        torch.manual_seed(0)
        self.name, self.model = name, make_model()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.x, self.y = make_data()
        self.times: list[float] = []
        self.blocks: list[float] = []
        self.log: Callable[[torch.Tensor], None] | None = None
        if mode == "neuraldbg":
            stack.enter_context(NeuralDbg(self.model, self.opt, console=False, journal=False, **dbg_kw))
        elif mode == "naive":
            attach_naive(self.model, stack)
        elif mode == "floor":  # the least any exact per-layer gradient statistic costs: reading every gradient once
            params = [p for p in self.model.parameters() if p.requires_grad]
            handle = self.opt.register_step_pre_hook(
                lambda *_: torch.stack(torch._foreach_norm([p.grad for p in params if p.grad is not None])).tolist()
                and None)
            stack.callback(handle.remove)
        elif mode == "wandb":
            import wandb
            run = wandb.init(mode="offline", dir=stack.enter_context(tempfile.TemporaryDirectory()),
                             settings=wandb.Settings(silent=True, x_disable_stats=True))
            stack.callback(run.finish)
            run.watch(self.model, log="gradients", log_freq=1)
            self.log = lambda loss: run.log({"loss": float(loss)})
        self.forward = torch.compile(self.model) if compile_ else self.model

    def run(self, steps: int, record: bool) -> None:
        start = len(self.times)
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = nn.functional.mse_loss(self.forward(self.x), self.y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            if self.log is not None:
                self.log(loss.detach())
            if record:
                self.times.append(time.perf_counter() - t0)
        if record:
            self.blocks.append(statistics.fmean(self.times[start:]))


def measure(variants: list[Variant], rounds: int, block: int, warmup: int) -> dict[str, tuple[float, float]]:
    """Per variant: (median of block means, median single step)."""
    for v in variants:
        v.run(warmup, record=False)
    for r in range(rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            v.run(block, record=True)
    return {v.name: (statistics.median(v.blocks), statistics.median(v.times)) for v in variants}


def report(title: str, figures: dict[str, tuple[float, float]], baselines: dict[str, str]) -> None:
    print(f"\n{title}")
    print(f"  {'variant':<34}{'ms/step':>9}{'ratio':>8}{'median step ratio':>19}")
    for name, (per_step, single) in figures.items():
        base, base_single = figures[baselines.get(name, "plain")]
        print(f"  {name:<34}{per_step * 1e3:>9.3f}{per_step / base:>8.3f}{single / base_single:>19.3f}")


def run_workload(title, make_model, make_data, args, naive=True) -> None:
    with ExitStack() as stack:
        specs = [("plain", "plain", {}), ("neuraldbg every step", "neuraldbg", {}),
                 ("neuraldbg every 10 steps", "neuraldbg", {"every_n_steps": 10})]
        if naive:
            specs.append(("naive .item() + backward hooks", "naive", {}))
            specs.append(("floor: read all gradients once", "floor", {}))
        variants = [Variant(n, make_model, make_data, stack, mode, **kw) for n, mode, kw in specs]
        baselines = {}
        if args.compile:
            variants += [Variant("compiled plain", make_model, make_data, stack, "plain", compile_=True),
                         Variant("compiled + neuraldbg", make_model, make_data, stack, "neuraldbg", compile_=True)]
            baselines = {"compiled plain": "compiled plain", "compiled + neuraldbg": "compiled plain"}
        figures = measure(variants, args.rounds, args.block, args.warmup)
        report(title, figures, baselines)
        modules = sum(1 for m in variants[0].model.modules() if next(m.children(), None) is None)
        extra = figures["neuraldbg every step"][0] - figures["plain"][0]
        print(f"  every step: +{extra * 1e3:.3f} ms per step over {modules} leaf modules = "
              f"{extra * 1e6 / modules:.1f} us per module")
    if args.wandb:  # its own pass: a live wandb run keeps background threads busy, which would tax every variant
        with ExitStack() as stack:
            variants = [Variant(n, make_model, make_data, stack, mode) for n, mode in
                        (("plain", "plain"), ("wandb.watch gradients, log_freq=1", "wandb"))]
            report(f"{title}, market reference (separate pass)", measure(variants, args.rounds, args.block,
                                                                          args.warmup), {})


def peak_rss_mb() -> float:
    """This process's peak resident set. Linux: VmHWM, which starts afresh at exec (``ru_maxrss``
    keeps the parent's peak across fork+exec, so a child started by a big benchmark inherits it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_check(steps: int) -> None:
    """Event store after a long run whose statistic flaps around a threshold (no hysteresis would
    give an event every few steps), and peak RSS (Linux ru_maxrss) of the process."""
    model = nn.Linear(8, 8)
    with NeuralDbg(model, console=False, journal=False, max_events=1000) as dbg:
        g = torch.Generator().manual_seed(0)
        for _ in range(steps):
            scale = 1e-6 * float(10 ** ((torch.rand((), generator=g) - 0.5) * 0.4))  # +-0.2 decades
            model.weight.grad = torch.full_like(model.weight, scale / 8)
            model.bias.grad = torch.zeros_like(model.bias)
            dbg.step()
    print(f"\nmemory: {steps} steps of a gradient norm flapping +-0.2 decades around 1e-6 -> "
          f"{len(dbg.events)} events kept, {dbg.dropped_events} dropped")


def rss_child(variant: str, steps: int) -> None:
    """One variant alone in this process: train the MLP-20, print the peak RSS (and CUDA peak)."""
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = mlp(20).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = torch.randn(64, 256, device=device), torch.randn(64, 256, device=device)
    with ExitStack() as stack:
        if variant == "neuraldbg":
            stack.enter_context(NeuralDbg(model, opt, console=False, journal=False))
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    cuda = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else float("nan")
    print(f"{peak_rss_mb():.1f} {cuda:.1f}")


def rss_check(steps: int = 500, repeats: int = 3) -> None:
    """Peak RSS of plain vs extractor, each in a fresh process (ru_maxrss is per process)."""
    peaks: dict[str, list[tuple[float, float]]] = {"plain": [], "neuraldbg": []}
    for _ in range(repeats):
        for variant in peaks:
            out = subprocess.run([sys.executable, __file__, "--rss-child", variant, "--steps", str(steps)],
                                 capture_output=True, text=True, check=True).stdout.split()
            peaks[variant].append((float(out[0]), float(out[1])))
    rss = {v: statistics.median(p[0] for p in ps) for v, ps in peaks.items()}
    cuda = {v: statistics.median(p[1] for p in ps) for v, ps in peaks.items()}
    print(f"\npeak RSS, MLP-20, {steps} steps, median of {repeats} fresh processes: plain {rss['plain']:.1f} MB, "
          f"neuraldbg every step {rss['neuraldbg']:.1f} MB, ratio {rss['neuraldbg'] / rss['plain']:.3f}")
    if cuda["plain"] == cuda["plain"]:  # not NaN: a CUDA device was used
        print(f"peak CUDA memory allocated: plain {cuda['plain']:.1f} MB, neuraldbg {cuda['neuraldbg']:.1f} MB, "
              f"ratio {cuda['neuraldbg'] / cuda['plain']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=20, help="steps per block (a multiple of 10)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--only", default="", help="run workloads whose title contains this text")
    ap.add_argument("--scaling", action="store_true", help="the MLP scaling series instead")
    ap.add_argument("--compile", action="store_true", help="add torch.compile variants (slow to warm up)")
    ap.add_argument("--wandb", action="store_true", help="add wandb.watch(log='gradients', log_freq=1), offline")
    ap.add_argument("--memory", action="store_true", help="add the event-store check (a flapping statistic over 20,000 steps)")
    ap.add_argument("--rss", action="store_true", help="peak RSS (and CUDA memory) with and without, per process")
    ap.add_argument("--all", action="store_true", help="everything: workloads with --compile --wandb, then "
                    "--scaling, --memory and --rss (the README table; ~25 min on 2 CPU cores)")
    ap.add_argument("--rss-child", choices=("plain", "neuraldbg"), help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=500, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        return rss_child(args.rss_child, args.steps)
    if args.all:
        args.compile = args.wandb = args.memory = args.rss = True
    os.environ.setdefault("WANDB_SILENT", "true")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; {args.rounds} rounds x {args.block} steps per variant, medians")
    if args.rss and not args.all and not args.only:
        workloads: dict = {}  # --rss alone: only the per-process memory figures
    else:
        workloads = {} if args.scaling and not args.all else dict(WORKLOADS)
    for title, (make_model, make_data) in workloads.items():
        if args.only in title:
            run_workload(title, make_model, make_data, args)
    if args.scaling or args.all:
        plain_args = argparse.Namespace(**{**vars(args), "compile": False, "wandb": False})
        for title, (make_model, make_data) in scaling_workloads().items():
            if args.only in title:
                run_workload(title, make_model, make_data, plain_args, naive=False)
    if args.memory:
        memory_check(20_000)
    if args.rss:
        rss_check()


if __name__ == "__main__":
    main()
