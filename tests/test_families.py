"""dpadmm.families: `algorithm` picks the family, each reads its own keys of the one run config."""

from __future__ import annotations

import dataclasses
import re
import tomllib

import pytest

from dpadmm.families import ALGORITHMS, FAMILIES, TOP_LEVEL, family_of, from_run_config, tables
from dpadmm.iadmm.config import main_job, papers
from dpadmm.keys import key
from dpadmm.linadmm.config import LinAdmmConfig
from tests.conftest import ROOT, flat_app_config


def test_the_default_run_config_is_the_main_job() -> None:
    assert from_run_config(flat_app_config()) == main_job()
    assert from_run_config({**flat_app_config(), "preset": "papers"}) == papers()
    given = {**flat_app_config(), "iadmm.rounds": 3}
    assert from_run_config(given) == dataclasses.replace(main_job(), rounds=3)
    given = {**flat_app_config(), "preset": "papers", "iadmm-papers.epsilon": 0.5}
    assert from_run_config(given) == papers(epsilon=0.5)
    # without the merged defaults (run_simulation's run config): the same configurations
    assert from_run_config({}) == main_job()
    assert from_run_config({"preset": "papers", "iadmm-papers.epsilon": 0.5}) == papers(epsilon=0.5)
    # num-agents = 0 in both tables: the data set's own count (195 FEMNIST writers), not the default's 10
    assert from_run_config({"iadmm.dataset": "femnist"}).num_agents == 195


def test_pyproject_holds_every_familys_table_at_its_defaults() -> None:
    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert {name: value for name, value in app.items() if isinstance(value, dict)} == tables()
    assert [name for name, value in app.items() if not isinstance(value, dict)] == list(TOP_LEVEL)


def test_another_familys_keys_come_from_its_table() -> None:
    values = {**flat_app_config(), "algorithm": "dp-accadmm", "linadmm.rounds": 7}
    config = from_run_config(values)
    assert isinstance(config, LinAdmmConfig) and config.algorithm == "dp-accadmm"
    assert config.rounds == 7 and config.delta == 1e-3  # its own keys and defaults, not DP-IADMM's


@pytest.mark.parametrize(("given", "message"), [
    # a value given in a table the run does not read: refused, with the key to use
    ({"algorithm": "ldp-admm", "iadmm.rounds": 1},
     "iadmm.rounds=1 is not read with algorithm='ldp-admm'; its keys are decentral.*: decentral.rounds"),
    ({"linadmm.rounds": 7}, "linadmm.rounds=7 is not read with algorithm='objpm' preset='main'; its keys are "
                            "iadmm.*: iadmm.rounds"),
    ({"preset": "papers", "iadmm.rounds": 3},
     "iadmm.rounds=3 is not read with algorithm='objpm' preset='papers'; its keys are iadmm-papers.*: "
     "iadmm-papers.rounds"),
    ({"algorithm": "admm-sharing", "decentral.graph-alpha": 1},
     "unknown configuration key 'decentral.graph-alpha'; known keys: decentral."),
    # what no table has (Flower itself refuses it in a flwr run; run_simulation's run config reaches here)
    ({"rounds": 3}, "unknown configuration key 'rounds'; the run config has algorithm, preset and the tables "
                    "iadmm.*, iadmm-papers.*, linadmm.*"),
    ({"iadmm.epochs": 3}, "unknown configuration key 'iadmm.epochs'; known keys: iadmm.batch-size"),
    ({"algorithm": "dp-admm", "preset": "papers"}, "preset='papers' is not allowed with algorithm='dp-admm': "
                                                   "presets are DP-IADMM's"),
    ({"iadmm.epsilon": 0.5}, "iadmm.epsilon=0.5 is not used while target-epsilon=8 calibrates eps-bar"),
    ({"algorithm": "dp-admm", "linadmm.rounds": 0}, "linadmm.rounds=0 is not allowed; it must be >= 1"),
])
def test_a_key_the_run_does_not_read_never_passes_silently(given: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        from_run_config({**flat_app_config(), **given})
    assert from_run_config({**flat_app_config(), "algorithm": "ldp-admm", "iadmm.rounds": 10}).rounds == 100


def test_an_unknown_algorithm_names_every_familys() -> None:
    with pytest.raises(ValueError, match="algorithm='sgd' is not allowed; choose one of iadmm, objp, objpm, "
                                         "objt, outp, dp-admm, dp-accadmm"):
        from_run_config({**flat_app_config(), "algorithm": "sgd"})
    assert tuple(a for f in FAMILIES for a in f.algorithms) == ALGORITHMS
    assert [family_of(a).name for a in ("objt", "dp-admm")] == ["iadmm", "linadmm"]
    assert key("graph_alpha") == "graph-alpha"


def test_a_run_config_is_read_once_per_value_and_refused_every_time() -> None:
    """A ClientApp reads the run config for every message: equal run configs give the one (frozen)
    configuration, built once; a refused one is refused again each time, never served from the cache."""
    given = {**flat_app_config(), "iadmm.rounds": 7}
    first = from_run_config(given)
    assert from_run_config(dict(given)) is first and first.rounds == 7
    assert from_run_config({**given, "iadmm.rounds": 8}).rounds == 8
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^iadmm\.rounds=0 is not allowed"):
            from_run_config({**given, "iadmm.rounds": 0})
    # an equal value of another type is its own key: True is no round count, whatever 1 gave
    assert from_run_config({**given, "iadmm.rounds": 1}).rounds == 1
    with pytest.raises(ValueError, match=r"iadmm\.rounds"):
        from_run_config({**given, "iadmm.rounds": True})


def test_the_client_package_names_every_familys_paper_and_module() -> None:
    """clients/'s docstring, what a reader of the ClientApp meets first, names each family's paper and the
    module that answers its messages."""
    import clients

    for family in FAMILIES:
        paper = re.search(r"\((\d{3})", family.papers)
        module = "dpiadmm" if family.name == "iadmm" else family.name
        assert paper and (ROOT / "clients" / f"{module}.py").is_file(), family.name
        assert f"({paper.group(1)}; ``{module}``" in (clients.__doc__ or ""), family.name
