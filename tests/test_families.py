"""dpadmm.families: `algorithm` picks the family, each reads its own keys of the one run config."""

from __future__ import annotations

import pytest

from dpadmm.families import ALGORITHMS, FAMILIES, family_of, from_run_config
from dpadmm.iadmm.config import RunConfig, main_job
from dpadmm.keys import key
from dpadmm.linadmm.config import LinAdmmConfig
from tests.conftest import flat_app_config


def test_the_default_run_config_is_the_main_job() -> None:
    assert from_run_config(flat_app_config()) == main_job()
    assert from_run_config({**flat_app_config(), "epsilon": 0.5}) == RunConfig(epsilon=0.5)
    assert from_run_config({**flat_app_config(), "preset": "papers"}) == RunConfig()


def test_another_familys_keys_come_from_its_table() -> None:
    values = {**flat_app_config(), "algorithm": "dp-accadmm", "linadmm.rounds": 7, "rounds": 99}
    config = from_run_config(values)
    assert isinstance(config, LinAdmmConfig) and config.algorithm == "dp-accadmm"
    assert config.rounds == 7 and config.delta == 1e-3  # its own keys and defaults, not DP-IADMM's


def test_an_unknown_algorithm_names_every_familys() -> None:
    with pytest.raises(ValueError, match="algorithm='sgd' is not allowed; choose one of iadmm, objp, objpm, "
                                         "objt, outp, dp-admm, dp-accadmm"):
        from_run_config({**flat_app_config(), "algorithm": "sgd"})
    assert tuple(a for f in FAMILIES for a in f.algorithms) == ALGORITHMS
    assert [family_of(a).name for a in ("objt", "dp-admm")] == ["iadmm", "linadmm"]
    assert key("graph_alpha") == "graph-alpha"
