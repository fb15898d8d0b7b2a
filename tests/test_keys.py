"""dpadmm.keys: the checks every family's configuration shares."""

from __future__ import annotations

import math
import re

import pytest

from dpadmm.decentral.config import DecentralConfig
from dpadmm.families import FAMILIES
from dpadmm.iadmm.config import RunConfig
from dpadmm.sharing.config import SharingConfig


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize(("value", "expected"), [("abc", "an integer"), (2.7, "an integer"),
                                                 (True, "an integer")])
def test_a_configuration_built_in_python_refuses_a_value_of_another_type(family, value: object,
                                                                         expected: str) -> None:
    """`RunConfig(rounds="abc")` (or 2.7, or True) is refused by name, as the run config's coercion refuses
    it, instead of failing deep inside a run or running as 1 round."""
    with pytest.raises(ValueError, match=f"rounds={value!r} is not allowed; expected {expected}"):
        family.config(rounds=value)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_an_integer_for_a_float_becomes_that_float(family) -> None:
    config = family.config(node_timeout=30, seed=3)
    assert config.node_timeout == 30.0 and isinstance(config.node_timeout, float)
    assert config.seed == 3 and isinstance(config.seed, int)


@pytest.mark.parametrize(("name", "value", "rule"), [
    ("clip_norm", math.inf, "finite and > 0"), ("clip_norm", math.nan, "finite and > 0"),
    ("beta", math.inf, "finite and >= 0"), ("beta", math.nan, "finite and >= 0"),
    ("rho_c1", math.inf, "finite and > 0"), ("rho_c2", -1.0, "finite and >= 0"),
    ("target_epsilon", math.inf, "finite and > 0 (0 = off; a non-private run is epsilon=inf"),
])
def test_dpiadmms_numbers_are_finite(name: str, value: float, rule: str) -> None:
    """clip-norm=inf or beta=inf used to run: noise of infinite scale refused only inside a round, a train
    loss of NaN in every record."""
    message = f"{name.replace('_', '-')}={value!r} is not allowed; it must be {rule}"
    with pytest.raises(ValueError, match=re.escape(message)):
        RunConfig(**{name: value})


@pytest.mark.parametrize(("build", "message"), [
    (lambda: RunConfig(rho_c1=50.0), "rho-c1=50.0 is not read with rho-preset='main', only with "
                                     "rho-preset='custom'; leave it at its default 2.0"),
    (lambda: RunConfig(algorithm="objpm", outp_delta=0.5),
     "outp-delta=0.5 is not read with algorithm='objpm'"),
    (lambda: DecentralConfig(graph="complete", edges=3), "edges=3 is not read with graph='complete'"),
    (lambda: DecentralConfig(target_epsilon=1.0, noise_growth=5.0), "noise-growth=5.0 is not read with a "
                                                                    "target-epsilon"),
])
def test_a_value_the_run_would_not_read_is_refused(build, message: str) -> None:
    """A key the chosen mode does not read used to be recorded in config.json and ignored; a value other than
    its default is refused, naming what reads it. The defaults (every table of the Flower app) pass."""
    with pytest.raises(ValueError, match=re.escape(message)):
        build()
    assert RunConfig(rho_preset="custom", rho_c1=50.0).rho_constants[0] == 50.0


@pytest.mark.parametrize("name", ["rho", "l2", "x_bound"])
def test_admm_sharings_numbers_are_finite(name: str) -> None:
    """rho=inf or l2=inf ran to a NaN objective and a test error of 0 (NaN compares as correct); x-bound=inf
    was refused as an epsilon that cannot be calibrated, not by its name."""
    with pytest.raises(ValueError, match=f"{name.replace('_', '-')}=inf is not allowed; it must be finite"):
        SharingConfig(**{name: math.inf})
