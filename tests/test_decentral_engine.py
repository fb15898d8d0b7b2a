"""dpadmm.decentral.engine and .problem: 004's algorithms on real UCI Adult, batched over seeds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from dpadmm.data import Dataset
from dpadmm.data.adult import load_adult
from dpadmm.decentral import engine, privacy, problem, updates
from dpadmm.decentral.config import DecentralConfig
from dpadmm.privacy import secure
from dpadmm.privacy.randomness import Secret

CLOCKS = ("seconds", "elapsed")


@pytest.fixture(scope="module")
def adult(binary_dir: Path) -> Dataset:
    return load_adult(binary_dir / "adult")


def _config(**changes: object) -> DecentralConfig:
    return dataclasses.replace(DecentralConfig(), **changes)


def test_each_run_draws_its_samples_and_graph_and_its_optimum_is_exact(adult: Dataset) -> None:
    built = problem.build(_config(), adult, [0, 1])
    agents = built.agents
    assert tuple(agents.features.shape) == (2, 10, 100, 14) and tuple(agents.adjacency.shape) == (2, 10, 10)
    norms = torch.linalg.vector_norm(agents.features, dim=-1)
    assert float((norms - 1).abs().max()) < 1e-12  # rows of unit norm (Adult has no all-zero row)
    assert set(agents.labels.unique().tolist()) == {-1.0, 1.0}
    assert not torch.equal(agents.adjacency[0], agents.adjacency[1])  # a new graph per run
    assert not torch.equal(agents.features[0], agents.features[1])  # and new samples
    assert int(agents.adjacency.sum(dim=(1, 2))[0]) == 2 * 20
    at = built.optimum.unsqueeze(1).expand(-1, 10, -1)
    total = updates.gradient(agents.features, agents.labels, at).sum(dim=1)  # sum_i grad f_i(x*) = 0
    assert float(total.abs().max()) < 1e-12


@pytest.mark.parametrize("x_step", ["linearised", "exact"])
def test_without_noise_algorithm_1_reaches_the_optimum_and_batches_equal_single_runs(x_step: str,
                                                                                    adult: Dataset) -> None:
    config = _config(noise="none", eval_every=50, x_step=x_step)
    both = engine.run(config, seeds=[0, 3], dataset=adult, write=False, progress=False)
    assert [r["round"] for r in both.records[0]] == [50, 100]
    assert all(r[-1]["log-error-max"] < -9 for r in both.records)  # linear convergence to x*
    assert "epsilon" not in both.records[0][-1]
    alone = engine.run(config, seeds=[3], dataset=adult, write=False, progress=False)
    for batched, single in zip(both.records[1], alone.records[0], strict=True):
        assert {k: v for k, v in batched.items() if k not in CLOCKS} == \
            pytest.approx({k: v for k, v in single.items() if k not in CLOCKS}, rel=1e-9)


def test_a_private_run_states_its_a_priori_loss_and_the_noise_costs_accuracy(adult: Dataset) -> None:
    paper = _config(eval_every=100, sensitivity=0.01)
    private = engine.run(paper, seeds=[0], dataset=adult, write=False, progress=False)
    last = private.records[0][-1]
    assert last["epsilon"] == pytest.approx(4.4587, abs=1e-4)  # d alpha B sum_{k=1}^{100} 1.02^k
    assert "NOT COVERED: B_inf = 0.01 is below 2/b_i = 0.02" in private.ledger.summary()
    assert privacy.statement(_config(), 14).epsilon == pytest.approx(2 * 4.4587, abs=2e-4)
    # the random aggregator's ex-post loss is below the a-priori one (the paper: about 30% below), the
    # fixed weights' equals it
    assert 0.5 * last["epsilon"] < last["epsilon-ex-post"] < 0.9 * last["epsilon"]
    fixed = engine.run(dataclasses.replace(paper, weights="fixed"), seeds=[0], dataset=adult, write=False,
                       progress=False).records[0][-1]
    assert fixed["epsilon-ex-post"] == pytest.approx(fixed["epsilon"], rel=1e-12)
    assert -4 < last["log-error"] < -1


@pytest.mark.parametrize(("algorithm", "changes"), [
    ("ldp-dgd", {"graph": "complete", "step_decay": 0.95}), ("ldp-dgd-star", {"edges": 40}),
    ("dgd", {"edges": 40, "step_decay": 0.9}),
])
def test_the_gradient_methods_approach_the_optimum_without_noise(algorithm: str, changes: dict,
                                                                 adult: Dataset) -> None:
    config = _config(algorithm=algorithm, noise="none", eval_every=100, **changes)
    built = problem.build(config, adult, [0])
    start = engine.evaluate(config, built, engine.initial_state(built.agents, [0]), 0)[0]["log-error"]
    result = engine.run(config, dataset=adult, write=False, progress=False)
    assert result.records[0][-1]["log-error"] < start - 3


def test_a_run_writes_its_metrics(tmp_path: Path, adult: Dataset) -> None:
    result = engine.run(_config(rounds=3), dataset=adult, directories=[tmp_path / "run"], progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    average = result.state.x.mean(dim=1)  # the agents' average, what a SecAgg+ server holds
    expected = torch.log(torch.linalg.vector_norm(average - result.problem.optimum, dim=-1) / 14)
    assert lines[-1]["log-error-average"] == pytest.approx(float(expected[0]), rel=1e-12)
    assert [r["round"] for r in lines] == [1, 2, 3]
    assert set(lines[0]) == {"round", "log-error", "log-error-max", "log-error-average", "consensus",
                             "epsilon", "epsilon-ex-post", "epsilon-ex-post-max", *CLOCKS}
    statement = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert statement["covered"] and statement["releases"] == 3


def test_an_interrupted_run_states_what_its_completed_iterations_spent(
        tmp_path: Path, adult: Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or SIGTERM, which the CLI turns into it) during iteration 4 of 10: failed.json says 3 were
    completed and privacy.json states their loss, the epsilon the metrics of iteration 3 report plus the
    grid's 3 costs, with the run's randomness; the planned run's statement is gone."""
    config = _config(algorithm="ldp-admm", target_epsilon=2.0, rounds=10)
    real = engine.ex_post_step

    def stop_at_4(config: DecentralConfig, x: torch.Tensor, released: updates.Released, k: int
                  ) -> torch.Tensor:
        if k == 4:
            raise KeyboardInterrupt
        return real(config, x, released, k)

    monkeypatch.setattr(engine, "ex_post_step", stop_at_4)
    with pytest.raises(KeyboardInterrupt):
        engine.run(config, dataset=adult, directories=[tmp_path / "run"], progress=False)
    run = tmp_path / "run"
    assert json.loads((run / "failed.json").read_text())["completed-rounds"] == 3
    third = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    stated = json.loads((run / "privacy.json").read_text())
    assert third["round"] == 3 and stated["stopped-after-round"] == 3 and stated["releases"] == 3
    assert stated["epsilon"] == pytest.approx(third["epsilon"] + 3 * secure.laplace_epsilon_cost(), rel=1e-12)
    assert stated["epsilon"] == pytest.approx(2.0 * 3 / 10, rel=1e-12)  # every release costs eps / K
    assert "simulation randomness" in stated["randomness"]


@pytest.mark.parametrize(("algorithm", "changes"), [
    ("ldp-admm", {}), ("ldp-dgd", {"graph": "complete", "edges": 20}), ("ldp-dgd-star", {}), ("dgd", {}),
])
def test_an_agent_computes_its_row_from_its_view_alone(algorithm: str, changes: dict, adult: Dataset) -> None:
    """What a Flower agent does (clients/decentral.py): from its own samples, the public graph and the
    iterates its neighbours exchanged, the dual of k - 1 and then x^k; equal to the engine's row."""
    config = _config(algorithm=algorithm, agents=6, rounds=4, seed=5, **({"edges": 8} | changes))
    full = problem.build(config, adult, [config.seed])
    state = engine.initial_state(full.agents, [config.seed])
    views = [problem.agent_view(config, adult, i) for i in range(6)]
    duals = [torch.zeros_like(state.x) for _ in range(6)]
    for k in range(1, 5):
        rows = []
        for i, view in enumerate(views):
            seen = [i, *torch.nonzero(view.adjacency[0, i]).flatten().tolist()]
            x = torch.zeros_like(state.x)
            x[0, seen] = state.x[0, seen]
            if k > 1:
                duals[i] = engine.dual(config, view, duals[i], x)
            released, _ = engine.release(config, view, engine.State(x=x, dual=duals[i]), [config.seed], k)
            rows.append(released[0, i])
        state, _ = engine.iterate(config, full.agents, state, [config.seed], k)
        torch.testing.assert_close(torch.stack(rows), state.x[0], rtol=0, atol=1e-12)


def test_secret_sharing_gives_the_plain_run_up_to_the_fixed_point_resolution(adult: Dataset) -> None:
    """Algorithm 3: the agents learn only the sum of all iterates; Algorithm 1 on the complete graph needs no
    more, so the run is the plain one up to 2^-20 per value (N of them in a sum)."""
    plain = _config(graph="complete", rounds=30, eval_every=10)
    shared = dataclasses.replace(plain, exchange="secret")
    ours = engine.run(shared, seeds=[0, 1], dataset=adult, write=False, progress=False)
    theirs = engine.run(plain, seeds=[0, 1], dataset=adult, write=False, progress=False)
    torch.testing.assert_close(ours.state.x, theirs.state.x, rtol=0, atol=1e-4)
    assert not torch.equal(ours.state.x, theirs.state.x)  # the fixed-point sums are not the exact ones
    for a, b in zip(ours.records[0], theirs.records[0], strict=True):
        assert a["log-error"] == pytest.approx(b["log-error"], abs=1e-4)
    with pytest.raises(ValueError, match="exchange='secret' \\(Algorithm 3\\) needs algorithm='ldp-admm' and "
                                         "graph='complete'"):
        _config(exchange="secret")


@pytest.mark.parametrize(("algorithm", "changes"), [("ldp-admm", {}), ("dgd", {"step_decay": 0.9})])
def test_a_target_epsilon_is_met_exactly(algorithm: str, changes: dict, adult: Dataset) -> None:
    """Theorems 3.3 and 3.4's calibrations: the a-priori loss of the run is the target, and the noise
    follows (a constant rate for Algorithm 1; beta_k proportional to 1/eta_k for the gradient methods)."""
    config = _config(algorithm=algorithm, target_epsilon=2.0, rounds=20, eval_every=20, **changes)
    result = engine.run(config, seeds=[0], dataset=adult, write=False, progress=False)
    last = result.records[0][-1]
    assert result.ledger is not None and result.ledger.epsilon == pytest.approx(2.0, rel=1e-12)  # with grid
    assert last["epsilon"] == pytest.approx(2.0 - 20 * secure.laplace_epsilon_cost(), rel=1e-12)
    alphas, betas = privacy.schedule(config, 14)
    products = [a * b for a, b in zip(alphas, betas, strict=True)]
    assert max(products) == pytest.approx(min(products), rel=1e-12)  # every release costs eps / K
    assert "calibrated to eps = 2" in privacy.statement(config, 14).summary()


# ----------------------------------------------------------------------------- deployment randomness


def _keys(agents: int) -> Secret:
    return Secret({i: secure.new_key() for i in range(agents)})


def test_deployment_randomness_draws_the_weights_and_noise_from_the_agents_keys(adult: Dataset) -> None:
    """engine.iterate with every agent's key: not the keyed run; the same keys give the same iteration, other
    keys (another run identity) another; an agent's row is the same whether the Secret holds every key or only
    its own (as its node's does), and the rows whose keys it lacks are placeholders without noise."""
    config = _config(agents=5, edges=6, rounds=2, seed=2)
    built = problem.build(config, adult, [config.seed])
    start = engine.start(config, built.agents, [config.seed])
    keyed, _ = engine.iterate(config, built.agents, start, [config.seed], 1)
    keys = _keys(5)
    secret, _ = engine.iterate(config, built.agents, start, [config.seed], 1, keys)
    again, _ = engine.iterate(config, built.agents, start, [config.seed], 1, Secret(dict(keys.keys)))
    other, _ = engine.iterate(config, built.agents, start, [config.seed], 1, _keys(5))
    assert not torch.equal(keyed.x, secret.x) and torch.equal(secret.x, again.x)
    assert not (secret.x == other.x).any()  # every coordinate of every agent: new weights and noise
    mine = Secret({3: keys.keys[3]})
    alone, _ = engine.release(config, built.agents, start, [config.seed], 1, mine)
    assert torch.equal(alone[0, 3], secret.x[0, 3])
    weights = engine.aggregator_weights(config, [config.seed], 1, start.x, mine)
    others = [0, 1, 2, 4]
    assert bool((weights[0, others] == engine.PLACEHOLDER_WEIGHT).all()) and not (weights[0, 3] == 0.5).any()
    noiseless = engine.update(config, built.agents, start, weights, 1).x
    assert torch.equal(alone[0, others], noiseless[0, others])  # placeholders: no noise, never sent
    with pytest.raises(ValueError, match=r"seeds=\[2, 3\] is not allowed with deployment randomness"):
        engine.aggregator_weights(config, [2, 3], 1, start.x.expand(2, -1, -1), keys)


def test_a_deployed_release_depends_on_the_update_only_through_the_grid() -> None:
    """The exchanged iterate is the grid Laplace mechanism's release: an update moved within its grid cell
    gives the same message under the same draws, one moved by a few cells another; the message is on the
    grid of 2**-32 of the scale 1/beta_k over d."""
    config = _config(agents=3, edges=2, rounds=4, noise_growth=1.5)
    d, k = 14, 3
    keys = _keys(3)
    generator = torch.Generator().manual_seed(0)
    value = torch.randn((1, 3, d), dtype=torch.float64, generator=generator)
    scale = 1 / privacy.schedule(config, d)[1][k - 1]
    grid = secure.grid("laplace", scale, d)
    cell = torch.round(value / grid) * grid
    within = cell + (value - cell) / 2  # another value in the same cell (|offset| <= grid / 4)
    assert not torch.equal(within, value)
    sent = engine.exchanged(config, value, [config.seed], k, value, keys)
    assert torch.equal(engine.exchanged(config, within, [config.seed], k, value, keys), sent)
    assert torch.equal(torch.round(sent / grid), sent / grid)
    moved = engine.exchanged(config, value + 3 * grid, [config.seed], k, value, keys)
    assert torch.equal(moved, sent + 3 * grid)  # same draws: the rounding moved by three cells
    keyed = engine.exchanged(config, value, [config.seed], k, value)
    assert not torch.equal(engine.exchanged(config, within, [config.seed], k, value), keyed)  # its low bits


def test_the_statement_counts_the_grid_and_the_engine_states_its_randomness(adult: Dataset) -> None:
    config = _config(rounds=100, sensitivity=0.01)
    stated = privacy.statement(config, 14)
    alphas, betas = privacy.schedule(config, 14)
    paper = privacy.worst_case(14, alphas, betas, config.bound)
    assert stated.grid == 100 * secure.laplace_epsilon_cost() and stated.epsilon == paper + stated.grid
    assert 0 < stated.grid < 1e-7 and "per release for the noise's grid" in stated.summary()
    assert "describes the mechanism a deployment runs" in stated.summary()  # no run yet
    result = engine.run(_config(rounds=2, eval_every=2), dataset=adult, write=False, progress=False)
    assert result.ledger is not None and "simulation randomness" in result.ledger.summary()
