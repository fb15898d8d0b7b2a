"""DP-ADMM's audit (dpadmm.linadmm.audit): the real noisy gradient and a whole run stay below their claims; a
halved noise, a skipped clipping and a run with a hundredth of its noise, as plausible bugs would make them,
exceed them. The broken variants live here."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dpadmm.linadmm import engine
from dpadmm.linadmm.audit import audit, one_run
from dpadmm.linadmm.config import LinAdmmConfig
from dpadmm.models import binary

TRIALS = 20_000
# one iteration at a per-release epsilon an audit of seconds can see (the paper's runs spend far less each)
LOUD = LinAdmmConfig(target_epsilon=5.0, rounds=2)


@pytest.mark.slow
@pytest.mark.parametrize("neighbouring", ["add-remove", "replace-one"])
def test_the_noisy_gradient_stays_below_its_claim(neighbouring: str) -> None:
    result = audit(dataclasses.replace(LOUD, neighbouring=neighbouring), trials=TRIALS)
    assert 0.5 * result.claim < result.bound <= result.claim, result.line()
    assert result.delta == LOUD.delta


@pytest.mark.slow
def test_halved_noise_is_caught() -> None:
    def halved(total: torch.Tensor, n: int, seeds: list[int], t: int, std: float) -> torch.Tensor:
        return engine.release(total, n, seeds, t, std / 2)

    result = audit(LOUD, trials=TRIALS, release=halved)
    assert result.exceeded, result.line()


@pytest.mark.slow
def test_skipped_clipping_is_caught() -> None:
    def unclipped(features: torch.Tensor, labels: torch.Tensor, x: torch.Tensor, clip: float | None
                  ) -> torch.Tensor:
        return binary.clipped_gradient_sum(features, labels, x, None)

    result = audit(LOUD, trials=TRIALS, clipped=unclipped)
    assert result.exceeded, result.line()


def test_a_non_private_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="adds no noise"):
        audit(LinAdmmConfig(target_epsilon=float("inf")), trials=1000)


def test_one_run_with_canaries_stays_below_the_whole_run_claim_and_catches_missing_noise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A short run audited from one run with canaries: below its whole-run claim with the real noise, above
    it with a hundredth of the noise (the release the engine's iterations call)."""
    short = LinAdmmConfig(target_epsilon=1.0, rounds=3)
    fine = one_run(short)
    assert fine.bound <= fine.claim and fine.trials == 2000, fine.line()

    real = engine.release
    monkeypatch.setattr(engine, "release",
                        lambda total, n, seeds, t, std: real(total, n, seeds, t, std / 100))
    broken = one_run(short)
    assert broken.exceeded, broken.line()
