"""How long a ``dpadmm reproduce`` call will take, said before it starts, from a short timed probe.

The papers' default grids run for minutes (004, 001, 002) or days (003: T = 20,000 rounds, 10 seeds a
cell): a caller must know which before starting. A grid is a list of :class:`Unit` (a run of the
engine, several seeds batched); units whose iterations cost the same share a ``key`` and one probe. A probe
runs the unit's configuration for a few iterations, twice (after one untimed iteration), every iteration
evaluated (:func:`probe`), and gives a cost model of three numbers: the seconds of one iteration (the
engine's own clock, ``seconds`` in each record), of one evaluation, and of the start (set-up); a unit then
costs start + iterations x iteration + evaluations x evaluation. The estimate covers the engine runs of the
units not yet complete; what a grid does besides (a reference solver, scikit-learn baselines, the report and
figures) is named by the caller (:class:`Estimate`'s ``excluded``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

PROBE_ITERATIONS = 2  # per timed run of a probe; it runs this many and then twice as many

Records = list[dict[str, Any]]


@dataclass(frozen=True)
class Cost:
    """Seconds of one iteration, of one evaluation and of a run's start, for one kind of unit."""

    iteration: float
    evaluation: float
    start: float

    def of(self, iterations: int, evaluations: int) -> float:
        return self.start + iterations * self.iteration + evaluations * self.evaluation


@dataclass(frozen=True)
class Unit:
    """A run a grid will make: ``iterations`` of one configuration, with ``evaluations`` of them evaluated.

    ``probe(k)`` runs that configuration (with its batch of seeds) for k iterations, each evaluated,
    writing nothing, and returns one seed's records (each with the engine's ``seconds``). Units with the
    same ``key`` cost the same per iteration, so one probe serves them all."""

    key: Hashable
    iterations: int
    evaluations: int
    probe: Callable[[int], Records]


@dataclass(frozen=True)
class Estimate:
    """The estimated seconds of a grid's pending units, how many there were and how many probes timed them,
    and what the estimate leaves out (words, empty when nothing)."""

    seconds: float
    units: int
    probes: int
    probe_seconds: float
    excluded: str = ""

    def line(self, at_once: int = 1) -> str:
        """The line ``dpadmm reproduce`` prints before it starts; with ``at_once`` cells running together (on
        Ray workers, each with its share of the cores) the wall time is the runs' total over that many, the
        probes having run at this process's thread count (a rough figure: cells differ in length)."""
        if not self.units:
            return "reproduce: every run of this grid is complete in --out; only the report is rebuilt"
        left_out = f"; not included: {self.excluded}" if self.excluded else ""
        at_once = max(1, min(at_once, self.units))
        shared = f" ({at_once} at once; {duration(self.seconds)} one after another)" if at_once > 1 else ""
        return (f"reproduce: estimated wall time {duration(self.seconds / at_once)}{shared} for the "
                f"{self.units} "
                f"run{'s' if self.units > 1 else ''} not yet complete (timed by {self.probes} short "
                f"probe{'s' if self.probes > 1 else ''} on this machine, {self.probe_seconds:.0f} s; a "
                f"rough figure, often off by tens of percent){left_out}")


def probe(run: Callable[[int], Records], iterations: int = PROBE_ITERATIONS) -> Cost:
    """The cost model of ``run`` (``Unit.probe``) from two timed runs of ``iterations`` and twice as many
    iterations, every one evaluated: the engine's clock gives an iteration (the median over both runs), the
    difference of the two wall times an iteration with its evaluation, the rest the start. A run of one
    iteration goes first, untimed: what happens once per process (reading a data set into its cache,
    loading kernels) would otherwise count as the start of every unit."""
    run(1)
    walls, seconds = [], []
    for k in (iterations, 2 * iterations):
        started = time.perf_counter()
        records = run(k)
        walls.append(time.perf_counter() - started)
        seconds += [float(r["seconds"]) for r in records]
    iteration = statistics.median(seconds)
    with_evaluation = max((walls[1] - walls[0]) / iterations, iteration)
    start = max(walls[0] - iterations * with_evaluation, 0.0)
    return Cost(iteration=iteration, evaluation=with_evaluation - iteration, start=start)


def estimate(units: Sequence[Unit], excluded: str = "") -> Estimate:
    """The estimated seconds of ``units``, one probe per key (in the order the units come)."""
    costs: dict[Hashable, Cost] = {}
    started = time.perf_counter()
    total = 0.0
    for unit in units:
        if unit.key not in costs:
            costs[unit.key] = probe(unit.probe)
        total += costs[unit.key].of(unit.iterations, unit.evaluations)
    return Estimate(seconds=total, units=len(units), probes=len(costs),
                    probe_seconds=time.perf_counter() - started, excluded=excluded)


def evaluations(iterations: int, every: int) -> int:
    """How many of ``iterations`` an engine evaluates: every ``every``-th and the last."""
    return iterations // every + (1 if iterations % every else 0)


def duration(seconds: float) -> str:
    """``seconds`` as a person reads a wall time: about 40 s, about 12 minutes, about 3.4 hours, about 2.1
    days."""
    if seconds < 90:
        return f"about {max(seconds, 1):.0f} s"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} minutes"
    if seconds < 48 * 3600:
        return f"about {seconds / 3600:.1f} hours"
    return f"about {seconds / 86400:.1f} days"
