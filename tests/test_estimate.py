"""dpadmm.runs.estimate: the wall time a ``dpadmm reproduce`` call prints before it starts.

The probes here time a run whose costs are known (it sleeps them): a start, and per iteration a computation
the engine's clock sees and an evaluation it does not. The families' estimates of real grids are checked
in their reproduce tests (test_reproduce.py, test_linadmm_reproduce.py, test_sharing_reproduce.py,
test_decentral_reproduce.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dpadmm.runs.estimate import Cost, Estimate, Unit, duration, estimate, evaluations, probe

START, ITERATION, EVALUATION = 0.1, 0.04, 0.06


def sleeper(calls: list[int]) -> Any:
    """A run of k iterations, each evaluated, that sleeps the known costs; the first call also loads (0.6 s),
    as a run that reads a data set into a cache does."""

    def run(k: int) -> list[dict[str, Any]]:
        time.sleep(START + (0.6 if not calls else 0.0))
        calls.append(k)
        records = []
        for _ in range(k):
            began = time.perf_counter()
            time.sleep(ITERATION)
            records.append({"seconds": time.perf_counter() - began})
            time.sleep(EVALUATION)
        return records

    return run


def test_a_probe_separates_the_start_an_iteration_and_an_evaluation() -> None:
    """The untimed first run takes the once-per-process loading; the two timed runs give the rest."""
    calls: list[int] = []
    cost = probe(sleeper(calls), iterations=3)
    assert calls == [1, 3, 6]
    # sleeps overshoot on a busy machine: loose bounds, but the loading (0.6 s) is not the start
    assert cost.iteration == pytest.approx(ITERATION, rel=0.5)
    assert cost.evaluation == pytest.approx(EVALUATION, abs=0.04)
    assert 0 <= cost.start < 0.3
    assert cost.of(100, 10) == pytest.approx(cost.start + 100 * cost.iteration + 10 * cost.evaluation)


def test_units_of_one_key_share_a_probe_and_add_up() -> None:
    calls: list[int] = []
    run = sleeper(calls)
    units = [Unit(key="a", iterations=1000, evaluations=10, probe=run),
             Unit(key="a", iterations=500, evaluations=5, probe=run)]
    found = estimate(units, excluded="the report")
    assert found.probes == 1 and found.units == 2 and len(calls) == 3
    expected = 2 * START + 1500 * ITERATION + 15 * EVALUATION
    assert found.seconds == pytest.approx(expected, rel=0.5)
    assert found.line() == (f"reproduce: estimated wall time {duration(found.seconds)} for the 2 runs not "
                            "yet complete (timed by 1 short probe on this machine, "
                            f"{found.probe_seconds:.0f} s; a rough figure, often off by tens of percent); "
                            "not included: the report")
    # two cells at once (--workers 2): half the wall time, the total said beside it
    assert found.line(2).startswith(f"reproduce: estimated wall time {duration(found.seconds / 2)} (2 at "
                                    f"once; {duration(found.seconds)} one after another) for the 2 runs")
    assert found.line(8) == found.line(2)  # no more at once than there are runs
    assert estimate([]).line() == ("reproduce: every run of this grid is complete in --out; only the report "
                                   "is rebuilt")


def test_wall_times_read_as_a_person_reads_them() -> None:
    """The papers' default 003 grid, 54 cells of 20,000 rounds, runs for days on a laptop: it says days."""
    assert [duration(s) for s in (0.2, 40, 720, 3 * 3600 + 1440, 3 * 86400)] == [
        "about 1 s", "about 40 s", "about 12 minutes", "about 3.4 hours", "about 3.0 days"]
    assert evaluations(20000, 200) == 100 and evaluations(10, 3) == 4 and evaluations(5, 1) == 5
    assert Estimate(seconds=5.0, units=1, probes=1, probe_seconds=1.0).line().endswith("tens of percent)")
    assert Cost(iteration=1.0, evaluation=2.0, start=3.0).of(10, 2) == 17.0
