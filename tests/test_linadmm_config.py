"""dpadmm.linadmm.config: every key validated with an error naming the value; the kebab-case mapping."""

from __future__ import annotations

import math
import tomllib

import pytest

from dpadmm.linadmm.config import LinAdmmConfig
from tests.conftest import ROOT


@pytest.mark.parametrize(("values", "message"), [
    ({"algorithm": "admm"}, "algorithm='admm' is not allowed; choose one of dp-admm, dp-accadmm"),
    ({"dataset": "gisette"}, "dataset='gisette' is not allowed; choose one of a9a, a8a, ijcnn1, bio_train"),
    ({"target_epsilon": 0.0}, "target-epsilon=0.0 is not allowed; it must be > 0 (inf = non-private)"),
    ({"target_epsilon": math.nan}, "target-epsilon=nan is not allowed"),
    ({"delta": 1.0}, "delta=1.0 is not allowed; it must be in (0, 1)"),
    ({"rdp_mu": 1.0}, "rdp-mu=1.0 is not allowed; it must be in (0, 1)"),
    ({"eta": 0.0}, "eta=0.0 is not allowed; it must be finite and > 0"),
    ({"grad_bound": -1.0}, "grad-bound=-1.0 is not allowed; it must be finite and > 0"),
    ({"gamma": -1.0}, "gamma=-1.0 is not allowed; it must be finite and >= 0"),
    ({"eta": math.inf}, "eta=inf is not allowed; it must be finite and > 0"),
    ({"l1": math.inf}, "l1=inf is not allowed; it must be finite and >= 0"),
    ({"rounds": 0}, "rounds=0 is not allowed; it must be >= 1"),
    ({"neighbouring": "replace"}, "neighbouring='replace' is not allowed; choose one of add-remove, "
                                  "replace-one"),
    ({"dual_init": "pinv"}, "dual-init='pinv' is not allowed; choose one of zero, paper"),
    ({"restart": "goldstein"}, "restart='goldstein' is not allowed with algorithm='dp-admm'"),
    ({"seed": 2**32}, "seed=4294967296 is not allowed"),
])
def test_a_bad_value_is_named_with_what_is_allowed(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LinAdmmConfig(**values)


def test_pyproject_holds_the_defaults_in_the_familys_table() -> None:
    """[tool.flwr.app.config.linadmm] is every key but `algorithm`, which is the app's top-level one."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]["linadmm"]
    assert table == {k: v for k, v in LinAdmmConfig().to_mapping().items() if k != "algorithm"}



def test_the_mapping_round_trips_and_unknown_keys_are_named() -> None:
    config = LinAdmmConfig.from_mapping({"algorithm": "dp-accadmm", "restart": "goldstein",
                                         "target-epsilon": "inf", "rounds": 50, "l1": 1e-4})
    assert not config.private and config.accelerated and config.rounds == 50
    assert LinAdmmConfig.from_mapping(config.to_mapping()) == config
    assert config.default_out() == "runs/dp-accadmm-a9a-epsinf-seed0"
    private = LinAdmmConfig.from_mapping({"algorithm": "dp-admm", "dataset": "a9a", "target-epsilon": 0.05})
    assert private.default_out() == "runs/dp-admm-a9a-eps0.05-delta0.001-seed0"  # the whole run's figure
    with pytest.raises(ValueError, match="unknown configuration key 'local-steps'; known keys: algorithm"):
        LinAdmmConfig.from_mapping({"local-steps": 3})
