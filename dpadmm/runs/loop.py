"""The round loop of a batched engine, for any family: timed rounds, evaluations, one run folder per seed.

A family's engine gives :func:`timed_rounds` its round (``step``) and its metrics (``evaluate``);
the loop times each round (evaluations excluded; on a GPU after the kernels finish), adds
``seconds`` (of the round) and ``elapsed`` (of rounds 1..t) to every evaluated record, writes them
and shows a progress bar.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dpadmm.runs.results import RunWriter, closing, progress_bar


def seed_writers(config: Any, seeds: Sequence[int], ledger: Any,
                 directories: Sequence[str | Path] | None = None,
                 spent: Callable[[int], Any] | None = None) -> list[RunWriter]:
    """A run folder per seed for a configuration dataclass with ``seed``, ``out``, ``default_out()`` and
    ``to_mapping()``: ``directories`` when given (the caller's, used as they are), else ``out`` (with a
    ``seed-<s>`` sub-folder each when there are several seeds), else each seed's default, never overwriting an
    earlier run. Each gets config.json and, for a private run, privacy.json; with ``spent`` (the ledger of the
    first k rounds), a run that stops early rewrites it with what those rounds spent."""
    writers = []
    for i, seed in enumerate(seeds):
        own = dataclasses.replace(config, seed=seed)
        if directories is not None:
            folder = Path(directories[i])
        elif config.out:
            folder = Path(config.out) / f"seed-{seed}" if len(seeds) > 1 else Path(config.out)
        else:
            folder = Path(own.default_out())
        writer = RunWriter(own.to_mapping(), engine="batched", directory=folder, fresh=directories is None)
        if ledger:
            writer.write_ledger(ledger)
            writer.spent = spent
        writers.append(writer)
    return writers


def timed_rounds(rounds: int, step: Callable[[int], None], evaluate: Callable[[int], list[dict[str, Any]]], *,
                 eval_every: int, writers: Sequence[RunWriter], runs: int, progress: bool,
                 unit: str = "round", cuda: bool = False) -> list[list[dict[str, Any]]]:
    """Run ``step(t)`` for t = 1..rounds; after every ``eval_every``-th and the last, ``evaluate(t)`` gives a
    record per run. Returns the records of each run; closes the writers."""
    records: list[list[dict[str, Any]]] = [[] for _ in range(runs)]
    bar = progress_bar(rounds, progress, unit=unit)
    elapsed = 0.0
    try:
        with closing(writers):
            for t in range(1, rounds + 1):
                started = time.perf_counter()
                step(t)
                for writer in writers:  # round t released: a stop from here on states what it spent
                    writer.completed = t
                if cuda:  # the clock must see the kernels finish
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - started
                elapsed += seconds
                if t % eval_every == 0 or t == rounds:
                    for i, metrics in enumerate(evaluate(t)):
                        metrics.update(seconds=seconds, elapsed=elapsed)
                        records[i].append(metrics)
                        if writers:
                            writers[i].record(metrics)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return records
