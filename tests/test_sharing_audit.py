"""ADMM sharing's audits (dpadmm.sharing.audit): the real message and the real whole run stay below their
claims, the paper's noise (eq. (16), not covered) does not, and broken variants of the party's step exceed
them. The broken variants live here."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dpadmm.sharing import engine
from dpadmm.sharing.audit import SAMPLES, audit, one_run
from dpadmm.sharing.config import SharingConfig

TRIALS = 20_000
CONFIG = SharingConfig(epsilon=1.0)


@pytest.mark.slow
def test_the_message_stays_below_its_claim() -> None:
    result = audit(CONFIG, trials=TRIALS)
    assert result.bound <= result.claim, result.line()


@pytest.mark.slow  # 4 s
def test_the_papers_noise_is_refuted() -> None:
    result = audit(dataclasses.replace(CONFIG, noise="paper"), trials=TRIALS)
    assert result.exceeded, result.line()


@pytest.mark.slow
def test_noise_for_one_sample_is_caught() -> None:
    """sigma from the sensitivity of one score, 2b, instead of the message's 2b sqrt(N)."""
    def one_sample(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        *head, std = args
        return engine.party_step(*head, std / math.sqrt(SAMPLES), **kwargs)

    result = audit(CONFIG, trials=2 * TRIALS, party_step=one_sample)
    assert result.exceeded, result.line()


@pytest.mark.slow  # 4 s
def test_an_unbounded_x_step_is_caught() -> None:
    """The x-step without its ball ||x_m|| <= b, on which the sensitivity rests."""
    def unbounded(parties, pulled, own, y, config, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        return engine.party_step(parties, pulled, own, y, dataclasses.replace(config, x_bound=1e6), *args,
                                 **kwargs)

    result = audit(CONFIG, trials=TRIALS, party_step=unbounded)
    assert result.exceeded, result.line()
    assert torch.isfinite(torch.tensor(result.bound))


def test_a_non_private_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="adds no noise"):
        audit(SharingConfig(epsilon=float("inf")), trials=1000)


SHORT = SharingConfig(epsilon=0.5, rounds=3)  # a whole run with a small claim (eps ~ 0.64)


def test_one_run_with_canaries_stays_below_the_whole_run_claim_and_catches_missing_noise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default run (50 rounds), audited from one run with canary parties: below its claim. A run whose
    messages get a hundredth of Theorem 3's noise is caught against the small claim of a short run."""
    full = one_run(CONFIG)
    assert 0 < full.bound <= full.claim and full.trials == 2000, full.line()
    fine = one_run(SHORT)
    assert fine.bound <= fine.claim, fine.line()

    real = engine.release
    monkeypatch.setattr("dpadmm.sharing.engine.release", lambda parties, x, seeds, t, std, *args, **kwargs:
                        real(parties, x, seeds, t, std / 100, *args, **kwargs))
    broken = one_run(SHORT)
    assert broken.exceeded, broken.line()


def test_one_run_refutes_the_papers_noise() -> None:
    """eq. (16)'s noise keeps each message in its block's column space: a whole run tells the blocks apart."""
    result = one_run(dataclasses.replace(SHORT, noise="paper"))
    assert result.exceeded, result.line()


def test_one_run_refuses_a_non_private_configuration() -> None:
    with pytest.raises(ValueError, match="adds no noise"):
        one_run(SharingConfig(epsilon=float("inf")), canaries=10)
