"""Tiny models and training loops shared by the tests (real training, CPU, seconds)."""
from __future__ import annotations

import torch
from torch import nn


def mlp(widths, act=nn.ReLU, final_act=False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2 or final_act:
            layers.append(act())
    return nn.Sequential(*layers)


def exploding_mlp(scale: float = 10.0) -> nn.Sequential:
    """A ReLU MLP with every parameter scaled up: at lr 0.01 its gradients explode, then go NaN."""
    model = mlp([16, 64, 64, 1])
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model


def regression_data(n=512, inputs=16, outputs=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, inputs, generator=g)
    w = torch.randn(inputs, outputs, generator=g) / inputs ** 0.5
    return x, x @ w + 0.1 * torch.randn(n, outputs, generator=g)


def train(model, optimizer, x, y, steps, batch=64, loss_fn=nn.functional.mse_loss, on_step=None):
    """Minibatch training; returns the last loss. ``on_step(i)`` runs after each optimizer step."""
    g = torch.Generator().manual_seed(1)
    loss = None
    for i in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=g)
        loss = loss_fn(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if on_step is not None:
            on_step(i)
    return loss


def by_layer(events, event_type=None):
    out: dict[str, list] = {}
    for e in events:
        if event_type is None or e.event_type == event_type:
            out.setdefault(e.layer_name, []).append(e)
    return out
