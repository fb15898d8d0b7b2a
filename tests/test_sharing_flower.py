"""ADMM sharing (001) on Flower for real: `flwr run .` with one SuperNode per party equals the engine.

The server holds the labels, z and y; each party holds its column block of a9a, keeps its last
message in its context state, and adds its own noise. The metrics of every round (test log loss and
error of the summed test scores, the primal residual) match the batched engine's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpadmm.runs.results import failure, read_metrics
from dpadmm.sharing import engine, privacy
from dpadmm.sharing.config import SharingConfig
from tests.conftest import flower_app, flwr_run, last_run_status, run_config_of
from tests.faulty_sharing_clientapp import EVERY_PARTY_SPOILS, FAULTS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("noise", ["message", "paper"])
def test_flower_run_equals_the_engine_round_by_round(noise: str, flwr_env: dict[str, str], tmp_path: Path,
                                                     binary_dir: Path) -> None:
    out = tmp_path / "flower"
    config = SharingConfig(epsilon=1.0, noise=noise, rounds=4, data_dir=str(binary_dir / "a9a"), x_bound=0.5,
                           seed=4, eval_every=2, out=str(out))
    output = flwr_run(flwr_env, run_config_of(config), supernodes=2)
    assert "dpadmm round 4/4: test log loss" in output and "Theorem 3 of 001" in output
    assert "randomness: simulation randomness" in output  # the simulated parties said so themselves
    flower = read_metrics(out)
    local = engine.run(config, write=False, progress=False).records[0]
    assert [r["round"] for r in flower] == [2, 4]
    note = f"always predicting the majority class errs on {1 - local[0]['test-majority']:.4f}"
    assert f"dpadmm round 2/4: test log loss {flower[0]['test-log-loss']:.6g}, test error " \
           f"{flower[0]['test-error']:.4f} ({note}" in output and output.count(note) == 1
    evaluated = output.split("ServerApp-side Evaluate Metrics:")[1]  # Flower's closing summary holds them
    assert "'test-error': " in evaluated and "'test-majority': " in evaluated
    assert flower[0]["elapsed"] > flower[0]["seconds"]  # the clock counts round 1, which was not evaluated
    for ours, theirs in zip(flower, local, strict=True):
        for key in ("test-log-loss", "test-error", "test-majority", "test-undecided", "primal-residual"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-12), (key, ours["round"])
    ledger = json.loads((out / "privacy.json").read_text())
    assert ledger["calibration"] == "Theorem 3 (001)" and ledger["whole_run"]["releases"] == 4


def test_faulty_parties_are_rejected_and_the_round_uses_their_last_message(flwr_env: dict[str, str],
                                                                           tmp_path: Path,
                                                                           binary_dir: Path) -> None:
    """Party 1 sends a non-finite message in round 2 and a too long one in round 4; party 0 fails in round 3.
    Each is rejected with its reason; the server uses the party's last accepted message and sends it back
    to the party, and every round equals the engine's functions run with the same substitutions. In round 6
    party 1 refuses its data, a fault that would repeat: the run ends as failed, its folder marked so, and
    privacy.json states what the rounds sent spent."""
    out = tmp_path / "run"
    config = SharingConfig(epsilon=1.0, rounds=7, data_dir=str(binary_dir / "a9a"), x_bound=0.5, seed=2,
                           out=str(out))
    output = flwr_run(flwr_env, run_config_of(config), supernodes=2,
                      app=flower_app(tmp_path, "faulty_sharing_clientapp"))
    assert "round 2: party 1 rejected: party 1 sent a vector of shape (32561,) (expected (32561,), finite)" \
        in output
    assert "round 3: party 0 rejected: node" in output and "injected failure of party 0" in output
    assert "round 4: party 1 rejected: party 1 sent a vector of shape (32562,)" in output
    reason = "refused: injected refusal of party 1's data in round 6"
    lines = [line for line in output.splitlines() if "dpadmm: the run cannot go on: node" in line]
    assert len(lines) == 1 and lines[0].endswith(reason), output[-3000:]
    status, details = last_run_status(flwr_env)
    assert status == "finished:failed" and details.endswith(reason)
    assert failure(out)["reason"].endswith(reason) and failure(out)["last-round"] == 5
    # privacy.json states the 6 rounds sent (party 0 released in round 6), not the 7 planned
    stated = json.loads((out / "privacy.json").read_text())
    assert stated["stopped-after-round"] == 6 and stated["whole_run"]["releases"] == 6
    flower = read_metrics(out)
    assert [r["round"] for r in flower] == [1, 2, 3, 4, 5]

    problem = engine.load(config)
    n = problem.num_samples
    std, rho = privacy.noise_std(config, n), config.penalty(n)
    held = problem.labels.new_zeros((1, 2, n))
    x_kept = problem.labels.new_zeros((1, 2, problem.parties.blocks.shape[2]))
    z, y = held[:, 0].clone(), held[:, 0].clone()
    for record in flower:
        t = record["round"]
        pulled = held.sum(dim=1) - z
        x, messages = engine.party_step(problem.parties, pulled, held, y, config, rho, [config.seed], t, std)
        for party in range(2):
            fault = FAULTS.get((party, t))
            if fault is not None:
                messages[:, party] = held[:, party]
            if fault != "raise":  # a party that failed keeps its x; the others computed theirs
                x_kept[:, party] = x[:, party]
        held = messages
        z, y = engine.server_step(held, y, problem.labels, rho)
        state = engine.State(x=x_kept, messages=held, z=z, y=y)
        expected = engine.evaluate(problem, state, t, config.l2)[0]
        for key in ("test-log-loss", "test-error", "primal-residual"):
            assert record[key] == pytest.approx(expected[key], rel=1e-9, abs=1e-12), (key, t)


def test_widths_that_miss_columns_are_refused_before_anything_runs(flwr_env: dict[str, str], tmp_path: Path,
                                                                   binary_dir: Path) -> None:
    """parties='60,57' covers 117 of a9a's 123 columns: the server, which holds the data set in a simulation,
    refuses it before the first round, on one line, and leaves no run folder."""
    config = SharingConfig(parties="60,57", rounds=2, data_dir=str(binary_dir / "a9a"),
                           out=str(tmp_path / "r"))
    output = flwr_run(flwr_env, run_config_of(config), supernodes=2)
    message = ("sharing.parties='60,57' cover 117 columns but the data set has 123; give widths that sum "
               "to 123")
    assert f"dpadmm: the run config is not allowed: {message}" in output
    assert "[ROUND 1" not in output and not (tmp_path / "r").exists()
    status, details = last_run_status(flwr_env)
    assert status == "finished:failed" and details.endswith(message)


def test_a_federation_larger_than_the_parties_ends_the_run(flwr_env: dict[str, str], tmp_path: Path,
                                                          binary_dir: Path) -> None:
    """3 SuperNodes for 2 parties: asked which party they hold before round 1, the nodes refuse the
    federation. The server ends the run with their reason before any party computes and writes no folder."""
    out = tmp_path / "r"
    config = SharingConfig(rounds=2, data_dir=str(binary_dir / "a9a"), out=str(out))
    output = flwr_run(flwr_env, run_config_of(config), supernodes=3)
    reason = ("the federation has 3 SuperNodes but parties='66,57' needs 2, one per party: flwr run . "
              "--federation-config 'num-supernodes=2' (and 2 more nodes)")
    lines = [line for line in output.splitlines() if "dpadmm: the run cannot go on" in line]
    assert len(lines) == 1 and lines[0].endswith(reason) and "refused: " in lines[0], output[-3000:]
    assert "[ROUND 1" not in output and not out.exists()
    status, details = last_run_status(flwr_env)
    assert status == "finished:failed" and details.endswith(reason)


def test_a_run_whose_every_message_is_rejected_stops_failed(flwr_env: dict[str, str], tmp_path: Path,
                                                            binary_dir: Path) -> None:
    """Every party sends a non-finite message in round 1 (as rho=inf once made every party's): the run used to
    "complete" with no evaluated round; it stops, failed, saying why."""
    out = tmp_path / "run"
    config = SharingConfig(epsilon=1.0, rounds=3, data_dir=str(binary_dir / "a9a"), seed=EVERY_PARTY_SPOILS,
                           out=str(out))
    output = flwr_run(flwr_env, run_config_of(config), supernodes=2,
                      app=flower_app(tmp_path, "faulty_sharing_clientapp"))
    assert "round 1: every reply was rejected (2: party 0: party 0 sent a vector" in output
    status, details = last_run_status(flwr_env)
    assert status == "finished:failed" and "every reply was rejected" in details
    assert "every reply was rejected" in failure(out)["reason"]
