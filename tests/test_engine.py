"""The batched engine: the reference facts of DESIGN.md, determinism, and its output files."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm import engine
from dpadmm.config import RunConfig
from dpadmm.results import read_metrics

# Authors' reference code, MNIST, P = 10 contiguous blocks, pixels / 255, non-private, t = 41.
REFERENCE = {"objp": (0.2296, 6.652e-3), "outp": (0.3123, 0.1163)}


@pytest.mark.parametrize("algorithm", ["objp", "outp"])
def test_reference_facts_on_mnist(algorithm: str, mnist_dir: Path) -> None:
    config = RunConfig(algorithm=algorithm, epsilon=math.inf, rounds=41, eval_every=41, num_agents=10,
                       dataset="mnist", data_dir=str(mnist_dir), dtype="float64")
    (record,) = engine.run(config, write=False, progress=False).records
    error, violation = REFERENCE[algorithm]
    assert record["round"] == 41
    assert round(record["test-error"], 4) == error
    assert f"{record['consensus-violation']:.4g}" == f"{violation:.4g}"


def test_runs_are_functions_of_config_and_seed() -> None:
    base = RunConfig(algorithm="objpm", epsilon=0.5, local_steps=2, rounds=3, num_agents=5)
    first = engine.run(base, write=False, progress=False)
    again = engine.run(base, write=False, progress=False)
    other = engine.run(dataclasses.replace(base, seed=1), write=False, progress=False)
    assert torch.equal(first.state.w, again.state.w)
    assert not torch.equal(first.state.w, other.state.w)
    assert [r["test-error"] for r in first.records] == [r["test-error"] for r in again.records]


def test_writes_config_and_metrics(tmp_path: Path) -> None:
    config = RunConfig(algorithm="objt", epsilon=1.0, rounds=4, eval_every=2, out=str(tmp_path / "run"),
                       save_weights=True)
    result = engine.run(config, progress=False)
    assert result.directory == tmp_path / "run"
    records = read_metrics(result.directory)
    assert [r["round"] for r in records] == [2, 4]
    for r in records:
        expected = {"round", "test-error", "train-loss", "consensus-violation", "noise-magnitude", "rho"}
        assert expected <= r.keys()
        assert r["noise-magnitude"] > 0 and 0 <= r["test-error"] <= 1
    header = json.loads((result.directory / "config.json").read_text())
    assert header["algorithm"] == "objt" and header["engine"] == "batched"
    weights = np.load(result.directory / "weights.npz")
    assert sorted(weights.files) == ["round-2", "round-4"]
    np.testing.assert_array_equal(weights["round-4"], result.state.w.numpy())
    # a second run with the same out never overwrites the first
    second = engine.run(config, progress=False)
    assert second.directory == tmp_path / "run_1"
    assert len(read_metrics(tmp_path / "run")) == 2


def test_private_runs_differ_from_non_private_and_learn() -> None:
    private = engine.run(RunConfig(algorithm="objpm", epsilon=5.0, rounds=20, local_steps=3),
                         write=False, progress=False).records
    assert private[-1]["test-error"] < 0.5  # it learns on the embedded data
    assert all(r["noise-magnitude"] > 0 for r in private)


def test_budget_first_runs_calibrate_before_training_and_write_the_ledger(tmp_path: Path) -> None:
    config = RunConfig(algorithm="objpm", local_steps=2, rounds=5, target_epsilon=3.0,
                       out=str(tmp_path / "r"))
    result = engine.run(config, progress=False)
    assert result.config.epsilon != config.epsilon and result.ledger is not None
    assert 2.9 < result.ledger.whole_run.epsilon_pld <= 3.0
    written = json.loads((result.directory / "privacy.json").read_text())
    assert written["whole_run"]["epsilon_pld"] == result.ledger.whole_run.epsilon_pld
    assert json.loads((result.directory / "config.json").read_text())["epsilon"] == result.config.epsilon
