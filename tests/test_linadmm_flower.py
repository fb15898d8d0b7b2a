"""DP-ADMM / DP-AccADMM (002) on Flower for real: `flwr run .` with the family's keys equals the engine.

The clients hold contiguous blocks of ijcnn1's rows and return their clipped gradient sums;
the server adds the noise once and takes the iteration. The metrics of every iteration match
the batched engine's, which computes the same gradient as one sum.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpadmm.linadmm import engine, privacy
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.linadmm.problem import load
from dpadmm.models import binary
from dpadmm.privacy.device import POLICY_FILE, Device, Policy
from dpadmm.privacy.randomness import NodeSecret, Secret, run_key
from dpadmm.runs.results import read_jsonl, read_metrics
from tests.conftest import flwr_run, toml_value

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("algorithm", ["dp-admm", "dp-accadmm"])
def test_flower_run_equals_the_engine_round_by_round(algorithm: str, flwr_env: dict[str, str],
                                                     tmp_path: Path, binary_dir: Path) -> None:
    out = tmp_path / "flower"
    restart = "goldstein" if algorithm == "dp-accadmm" else "none"
    config = LinAdmmConfig(algorithm=algorithm, restart=restart, target_epsilon=0.5, rounds=4,
                           dataset="ijcnn1", data_dir=str(binary_dir / "ijcnn1"), num_agents=3, seed=5,
                           out=str(out))
    keys = {k: v for k, v in config.to_mapping().items() if k != "algorithm"}
    family_keys = " ".join(f"linadmm.{k}={toml_value(v)}" for k, v in keys.items())
    run_config = f"algorithm='{algorithm}' {family_keys}"
    output = flwr_run(flwr_env, run_config, supernodes=3)
    assert "dpadmm round 4/4: objective" in output and "Theorem 1 of 002" in output
    assert "randomness: simulation randomness" in output  # the server ran on Flower's in-memory grid
    flower = read_metrics(out)
    local = engine.run(config, write=False, progress=False).records[0]
    assert [r["round"] for r in flower] == [1, 2, 3, 4]
    # the first line says what the accuracy must beat (ijcnn1's test set is 90.5% negative), once
    note = f"(always predicting the majority class scores {local[0]['test-majority']:.4f})"
    assert f"test accuracy {flower[0]['test-accuracy']:.4f} {note}, primal" in output
    assert output.count(note) == 1
    evaluated = output.split("ServerApp-side Evaluate Metrics:")[1]  # Flower's closing summary holds them
    assert "'test-accuracy': " in evaluated and "'objective': " in evaluated
    for ours, theirs in zip(flower, local, strict=True):
        for key in ("objective", "objective-avg", "test-accuracy", "primal-residual"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-9, abs=1e-12), (key, ours["round"])
    ledger = json.loads((out / "privacy.json").read_text())
    assert ledger["calibration"] == "Theorem 1 (002)" and ledger["whole_run"]["releases"] == 4
    assert json.loads((out / "config.json").read_text())["engine"] == "flower"


def test_the_server_refuses_the_papers_dual_start_before_it_writes_anything(tmp_path: Path,
                                                                           binary_dir: Path) -> None:
    """dual-init = paper needs an un-noised full gradient that the Flower clients do not send: the
    strategy refuses it, and no run folder is left behind that looks like a run."""
    from server.server_app import linadmm_main

    out = tmp_path / "refused"
    config = LinAdmmConfig(dataset="ijcnn1", data_dir=str(binary_dir / "ijcnn1"), dual_init="paper",
                           out=str(out))
    with pytest.raises(ValueError, match="dual-init='paper' is not allowed on Flower"):
        linadmm_main(None, config)  # type: ignore[arg-type]  # refused before the grid is used
    assert not out.exists()


def test_a_server_forced_to_deployment_randomness_adds_noise_from_its_own_secret(flwr_env: dict[str, str],
                                                                                tmp_path: Path,
                                                                                binary_dir: Path) -> None:
    """$DPADMM_RANDOMNESS=deployment in the server's environment: a real `flwr run` whose server draws the
    noise from its own secret ($DPADMM_SERVER_STATE) for a run identity of its own, reports no training
    objective, and says so; its iterates are the engine's given the server's key for that identity."""
    out, state = tmp_path / "flower", tmp_path / "server-state"
    config = LinAdmmConfig(target_epsilon=0.5, rounds=3, dataset="ijcnn1", num_agents=2, seed=5, out=str(out),
                           data_dir=str(binary_dir / "ijcnn1"))
    keys = {k: v for k, v in config.to_mapping().items() if k != "algorithm"}
    run_config = "algorithm='dp-admm' " + " ".join(f"linadmm.{k}={toml_value(v)}" for k, v in keys.items())
    # the clients, forced to the deployment kind too, are devices whose operator allows central DP (at the
    # paper's delta = 1e-3)
    nodes = tmp_path / "node-state"
    nodes.mkdir()
    (nodes / POLICY_FILE).write_text(Policy(allow_central_dp=True, max_run_delta=1e-3,
                                            lifetime_delta=1e-2).to_toml())
    env = dict(flwr_env, DPADMM_RANDOMNESS="deployment", DPADMM_SERVER_STATE=str(state),
               DPADMM_NODE_STATE=str(nodes))
    output = flwr_run(env, run_config, supernodes=2)
    assert "dpadmm round 3/3: test accuracy" in output and "randomness: deployment randomness" in output
    flower = read_metrics(out)
    assert "objective" not in flower[0]  # it reads the raw training rows: a deployed server computes none
    charges = [Device(nodes, p).charges() for p in range(2)]  # each client's device charged the run once
    assert [[(c.algorithm, c.rounds, c.delta) for c in charge.values()] for charge in charges] == \
        [[("dp-admm", 3, 1e-3)]] * 2
    identity = read_jsonl(state / "agent-0.answered.jsonl")[0]["run"]
    key = Secret({0: run_key(NodeSecret(state, 0).secret(), identity, 0)})
    problem = load(config.dataset, config.data_dir, config.graph_alpha)
    n = problem.num_samples
    sigma, constants = privacy.noise_std(config, n), engine.settings(config, problem.a)
    replay = engine.initial_state(config, problem.a, 1)
    for t in range(1, config.rounds + 1):
        point = engine.query_point(replay, constants.accelerated)
        total = binary.clipped_gradient_sum(problem.features, problem.labels, point, config.grad_bound,
                                            problem.row_norms)
        replay, y = engine.iterate(problem.a, replay, engine.release(total, n, [config.seed], t, sigma, key),
                                   constants)
        expected = engine.evaluate(problem, replay, y, t, config.l1, train=False)[0]
        for name in ("test-accuracy", "primal-residual"):
            assert flower[t - 1][name] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), (name, t)
    keyed = engine.run(config, write=False, progress=False).records[0]
    assert all(f["primal-residual"] != k["primal-residual"] for f, k in zip(flower, keyed, strict=True))
