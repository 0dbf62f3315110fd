"""Distributed training (DDP under ``torchrun``): every rank watches its own activations, rank 0 writes.

After ``backward()`` DDP has all-reduced the gradients, so every rank holds the same ones: rank 0
judges them once. Activations differ per rank (each sees its own data), so every rank judges its
own, and an :class:`EventRelay` carries the events of the other ranks to rank 0, which alone writes
the journal, the console and the trackers. Every event carries ``metadata["rank"]``: the rank whose
observation it is (gradient events: 0).

The exchange makes the same collective calls on every rank, whatever each one saw: every ``every``-th
observed step one ``all_reduce`` (MAX) of a single integer, how many events the rank holds; only when
that maximum is non-zero, which every rank then knows, one ``all_gather_object`` of the held events.
A rank that saw an event and one that did not therefore call the same collectives: no deadlock.
Every rank must take the same optimizer steps (as DDP itself requires).

FSDP: activations work as under DDP (each rank runs the whole forward). Gradients are sharded: the
norm of one rank's shard is not the layer's norm, and judging it would be wrong, so a model with
sharded parameters (FSDP ``FlatParameter`` or DTensor) is refused unless ``gradients=False``. Per-layer
norms would need the squared shard norms all-reduced before judging; that is not implemented.
"""
from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import torch

from .config import ConfigError
from .events import SemanticEvent

SHARDED_PARAMETERS = ("FlatParameter", "DTensor")  # FSDP (1) flat shards, FSDP2 / tensor parallel


def _dist() -> Any:
    import torch.distributed as dist
    return dist


def process_group_active(group: Any = None) -> bool:
    """True when ``torch.distributed`` is initialised with more than one rank."""
    dist = _dist()
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def has_sharded_parameters(model: torch.nn.Module) -> bool:
    """True when ``model`` holds sharded parameters: an FSDP (1) wrapper, a ``FlatParameter`` or a DTensor."""
    if any(type(m).__name__ == "FullyShardedDataParallel" for m in model.modules()):
        return True  # also with use_orig_params=True, whose parameters are plain views of the shards
    return any(c.__name__ in SHARDED_PARAMETERS for p in model.parameters() for c in type(p).__mro__)


def _collective_device(group: Any) -> torch.device:
    backend = str(_dist().get_backend(group)).lower()
    if "gloo" in backend or "mpi" in backend:  # also "cpu:gloo,cuda:nccl"
        return torch.device("cpu")
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None and accelerator.is_available():
        kind = accelerator.current_accelerator().type
        return torch.device(kind, accelerator.current_device_index())
    return torch.device("cuda", torch.cuda.current_device())


class EventRelay:
    """Carries the events of every rank to rank 0 of ``group`` (default: the world).

    ``every``: exchange every n-th observed step (default 1: each rank's events reach rank 0 in the
    step they were confirmed, and nothing is left to send at close). With ``every > 1`` the events
    wait on their rank, and ``close()`` on every rank makes one last exchange. Build it after
    ``torch.distributed.init_process_group`` and pass it as ``NeuralDbg(..., distributed=relay)``.
    """

    def __init__(self, every: int = 1, group: Any = None) -> None:
        if not (isinstance(every, int) and not isinstance(every, bool) and every >= 1):
            raise ConfigError(f"EventRelay(every={every!r}); expected an integer >= 1")
        dist = _dist()
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("EventRelay needs an initialised process group: call "
                               "torch.distributed.init_process_group() first (torchrun sets its environment)")
        self.every, self.group = every, group
        self.rank = dist.get_rank()                      # the global rank, stamped on events
        self.world_size = dist.get_world_size(group)
        self.is_writer = dist.get_rank(group) == 0
        self.device = _collective_device(group)
        self.exchanges = 0                               # collective rounds made (for cost accounting)
        self.received = 0                                # events received from other ranks (rank 0)
        self._held: list[SemanticEvent] = []
        self._observed = 0

    @classmethod
    def resolve(cls, setting: Any, model: torch.nn.Module, gradients: bool) -> "EventRelay | None":
        """The relay for ``NeuralDbg(distributed=setting)``: ``None`` (default) relays when a process
        group of more than one rank is initialised; ``False`` never; ``True`` requires one; or a relay."""
        if setting is False:
            return None
        if setting is not None and setting is not True and not isinstance(setting, EventRelay):
            raise TypeError(f"distributed={setting!r}; expected None (auto), True, False or an EventRelay")
        if setting is None and not process_group_active():
            return None
        relay = setting if isinstance(setting, EventRelay) else cls()
        if gradients and has_sharded_parameters(model):
            raise ConfigError("this model has sharded parameters (FSDP or DTensor): the gradient norm of one "
                              "rank's shard is not the layer's norm. Pass gradients=False to watch activations "
                              "only (they are observed on every rank)")
        return relay

    def outgoing(self, event: SemanticEvent) -> SemanticEvent:
        """Stamp ``metadata["rank"]`` (once) and, off rank 0, hold the event for the next exchange."""
        if "rank" not in event.metadata:
            event = replace(event, metadata={**event.metadata, "rank": self.rank})
        if not self.is_writer:
            self._held.append(event)
        return event

    def exchange(self) -> list[SemanticEvent]:
        """Called on every rank at every observed step; returns, on rank 0, the other ranks' events."""
        self._observed += 1
        if self._observed % self.every:
            return []
        return self._collect()

    def finish(self, completed: bool) -> list[SemanticEvent]:
        """The last exchange at close, needed only with ``every > 1`` and made only when training
        completed (a rank that stopped on an error must not wait for the others)."""
        if self.every == 1:
            return []
        if completed and _dist().is_initialized():
            return self._collect()
        if self._held:
            warnings.warn(f"neuraldbg-track: rank {self.rank} kept {len(self._held)} event(s) that did not reach "
                          "rank 0 (training stopped before the last exchange); use every=1 to send them each step",
                          stacklevel=3)
        return []

    @torch.no_grad()
    def _collect(self) -> list[SemanticEvent]:
        dist = _dist()
        count = torch.tensor([len(self._held)], dtype=torch.int64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=self.group)
        self.exchanges += 1
        if int(count.item()) == 0:  # the same maximum on every rank: all take this branch, or none
            return []
        payload = [e.to_dict() for e in self._held]
        self._held = []
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, payload, group=self.group)
        if not self.is_writer:
            return []
        events = [SemanticEvent.from_dict(d) for part in gathered for d in (part or ())]
        self.received += len(events)
        return sorted(events, key=lambda e: e.step)
