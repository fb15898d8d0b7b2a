"""dpadmm.sharing.config: every key validated with a message that names the value and what is allowed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpadmm.sharing.config import SharingConfig, parse_parties


@pytest.mark.parametrize(("changes", "message"), [
    ({"parties": "66,x"}, "parties='66,x' is not allowed"),
    ({"parties": "66,0"}, "parties='66,0' is not allowed"),
    ({"noise": "laplace"}, "noise='laplace' is not allowed; choose one of message, paper"),
    ({"epsilon": 0.0}, "epsilon=0.0 is not allowed"),
    ({"epsilon": math.nan}, "epsilon=nan is not allowed"),
    ({"delta": 1.0}, "delta=1.0 is not allowed"),
    ({"x_bound": 0.0}, "x-bound=0.0 is not allowed"),
    ({"rounds": 0}, "rounds=0 is not allowed"),
])
def test_a_bad_value_is_named(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SharingConfig(**changes)


def test_the_mapping_round_trips_and_the_split_parses() -> None:
    config = SharingConfig(epsilon=0.5, parties="2,3,4")
    assert SharingConfig.from_mapping(config.to_mapping()) == config
    assert parse_parties("66,57") == (66, 57) and config.widths == (2, 3, 4)
    assert not SharingConfig(epsilon=math.inf).private and config.private
    with pytest.raises(ValueError, match="unknown configuration key 'party'"):
        SharingConfig.from_mapping({"party": "1"})


def test_the_run_folder_says_its_epsilon_is_per_round() -> None:
    """The run is given (eps, delta) per round of one party, not for the whole run: its folder says so."""
    config = SharingConfig(epsilon=0.5, delta=1e-5, dataset="a9a")
    assert config.default_out() == "runs/admm-sharing-a9a-eps0.5-delta1e-05-per-round-seed0"
    non_private = SharingConfig(epsilon=math.inf, dataset="a9a")
    assert non_private.default_out() == "runs/admm-sharing-a9a-epsinf-seed0"


def test_pyproject_holds_the_defaults_in_the_familys_table() -> None:
    """[tool.flwr.app.config.sharing] is every key but `algorithm`, which is the app's top-level one."""
    import tomllib

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    table = tomllib.loads(pyproject)["tool"]["flwr"]["app"]["config"]["sharing"]
    assert table == {k: v for k, v in SharingConfig().to_mapping().items() if k != "algorithm"}
