"""Atomic checkpoints shared by the engine and the Flower strategy.

A checkpoint is a dict of tensors and plain values written with ``torch.save`` to a
temporary file and renamed over the old one (``os.replace``), so a crash while writing
leaves the previous checkpoint intact and a reader never sees half a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dpadmm.files import replacing


def save(path: str | Path, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (tensors are moved to the CPU first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        torch.save({k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in payload.items()}, tmp)


def load(path: str | Path | None, expected: Mapping[str, Any],
         defaults: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (None when there is none), checked against ``expected``.

    Every key of ``expected`` must hold the same value in the checkpoint; otherwise the
    checkpoint belongs to another run and a ValueError names what differs (resuming it
    would silently mix two runs). ``defaults`` holds, per mapping of the checkpoint (a run's
    configuration), the values of keys added since it may have been written: a run checkpointed
    before a key existed ran with that key's default, and resumes as such.
    """
    if path is None or not Path(path).exists():
        return None
    saved = torch.load(path, weights_only=True)
    for key, default in (defaults or {}).items():
        if isinstance(saved.get(key), Mapping):
            saved[key] = {**default, **saved[key]}
    differs = [key for key, value in expected.items() if saved.get(key) != value]
    if differs:
        detail = "; ".join(_difference(key, saved.get(key), expected[key]) for key in differs)
        raise ValueError(f"checkpoint {path} belongs to another run ({detail}); "
                         "delete it, or choose another folder, to start this run afresh")
    return saved


def _difference(key: str, saved: Any, expected: Any) -> str:
    if isinstance(saved, Mapping) and isinstance(expected, Mapping):
        keys = sorted(k for k in set(saved) | set(expected) if saved.get(k) != expected.get(k))
        return f"{key}: " + ", ".join(f"{k}={saved.get(k)!r} there, {expected.get(k)!r} here" for k in keys)
    return f"{key}={saved!r} there, {expected!r} here"
