"""The comparison's baselines: their accounting, DP-SGD through Opacus, and Flower's DP-FedAvg app.

The accounting is checked against values computed independently (the exact Gaussian mechanism of
Balle & Wang, Opacus's own accountants, Flower's own accountant); DP-SGD against the formula it
implements; the Flower app through Flower's own classes, in-process and through a real `flwr run`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from scipy import optimize, stats

from dpadmm.data import Dataset
from dpadmm.iadmm.config import papers
from dpadmm.iadmm.federation import load_for
from dpadmm.models.modules import LogisticRegression
from tests.conftest import ROOT, flwr_run, toml_value

APP = ROOT / "benchmarks" / "dpfedavg_app"
DELTA = 1e-5
sys.path.insert(0, str(APP))  # the baselines are the benchmark app's own module
from dpfedavg_bench import baselines  # noqa: E402
from dpfedavg_bench.baselines import DpFedAvgConfig, DpSgdConfig  # noqa: E402

# ----- accounting -----

def _exact_gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """epsilon of one Gaussian mechanism of sensitivity 1, std sigma, at delta: the exact tradeoff of
    Balle & Wang (2018, Thm. 8), delta(eps) = Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s)."""
    s = noise_multiplier

    def excess(eps: float) -> float:
        return stats.norm.cdf(0.5 / s - eps * s) - math.exp(eps) * stats.norm.cdf(-0.5 / s - eps * s) - delta

    return float(optimize.brentq(excess, 1e-9, 100.0))


@pytest.mark.parametrize("noise_multiplier", [0.8, 2.0, 5.0])
def test_dpfedavg_epsilon_is_the_exact_gaussian_one(noise_multiplier: float) -> None:
    """T releases of a Gaussian of multiplier z are one Gaussian of multiplier z / sqrt(T): the PLD
    accountant must give the exact value of that mechanism (it is pessimistic by its discretisation)."""
    rounds = 9
    exact = _exact_gaussian_epsilon(noise_multiplier / math.sqrt(rounds), DELTA)
    assert exact <= baselines.dpfedavg_epsilon(noise_multiplier, rounds, DELTA) <= exact * 1.002 + 1e-3


def test_dpfedavg_rdp_epsilon_equals_flowers_accountant() -> None:
    from flwr.serverapp import (
        GaussianPrivacyEvent,
        NeighboringRelation,
        PrivacyConfig,
        RdpAccountant,
        SamplingMethod,
    )

    accountant = RdpAccountant(PrivacyConfig(
        target_delta=DELTA, population_size=10, neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION))
    event = GaussianPrivacyEvent(noise_multiplier=3.0, sample_size=10, population_size=10)
    accountant.compose(event, count=7)
    flower = accountant.get_privacy_spent().epsilon
    assert baselines.dpfedavg_epsilon(3.0, 7, DELTA, accountant="rdp") == pytest.approx(flower, rel=1e-9)
    # PLD is tighter than RDP: the comparison quotes it for every method.
    assert baselines.dpfedavg_epsilon(3.0, 7, DELTA) < flower


def test_dpsgd_epsilon_agrees_with_opacus_accountants() -> None:
    """Poisson-sampled Gaussian steps: our RDP against Opacus's RDP accountant, our PLD against its
    PRV accountant."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    sigma, q, steps = 1.1, 0.05, 200
    for opacus_accountant, ours in ((RDPAccountant(), "rdp"), (PRVAccountant(), "pld")):
        opacus_accountant.history = [(sigma, q, steps)]
        expected = opacus_accountant.get_epsilon(DELTA)
        ours_value = baselines.dpsgd_epsilon(sigma, q, steps, DELTA, accountant=ours)
        assert ours_value == pytest.approx(expected, rel=0.01)


def test_epsilon_is_monotone_in_each_parameter() -> None:
    eps = baselines.dpsgd_epsilon
    assert eps(1.0, 0.05, 100, DELTA) > eps(1.5, 0.05, 100, DELTA)  # more noise
    assert eps(1.0, 0.05, 100, DELTA) < eps(1.0, 0.1, 100, DELTA)  # larger samples
    assert eps(1.0, 0.05, 100, DELTA) < eps(1.0, 0.05, 400, DELTA)  # more steps
    assert eps(1.0, 0.05, 100, DELTA) > eps(1.0, 0.05, 100, 1e-3)  # larger delta
    assert eps(1.0, 0.05, 100, DELTA) < baselines.dpfedavg_epsilon(1.0, 100, DELTA)  # no amplification
    assert baselines.dpfedavg_epsilon(4.0, 5, DELTA) < baselines.dpfedavg_epsilon(4.0, 10, DELTA)


@pytest.mark.parametrize("target", [pytest.param(1.0, marks=pytest.mark.slow), 8.0])  # 5 s each
def test_calibrated_noise_meets_the_target(target: float) -> None:
    """The calibrated multiplier's epsilon is at most the target and within 3% of it (the PLD
    accountant's coarser calibration grid is the slack), for both baselines."""
    dpsgd = DpSgdConfig(rounds=10, local_steps=20, sample_rate=0.05).calibrated(target, DELTA)
    dpfedavg = DpFedAvgConfig(rounds=5).calibrated(target, DELTA)
    for config in (dpsgd, dpfedavg):
        assert 0.97 * target <= config.epsilon(DELTA) <= target * (1 + 1e-6)
    assert DpSgdConfig(rounds=10, local_steps=20, sample_rate=0.05).calibrated(2 * target, DELTA) \
        .noise_multiplier < dpsgd.noise_multiplier


def test_calibration_outside_the_searched_range_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a noise multiplier outside"):
        baselines.calibrate_noise_multiplier(1e-4, DELTA, sample_rate=1.0, compositions=10)


def test_bad_values_are_refused_where_they_enter() -> None:
    with pytest.raises(ValueError, match="sample_rate"):
        DpSgdConfig(sample_rate=0.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        DpFedAvgConfig(noise_multiplier=0.0)
    with pytest.raises(ValueError, match="accountant"):
        baselines.dpsgd_epsilon(1.0, 0.1, 10, DELTA, accountant="moments")
    with pytest.raises(ValueError, match="sample rate"):
        baselines.dpsgd_epsilon(1.0, 1.5, 10, DELTA)


# ----- DP-SGD through Opacus -----

def _toy(num_samples: int = 60, features: int = 12, classes: int = 3, scale: float = 1.0,
         seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = scale * torch.rand(num_samples, features, generator=generator)
    return x, torch.randint(0, classes, (num_samples,), generator=generator)


def _toy_dataset(agents: int = 3) -> Dataset:
    x, y = _toy(num_samples=30 * agents)
    x_test, y_test = _toy(num_samples=40, seed=1)
    return Dataset(name="toy", x_train=x.double(), y_train=y, x_test=x_test.double(), y_test=y_test,
                   num_classes=3)


def _local(config: DpSgdConfig, x: torch.Tensor, y: torch.Tensor, agent: int = 0, round_: int = 1,
           start: torch.Tensor | None = None):
    from opacus import GradSampleModule

    module = LogisticRegression(x.shape[1], 3)
    params = {"weight": torch.zeros(x.shape[1], 3) if start is None else start}
    return baselines.dpsgd_local(GradSampleModule(module, loss_reduction="sum"), module, params, x, y,
                                 config, agent, round_)["weight"]


def test_a_dpsgd_step_is_the_mean_of_clipped_per_sample_gradients() -> None:
    """No noise, every sample in the batch (q = 1), one step: Opacus's update must be -lr times the
    mean of the per-sample gradients, each scaled to L2 norm <= C; the inputs are large, so the
    clipping binds for every sample."""
    x, y = _toy(scale=50.0)
    config = DpSgdConfig(rounds=1, local_steps=1, sample_rate=1.0, lr=0.5, clip_norm=1.0,
                         noise_multiplier=0.0)
    update = _local(config, x, y)
    residual = torch.softmax(torch.zeros(len(y), 3), dim=1) - torch.nn.functional.one_hot(y, 3)
    per_sample = x[:, :, None] * residual[:, None, :]  # the gradient of each sample's cross-entropy at 0
    norms = per_sample.flatten(1).norm(dim=1)
    assert (norms > 1.0).all()
    clipped = per_sample * (1.0 / norms)[:, None, None]
    torch.testing.assert_close(update, -0.5 * clipped.mean(0), rtol=1e-4, atol=1e-6)
    assert update.norm() <= 0.5 * 1.0 * (1 + 1e-5)


def test_dpfedprox_adds_the_proximal_pull_to_the_noisy_step() -> None:
    """Two steps of DP-FedProx from w^t are DP-SGD's second step from w1 less lr mu (w1 - w^t); its account
    is DP-SGD's (the term is post-processing of the released gradient and the public w^t)."""
    x, y = _toy(scale=50.0)
    common = {"rounds": 1, "sample_rate": 1.0, "lr": 0.5, "clip_norm": 1.0, "noise_multiplier": 0.0}
    start = torch.full((x.shape[1], 3), 0.01)
    first = _local(DpSgdConfig(local_steps=1, **common), x, y, start=start)
    second = _local(DpSgdConfig(local_steps=1, **common), x, y, start=first)
    prox = _local(DpSgdConfig(local_steps=2, prox_mu=0.3, **common), x, y, start=start)
    torch.testing.assert_close(prox, second - 0.5 * 0.3 * (first - start), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(prox, _local(DpSgdConfig(local_steps=2, **common), x, y, start=start))
    noisy = {**common, "noise_multiplier": 1.3, "sample_rate": 0.1}
    assert DpSgdConfig(prox_mu=0.3, **noisy).epsilon(DELTA) == DpSgdConfig(**noisy).epsilon(DELTA)
    with pytest.raises(ValueError, match="prox_mu=-0.1 is not allowed; it must be >= 0"):
        DpSgdConfig(prox_mu=-0.1)


def test_the_sqrt_decay_steps_lr_over_sqrt_t_in_round_t() -> None:
    """Round 4 with lr / sqrt(t) is round 4 at a constant lr / 2, the proximal pull included; round 1 is
    the constant schedule's. The schedule leaves the account unchanged."""
    x, y = _toy(scale=50.0)
    common = {"rounds": 4, "local_steps": 2, "sample_rate": 1.0, "clip_norm": 1.0, "noise_multiplier": 0.0,
              "prox_mu": 0.3}
    start = torch.full((x.shape[1], 3), 0.01)
    decayed = DpSgdConfig(lr=0.5, lr_decay="sqrt", **common)
    assert [decayed.step_size(t) for t in (1, 4)] == [0.5, 0.25]
    for round_, lr in ((4, 0.25), (1, 0.5)):
        torch.testing.assert_close(_local(decayed, x, y, round_=round_, start=start),
                                   _local(DpSgdConfig(lr=lr, **common), x, y, round_=round_, start=start),
                                   rtol=0, atol=0)
    noisy = {**common, "noise_multiplier": 1.3, "sample_rate": 0.1}
    assert DpSgdConfig(lr_decay="sqrt", **noisy).epsilon(DELTA) == DpSgdConfig(**noisy).epsilon(DELTA)
    with pytest.raises(ValueError, match="lr_decay='cosine' is not allowed; choose one of constant, sqrt"):
        DpSgdConfig(lr_decay="cosine")


def test_dpsgd_is_reproducible_from_its_seed_and_keyed_by_agent_and_round() -> None:
    x, y = _toy()
    config = DpSgdConfig(rounds=1, local_steps=5, sample_rate=0.3, noise_multiplier=1.0, seed=3)
    first = _local(config, x, y)
    torch.testing.assert_close(_local(config, x, y), first, rtol=0, atol=0)
    for other in (_local(DpSgdConfig(**{**config.__dict__, "seed": 4}), x, y), _local(config, x, y, agent=1),
                  _local(config, x, y, round_=2)):
        assert not torch.equal(other, first)


def test_dpsgd_fedavg_is_reproducible_and_averages_by_sample_count() -> None:
    data = _toy_dataset()
    config = DpSgdConfig(rounds=2, local_steps=3, sample_rate=0.5, noise_multiplier=0.8, seed=1)
    seen: list[int] = []
    final = baselines.dpsgd_fedavg(config, data, 3, on_round=lambda t, _: seen.append(t))
    assert seen == [1, 2]
    again = baselines.dpsgd_fedavg(config, data, 3)
    torch.testing.assert_close(again["weight"], final["weight"], rtol=0, atol=0)
    # One round from zero is the mean of the agents' own DP-SGD rounds (equal blocks: equal weights).
    one = DpSgdConfig(**{**config.__dict__, "rounds": 1})
    blocks = baselines.agent_blocks(data, 3)
    expected = sum(_local(one, x, y, agent=p) for p, (x, y) in enumerate(blocks)) / 3
    torch.testing.assert_close(baselines.dpsgd_fedavg(one, data, 3)["weight"], expected, rtol=1e-5, atol=1e-7)


def test_one_agent_holds_every_sample_of_a_data_set_with_its_own_partition() -> None:
    """Central DP-SGD's one agent: every training sample, also where the data set deals its samples to its
    own agents (FEMNIST's writers), whose partition refuses any other number of agents."""
    data = dataclasses.replace(_toy_dataset(), agent_sizes=(20, 30, 40))
    ((x, y),) = baselines.agent_blocks(data, 1)
    torch.testing.assert_close(x, data.x_train.float(), rtol=0, atol=0)
    assert torch.equal(y, data.y_train)
    assert [len(y) for _, y in baselines.agent_blocks(data, 3)] == [20, 30, 40]
    with pytest.raises(ValueError, match="num-agents=2 does not match data set 'toy'"):
        baselines.agent_blocks(data, 2)


def test_the_servers_extrapolation_is_the_average_plus_beta_times_its_change() -> None:
    """With beta > 0 the global model of round t is zbar^t + beta (zbar^t - zbar^{t-1}) (zbar^0: the zero
    start), and the next round's agents start from it; the account is DP-SGD's."""
    data = _toy_dataset()
    config = DpSgdConfig(rounds=2, local_steps=3, sample_rate=0.5, noise_multiplier=0.8, seed=1,
                         extrapolation=0.7)
    seen: dict[int, torch.Tensor] = {}
    baselines.dpsgd_fedavg(config, data, 3, on_round=lambda t, p: seen.update({t: p["weight"].clone()}))
    blocks = baselines.agent_blocks(data, 3)
    first = sum(_local(config, x, y, agent=p) for p, (x, y) in enumerate(blocks)) / 3
    torch.testing.assert_close(seen[1], 1.7 * first, rtol=1e-5, atol=1e-6)
    second = sum(_local(config, x, y, agent=p, round_=2, start=seen[1])
                 for p, (x, y) in enumerate(blocks)) / 3
    torch.testing.assert_close(seen[2], second + 0.7 * (second - first), rtol=1e-5, atol=1e-6)
    noisy = {"noise_multiplier": 1.3, "sample_rate": 0.1}
    assert DpSgdConfig(extrapolation=1.0, **noisy).epsilon(DELTA) == DpSgdConfig(**noisy).epsilon(DELTA)
    with pytest.raises(ValueError, match="extrapolation=-1.0 is not allowed; it must be >= 0"):
        DpSgdConfig(extrapolation=-1.0)


def test_local_sgd_is_keyed_by_its_seed_and_lowers_the_loss() -> None:
    x, y = _toy()
    module = LogisticRegression(x.shape[1], 3)
    start = {"weight": torch.zeros(x.shape[1], 3)}
    run = lambda seed: baselines.local_sgd(module, start, x, y, epochs=3, batch_size=8, lr=0.5, seed=seed)  # noqa: E731
    assert torch.equal(run(1)["weight"], run(1)["weight"])
    assert not torch.equal(run(1)["weight"], run(2)["weight"])
    loss = lambda p: float(torch.nn.functional.cross_entropy(x @ p["weight"], y))  # noqa: E731
    assert loss(run(1)) < loss(start)
    assert torch.equal(start["weight"], torch.zeros(x.shape[1], 3))  # the caller's parameters are untouched


def test_evaluation_split_halves_the_test_set_the_same_way_every_time() -> None:
    val, test = baselines.evaluation_split(101)
    assert len(val) == 50 and len(test) == 51
    assert sorted(torch.cat([val, test]).tolist()) == list(range(101))
    assert torch.equal(baselines.evaluation_split(101)[0], val)


# ----- Flower's DP-FedAvg app -----

def _app_modules():
    sys.path.insert(0, str(APP))
    from dpfedavg_bench import client_app, inprocess, server_app

    return client_app, inprocess, server_app


def _default_federation(agents: int) -> tuple[dict[str, object], Dataset]:
    run_config = {"dataset": "default", "data-dir": "", "num-agents": agents, "delta": DELTA}
    return run_config, load_for(papers(dataset="default", num_agents=agents))


def test_flowers_dpfedavg_in_process_reports_our_accounting_and_is_reproducible() -> None:
    """Flower's wrapper, mod, accountant and the app's ClientApp through the in-process Grid: its
    RdpAccountant's epsilon is ours (RDP), and a job repeats exactly from its seed."""
    client_app, inprocess, server_app = _app_modules()
    run_config, data = _default_federation(3)
    grid = inprocess.InProcessGrid(client_app.app, 3, run_config)
    config = DpFedAvgConfig(rounds=2, noise_multiplier=2.0, seed=5)
    first = server_app.run_job(grid, config, data, 3, DELTA)
    assert first["flower-releases"] == 2
    assert first["flower-epsilon"] == pytest.approx(config.epsilon(DELTA, accountant="rdp"), rel=1e-9)
    again = server_app.run_job(grid, config, data, 3, DELTA)
    assert (again["val-error"], again["test-error"]) == (first["val-error"], first["test-error"])
    assert 0.0 <= first["test-error"] <= 1.0


@pytest.mark.slow
def test_flwr_run_of_the_dpfedavg_app_equals_the_in_process_run(flwr_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    """A real `flwr run` simulation of the app gives the in-process Grid's numbers for the same job
    (the substitution the comparison makes for FEMNIST's 195 agents)."""
    client_app, inprocess, server_app = _app_modules()
    run_config, data = _default_federation(3)
    config = DpFedAvgConfig(rounds=2, noise_multiplier=1.5, seed=2)
    jobs, results = tmp_path / "jobs.json", tmp_path / "results.jsonl"
    jobs.write_text(json.dumps([{"key": "job", **config.__dict__}]))
    overrides = {**run_config, "jobs": str(jobs), "results": str(results)}
    flwr_run(flwr_env, " ".join(f"{k}={toml_value(v)}" for k, v in overrides.items()), supernodes=3, app=APP)
    (line,) = [json.loads(text) for text in results.read_text().splitlines()]
    local = server_app.run_job(inprocess.InProcessGrid(client_app.app, 3, run_config), config, data, 3, DELTA)
    assert line["key"] == "job"
    assert line["flower-epsilon"] == pytest.approx(local["flower-epsilon"])
    assert (line["val-error"], line["test-error"]) == pytest.approx((local["val-error"], local["test-error"]),
                                                                   abs=2e-3)
