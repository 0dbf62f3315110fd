"""Payload shaping shared by the tracker adapters: safe keys, bounded values, state severity.

Nothing here imports a tracker. The limits default to MLflow's (the strictest of the three):
keys of ``[/\\w.\\- ]`` up to 250 characters, values up to 8,000 characters.
"""
from __future__ import annotations

import hashlib
import re
from typing import Iterable

#: States from least to most severe. Both "all is well" states rank above UNKNOWN (nothing
#: confirmed yet), HEALTHY above NORMAL so a run whose gradients and activations are fine reads
#: HEALTHY; then warnings (an activation-scale shift, saturation, dead units) and the failures
#: that stop learning: VANISHING < EXPLODING < NON_FINITE (NaN/Inf: the run is broken).
SEVERITY: tuple[str, ...] = ("UNKNOWN", "NORMAL", "HEALTHY", "ANOMALOUS", "SATURATED", "DEAD",
                             "VANISHING", "EXPLODING", "NON_FINITE")
_RANK = {state: rank for rank, state in enumerate(SEVERITY)}
_UNLISTED_RANK = _RANK["ANOMALOUS"]  # a state this version does not know is treated as a warning

MAX_KEY = 250
MAX_VALUE = 8000
_BAD_KEY_CHARS = re.compile(r"[^\w.\- ]", re.ASCII)


def severity(state: str) -> int:
    """The rank of ``state`` in :data:`SEVERITY` (an unlisted state ranks like ANOMALOUS)."""
    return _RANK.get(str(state), _UNLISTED_RANK)


def worst_state(states: Iterable[str], default: str = "UNKNOWN") -> str:
    """The most severe of ``states`` (ties broken by name, so the answer is deterministic)."""
    best = None
    for state in states:
        state = str(state)
        if best is None or (severity(state), state) > (severity(best), best):
            best = state
    return default if best is None else best


def sanitize_key(name: str, max_len: int = MAX_KEY) -> str:
    """``name`` made safe as one tracker key segment: characters outside ``[A-Za-z0-9_.\\- ]``
    (slashes too, so a key never looks like a path) become ``_``. A name that had to change
    or be shortened gets ``-<8 hex digits of its SHA-256>`` appended, so the mapping is
    deterministic and two different names never share a key. ``""`` (the root module) is ``_root``.
    """
    name = str(name)
    clean = _BAD_KEY_CHARS.sub("_", name) if name else "_root"
    if clean == name and len(clean) <= max_len:
        return clean
    tag = "-" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return clean[: max(max_len - len(tag), 1)] + tag


def truncate(value: object, limit: int = MAX_VALUE, marker: str = "…") -> str:
    """``str(value)`` cut to at most ``limit`` characters, ending in ``marker`` when cut."""
    text = str(value)
    if len(text) <= limit:
        return text
    return text[: max(limit - len(marker), 0)] + marker[:limit]


def join_truncated(items: Iterable[object], limit: int = MAX_VALUE, sep: str = ",") -> str:
    """Items joined by ``sep``, keeping whole items only: when they do not all fit in ``limit``
    characters the tail is replaced by ``…(+N more)``."""
    parts = [str(i) for i in items]
    text = sep.join(parts)
    if len(text) <= limit:
        return text
    kept: list[str] = []
    used = 0
    for i, part in enumerate(parts):  # the last item never fits here: the whole text did not
        cost = len(part) + (len(sep) if kept else 0)
        rest = len(parts) - i - 1
        if used + cost + (len(f"{sep}…(+{rest} more)") if rest else 0) > limit:
            break
        kept.append(part)
        used += cost
    tail = f"{sep if kept else ''}…(+{len(parts) - len(kept)} more)"
    return truncate(sep.join(kept) + tail, limit)
