"""The DPIADMM strategy (strategies/dpiadmm.py): checkpoints, and faults in a real Flower simulation.

The fault test runs a real ``flwr run`` of a Flower app whose ServerApp is ours and whose
ClientApp (tests/faulty_clientapp.py) is the real agent with some replies spoiled. The
server must reject each spoiled reply with its reason, keep those agents' state, and end
with exactly the w of the engine run on the same participation.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.iadmm import engine, privacy, schedules
from dpadmm.iadmm.config import papers
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.runs.results import failure, read_jsonl, read_metrics
from strategies import DPIADMM
from tests.conftest import flower_app, flwr_run, last_run_status, run_config_of
from tests.faulty_clientapp import EVERY_AGENT_RAISES, FAULTS


def test_checkpoint_round_trip_and_refusal(tmp_path: Path) -> None:
    config = papers(num_agents=3, rounds=5, epsilon=0.5, seed=4)
    path = tmp_path / "checkpoint.pt"
    model = {"weight": torch.zeros(6, 2), "bias": torch.zeros(2)}
    strategy = DPIADMM(config, model, checkpoint_path=path)
    assert strategy.round == 0 and not path.exists()
    generator = torch.Generator().manual_seed(0)
    for name in ("w", "z", "z_chain", "lam"):
        setattr(strategy, name, {k: torch.randn(v.shape, generator=generator, dtype=torch.float64)
                                 for k, v in getattr(strategy, name).items()})
    strategy.round, strategy.taken, strategy.roster.nodes = 2, [2, 1, 2], {11: 0, 12: 1, 13: 2}
    strategy.save()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # written to a temporary file, renamed

    # Waiting times may change on a restart; nothing else may.
    resumed = DPIADMM(dataclasses.replace(config, node_timeout=5.0, round_timeout=30.0), model,
                      checkpoint_path=path)
    assert resumed.round == 2 and resumed.taken == [2, 1, 2] and resumed.roster.nodes == strategy.roster.nodes
    assert resumed.run_identity == resumed.roster.identity == strategy.run_identity  # its query names it
    for name in ("w", "z", "z_chain", "lam"):
        for key, value in getattr(strategy, name).items():
            assert torch.equal(getattr(resumed, name)[key], value)
    with pytest.raises(ValueError, match=r"belongs to another run \(config: epsilon=0.5 there, 1.0 here"):
        DPIADMM(dataclasses.replace(config, epsilon=1.0), model, checkpoint_path=path)
    with pytest.raises(ValueError, match="shapes"):
        DPIADMM(config, {"weight": torch.zeros(6, 3), "bias": torch.zeros(3)}, checkpoint_path=path)


@pytest.mark.slow
def test_faulty_replies_are_rejected_and_the_rest_equals_the_engine(flwr_env: dict[str, str],
                                                                    tmp_path: Path) -> None:
    config = papers(algorithm="objpm", local_steps=2, epsilon=0.5, num_agents=5, rounds=6, seed=0,
                       fraction_train=0.8, out=str(tmp_path / "run"), save_weights=True)
    output = flwr_run(flwr_env, run_config_of(config), supernodes=5,
                      app=flower_app(tmp_path, "faulty_clientapp"))
    assert "dpadmm round 5/6: test error" in output
    # Round 6: agent 4 refuses its data, which ends the run; the folder is marked failed and privacy.json
    # states what the agents spent (agent 2 was asked in all 6 rounds), not the planned run.
    reason = "injected refusal of agent 4's data in round 6"
    failed = failure(tmp_path / "run")
    assert failed is not None and failed["reason"].endswith(reason) and failed["last-round"] == 5
    stated = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert stated["stopped-after-round"] == 6 and stated["whole_run"]["releases"] == 6 * 2
    assert stated["whole_run"]["epsilon_pld"] == pytest.approx(privacy.spent(config, 6), rel=1e-9)

    rounds = read_jsonl(tmp_path / "run" / "rounds.jsonl")
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5]
    reasons = {"raise": "the ClientApp failed", "non-finite": "z has non-finite entries",
               "shape": "z has shape (783, 10), expected (784, 10)",
               "dtype": "z has dtype float32, expected float64",
               "other-id": "claims partition 4, but its node holds partition 3",
               "late": "computed for round 3, not this round 4", "malformed": "malformed",
               "mechanism": "its node ran 'laplace, noise multiplier 1.0, sampling 1.0, 2 per round', not "
                            "this run's 'laplace, noise multiplier 2.0, sampling 1.0, 2 per round': the "
                            "run's privacy statement would not cover it"}
    for report in rounds:
        t = report["round"]
        assert report["sampled"] == schedules.participants(config, t)
        faulty = {p: fault for (p, r), fault in FAULTS.items() if r == t}
        assert {r["partition"] for r in report["rejected"]} == set(faulty)
        for rejected in report["rejected"]:
            assert reasons[faulty[rejected["partition"]]] in rejected["reason"]
        assert report["replied"] == sorted(set(report["sampled"]) - set(faulty))
        assert report["no_reply"] == []
    spent = [r["privacy_spent"] for r in rounds]
    assert spent == sorted(spent) and spent[0] > 0  # each agent's rounds are counted when it is asked

    # The engine, told which agents counted in each round, reproduces the model after every round.
    dataset = load_for(config)
    data = agent_data(dataset, config, range(config.num_agents))
    zeros = torch.zeros((1, config.num_agents, *data.shape), dtype=torch.float64)
    state = engine.EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(),
                               lam=zeros.clone())
    flower_w = np.load(tmp_path / "run" / "weights.npz")
    for report in rounds:
        active = torch.zeros((1, config.num_agents), dtype=torch.bool)
        active[0, report["replied"]] = True
        engine.step(config, data, state, report["round"], active=active)
        after = state.model(config, report["round"])[0]  # the model after the round, as the server saved
        np.testing.assert_allclose(flower_w[f"round-{report['round']}"], after.numpy(), rtol=1e-5, atol=1e-12)
    metrics = read_metrics(tmp_path / "run")
    assert [m["rejected"] for m in metrics] == [len(r["rejected"]) for r in rounds]


@pytest.mark.slow
def test_a_run_whose_every_reply_is_rejected_stops_failed(flwr_env: dict[str, str], tmp_path: Path) -> None:
    """Every agent's ClientApp raises (a fault all repeat, as a configuration no agent can run): the run used
    to "complete" with the untrained model and privacy spent; it stops after round 1, failed, saying why."""
    config = papers(algorithm="objp", epsilon=0.5, num_agents=3, rounds=4, seed=EVERY_AGENT_RAISES,
                    out=str(tmp_path / "run"))
    app = flower_app(tmp_path, "faulty_clientapp")
    output = flwr_run(flwr_env, run_config_of(config), supernodes=3, app=app)
    assert "round 1: every reply was rejected (3: partition " in output and "[ROUND 2" not in output
    status, details = last_run_status(flwr_env)
    assert status == "finished:failed" and "every reply was rejected" in details
    failed = failure(tmp_path / "run")
    assert failed is not None and "every reply was rejected" in failed["reason"]
