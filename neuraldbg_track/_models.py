"""Tiny models, data and optimizers for the scenario suite (:mod:`neuraldbg_track.scenarios`).

Every builder returns a :class:`Setup`: the model, its optimizer, a deterministic batch function
and, optionally, an injection run before given steps. Data are synthetic and small; a scenario
trains in about a second on one CPU core.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Setup:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: Callable[[int, int], Batch]
    """``batch(step, micro)``: the inputs and targets of micro-batch ``micro`` of training step ``step``."""
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.mse_loss
    accumulate: int = 1
    bf16: bool = False
    inject: Callable[[int, "Setup"], None] | None = None
    """Called before each training step with its number: how mid-run faults are injected."""


def optimizer(model: nn.Module, sgd: float | None = None, adam: float | None = None,
              momentum: float = 0.0) -> torch.optim.Optimizer:
    if adam is not None:
        return torch.optim.Adam(model.parameters(), lr=adam)
    return torch.optim.SGD(model.parameters(), lr=sgd if sgd is not None else 0.01, momentum=momentum)


def sampler(x: torch.Tensor, y: torch.Tensor, batch: int = 64, scale_at: tuple[int, float] | None = None,
            nan_at: int | None = None) -> Callable[[int, int], Batch]:
    """Random minibatches, the same for a given (step, micro); optionally inputs scaled from a step on,
    or a NaN planted in one step's inputs."""
    def sample(step: int, micro: int) -> Batch:
        g = torch.Generator().manual_seed(7919 * step + micro)
        idx = torch.randint(0, len(x), (batch,), generator=g)
        xb, yb = x[idx], y[idx]
        if scale_at is not None and step >= scale_at[0]:
            xb = xb * scale_at[1]
        if nan_at is not None and step == nan_at:
            xb = xb.clone()
            xb[0, 0] = float("nan")
        return xb, yb
    return sample


def _regression(n: int, inputs: int, outputs: int = 1) -> Batch:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, inputs, generator=g)
    w = torch.randn(inputs, outputs, generator=g) / inputs ** 0.5
    return x, x @ w + 0.1 * torch.randn(n, outputs, generator=g)


def mlp_setup(widths: list[int], act: type[nn.Module], *, lr: float | None = None, adam: float | None = None,
              bias: dict[int, float] | None = None, gain: float = 1.0, input_scale: float = 1.0,
              target_shift: float = 0.0,
              scale_at: tuple[int, float] | None = None, nan_at: int | None = None, accumulate: int = 1,
              bf16: bool = False, inject: Callable[[int, Setup], None] | None = None) -> Setup:
    """``nn.Sequential`` of Linear + ``act`` (Linear ``"0"``, act ``"1"``, ...; no activation after the
    last Linear); ``bias`` sets given Linear biases, ``gain`` multiplies every weight at init."""
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(act())
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for index, value in (bias or {}).items():
            model[index].bias.fill_(value)
        if gain != 1.0:
            for layer in model:
                if isinstance(layer, nn.Linear):
                    layer.weight.mul_(gain)
    x, y = _regression(512, widths[0], widths[-1])
    batches = sampler(x * input_scale, y + target_shift, scale_at=scale_at, nan_at=nan_at)
    return Setup(model, optimizer(model, lr, adam), batches, accumulate=accumulate, bf16=bf16, inject=inject)


def cnn_setup(sgd: float | None = None, adam: float | None = None, bf16: bool = False) -> Setup:
    """Two 3x3 conv layers on 8x8 single-channel images, global pooling, a 4-class head."""
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 1, 8, 8, generator=g)
    y = torch.stack([x[:, 0, :4, :4].mean((1, 2)), x[:, 0, 4:, :4].mean((1, 2)),
                     x[:, 0, :4, 4:].mean((1, 2)), x[:, 0, 4:, 4:].mean((1, 2))], 1).argmax(1)
    return Setup(model, optimizer(model, sgd, adam, momentum=0.9), sampler(x, y),
                 loss=nn.functional.cross_entropy, bf16=bf16)


class RecurrentNet(nn.Module):
    """An LSTM or GRU over a sequence; the head reads the last time step."""

    def __init__(self, cell: type[nn.Module], inputs: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.rnn = cell(inputs, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class TinyTransformer(nn.Module):
    """A linear embedding, a 2-layer pre-norm transformer encoder, mean pooling and a linear head."""

    def __init__(self, inputs: int = 8, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(inputs, width)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


def _sequences(n: int = 512, length: int = 10, inputs: int = 8) -> Batch:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, length, inputs, generator=g)
    return x, (x[:, :, 0].cumsum(1)[:, -1:] / length ** 0.5 + 0.5 * x[:, -1, 1:2])


def rnn_setup(cell: type[nn.Module], sgd: float | None = None, adam: float | None = None,
              accumulate: int = 1) -> Setup:
    model = RecurrentNet(cell)
    return Setup(model, optimizer(model, sgd, adam), sampler(*_sequences()), accumulate=accumulate)


def transformer_setup(sgd: float | None = None, adam: float | None = None, bf16: bool = False,
                      accumulate: int = 1) -> Setup:
    model = TinyTransformer()
    return Setup(model, optimizer(model, sgd, adam), sampler(*_sequences()), accumulate=accumulate, bf16=bf16)
