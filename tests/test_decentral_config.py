"""dpadmm.decentral.config: every key validated with a message that names the value and what is allowed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dpadmm.decentral.config import DecentralConfig
from dpadmm.families import family_of, from_run_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("changes", "message"), [
    ({"algorithm": "admm"}, "algorithm='admm' is not allowed; choose one of ldp-admm, ldp-dgd, ldp-dgd-star"),
    ({"weights": "uniform"}, "weights='uniform' is not allowed; choose one of random, fixed"),
    ({"edges": 8}, "edges=8 is not allowed with agents=10; a connected graph has between 9 and 45"),
    ({"agents": 2}, "agents=2 is not allowed; give at least 3"),
    ({"algorithm": "ldp-dgd"}, "algorithm='ldp-dgd' \\(Algorithm 2\\) needs graph='complete'"),
    ({"step_decay": 1.0}, "step-decay=1.0 is not allowed; it must be in \\(0, 1\\)"),
    ({"noise_growth": 0.5}, "noise-growth=0.5 is not allowed; give a finite value >= 1"),
    ({"sensitivity": -0.01}, "sensitivity=-0.01 is not allowed; it must be >= 0 \\(0 = 2/b_i\\)"),
    ({"seed": -1}, "seed=-1 is not allowed"),
    ({"x_step": "exact"}, "x-step='exact' \\(eq. \\(12\\)\\) is not allowed with algorithm='ldp-admm' and "
                          "noise='laplace'; it needs algorithm='ldp-admm' and noise='none'"),
    ({"x_step": "newton"}, "x-step='newton' is not allowed; choose one of linearised, exact"),
    ({"target_epsilon": 1.0, "noise": "none"}, "target-epsilon=1.0 is not allowed; give a finite value >= 0"),
    ({"partition": "quantity:1"}, "partition=quantity:1 is not allowed with 100 samples per agent: every "
                                  "agent holds the same number of samples; give contiguous, dirichlet:ALPHA "
                                  "or shards:K with K dividing 100"),
    ({"partition": "shards:3"}, "partition=shards:3 is not allowed with 100 samples per agent"),
    ({"partition": "iid"}, "partition='iid' is not allowed; give contiguous, dirichlet:ALPHA"),
])
def test_a_bad_value_is_named(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecentralConfig(**changes)


def test_the_papers_schedule_and_the_family() -> None:
    config = DecentralConfig()
    assert config.alpha(3) == pytest.approx(0.1)  # alpha = 1/D
    assert DecentralConfig(algorithm="dgd", step_decay=0.9).alpha(2) == pytest.approx(0.81)  # alpha_k = eta_k
    assert DecentralConfig.from_mapping(config.to_mapping()) == config
    assert config.bound == 0.02 and config.covered  # 2/b_i: one sample replaced, unit rows, labels +-1
    assert not DecentralConfig(sensitivity=0.01).covered  # the paper's 1/b_i
    assert family_of("ldp-dgd-star").name == "decentral"
    run_config = {"algorithm": "ldp-admm", "decentral.agents": 5, "decentral.edges": 6, "iadmm.rounds": 10}
    assert from_run_config(run_config) == DecentralConfig(agents=5, edges=6)
    with pytest.raises(ValueError, match="iadmm.rounds=99 is not read with algorithm='ldp-admm'"):
        from_run_config({**run_config, "iadmm.rounds": 99})



def test_pyproject_holds_the_defaults_in_the_familys_table() -> None:
    """[tool.flwr.app.config.decentral] is every key but `algorithm`, which is the app's top-level one."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]["decentral"]
    assert table == {k: v for k, v in DecentralConfig().to_mapping().items() if k != "algorithm"}


def test_a_run_folder_names_the_epsilon_it_was_calibrated_to() -> None:
    """A calibrated run's folder names its pure, whole-run epsilon; an uncalibrated one its noise growth (its
    epsilon depends on K and d); a run without noise says so."""
    assert DecentralConfig(target_epsilon=2.0).default_out() == "runs/ldp-admm-random-adult-eps2-seed0"
    assert DecentralConfig().default_out() == "runs/ldp-admm-random-adult-beta1.02-seed0"
    assert DecentralConfig(noise="none").default_out() == "runs/ldp-admm-random-adult-nonprivate-seed0"
