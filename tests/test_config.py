"""RunConfig: the Flower run config and the CLI share its keys and defaults; bad input is named."""

from __future__ import annotations

import dataclasses
import math
import tomllib

import pytest

from dpadmm.config import RunConfig
from tests.conftest import ROOT


def test_pyproject_run_config_equals_the_dataclass_defaults() -> None:
    app_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert app_config == RunConfig().to_mapping()
    assert RunConfig.from_mapping(app_config) == RunConfig()


def test_from_mapping_coerces_what_toml_and_flwr_give() -> None:
    config = RunConfig.from_mapping({"epsilon": "inf", "rounds": 3.0, "save-weights": "true", "beta": 0})
    assert math.isinf(config.epsilon) and config.rounds == 3 and config.save_weights and config.beta == 0.0
    assert not config.private and config.effective_epsilon == math.inf


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"algorithm": "admm"}, "algorithm='admm' is not allowed; choose one of iadmm, objp"),
        ({"epsilon": 0}, "epsilon=0.0 is not allowed"),
        ({"epsilon": "nan"}, "epsilon=nan"),
        ({"rounds": 0}, "rounds=0 is not allowed"),
        ({"rounds": 2.5}, "rounds=2.5 is not allowed; expected a int"),
        ({"algorithm": "objp", "local-steps": 3}, "local-steps=3 is not allowed with algorithm='objp'"),
        ({"seed": -1}, "seed=-1 is not allowed"),
        ({"device": "tpu"}, "device='tpu' is not allowed"),
        ({"dataset": "cifar"}, "dataset='cifar' is not allowed"),
        ({"outp-delta": 1.0}, "outp-delta=1.0 is not allowed"),
        ({"epochs": 3}, "unknown configuration key 'epochs'"),
    ],
)
def test_bad_values_are_named(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.from_mapping(values)


def test_derived_values() -> None:
    assert RunConfig(algorithm="objpm").steps == 10
    assert RunConfig(algorithm="objpm", local_steps=2).steps == 2
    assert RunConfig(algorithm="objt").steps == 1
    assert RunConfig(algorithm="iadmm", epsilon=0.1).effective_epsilon == math.inf
    assert RunConfig(dataset="mnist").rho_constants == (2.0, 5.0, 10000)
    assert RunConfig(rho_preset="femnist").rho_constants == (0.005, 0.05, 2000)
    assert RunConfig(rho_preset="custom", rho_c1=1.0, rho_c2=0.0, rho_tc=5).rho_constants == (1.0, 0.0, 5)
    assert {f.name for f in dataclasses.fields(RunConfig)} >= {"algorithm", "epsilon", "local_steps"}


def test_readme_documents_every_key() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [key for key in RunConfig().to_mapping() if f"`{key}`" not in readme]
    assert not missing, f"README.md does not document {missing}"
