"""dpadmm.runs.results and the round loop that uses it: a run that fails after its folder was made is
marked failed, so its partial metrics are never taken for a result; a resumed run is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpadmm.runs.loop import timed_rounds
from dpadmm.runs.results import UNFINISHED, RunWriter, failure, read_metrics


def test_a_run_that_raises_in_round_3_is_marked_failed_with_its_reason(tmp_path: Path) -> None:
    writer = RunWriter({"rounds": 5}, engine="batched", directory=tmp_path / "run")

    def step(t: int) -> None:
        if t == 3:
            raise ValueError("agent 2's data: a value is not finite")

    with pytest.raises(ValueError, match="not finite"):
        timed_rounds(5, step, lambda t: [{"round": t}], eval_every=1, writers=[writer], runs=1,
                     progress=False)
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [1, 2]  # what it computed is kept
    assert failure(tmp_path / "run") == {"reason": "agent 2's data: a value is not finite",
                                         "error": "ValueError", "last-round": 2, "completed-rounds": 2}


def test_an_interrupt_marks_the_run_failed_and_a_finished_run_is_not(tmp_path: Path) -> None:
    def interrupted(t: int) -> None:
        raise KeyboardInterrupt

    writer = RunWriter({}, engine="batched", directory=tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        timed_rounds(2, interrupted, lambda t: [{"round": t}], eval_every=1, writers=[writer], runs=1,
                     progress=False)
    expected = {"reason": "interrupted (SIGINT or SIGTERM)", "error": "KeyboardInterrupt", "last-round": None,
                "completed-rounds": 0}
    assert failure(tmp_path / "run") == expected

    # the same folder resumed (a caller's own folder, as a checkpointed run's) and finished: no longer failed
    writer = RunWriter({}, engine="batched", directory=tmp_path / "run", resume_round=0)
    assert failure(tmp_path / "run")["reason"] == UNFINISHED  # while it runs
    timed_rounds(2, lambda t: None, lambda t: [{"round": t}], eval_every=1, writers=[writer], runs=1,
                 progress=False)
    assert failure(tmp_path / "run") is None and len(read_metrics(tmp_path / "run")) == 2


def test_a_run_whose_process_ends_without_a_word_is_marked_unfinished(tmp_path: Path) -> None:
    """`flwr stop` or a kill ends a run's process before any handler runs: its folder must not read as a
    finished run. failed.json says so from the start, with the rounds recorded so far, and goes when the run
    ends (or is replaced by the error's)."""
    writer = RunWriter({}, engine="flower", directory=tmp_path / "run")
    marked = failure(tmp_path / "run")
    assert marked == {"reason": UNFINISHED, "error": None, "last-round": None, "completed-rounds": 0}
    assert "flwr stop" in UNFINISHED and "privacy.json states the planned run" in UNFINISHED
    writer.record({"round": 1})
    writer.record({"round": 2})  # here the process is killed: nothing else runs
    assert failure(tmp_path / "run") == {"reason": UNFINISHED, "error": None, "last-round": 2,
                                         "completed-rounds": 2}
    writer.close()
    assert failure(tmp_path / "run") is None
