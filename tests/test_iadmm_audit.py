"""DP-IADMM's audit (dpadmm.iadmm.audit): the real release stays below its claim, the papers' data-dependent
scale does not, and broken variants of the release, as plausible bugs would make them, exceed their claim.

The broken variants live here, not in the package: each wraps or replaces one piece of the code that trains.
"""

from __future__ import annotations

import dataclasses

import pytest

from dpadmm import native
from dpadmm.iadmm.audit import audit, one_run
from dpadmm.iadmm.config import RunConfig, main_job, papers
from dpadmm.iadmm.local import agent_round
from dpadmm.models import oracles

TRIALS = 50_000
CLIPPED_LAPLACE = papers(epsilon=1.0, sensitivity="clipped", clip_norm=1.0)


@pytest.mark.parametrize("config", [CLIPPED_LAPLACE, main_job(), papers(algorithm="objt", epsilon=1.0),
                                    papers(algorithm="outp", epsilon=1.0),
                                    papers(epsilon=0.5, sensitivity="clipped", clip_norm=1.0,
                                              mechanism="gaussian")],
                         ids=["objp-laplace", "main-job", "objt", "outp", "objp-gaussian"])
def test_the_release_stays_below_its_claim(config: RunConfig) -> None:
    result = audit(config, trials=TRIALS)
    assert 0 < result.bound <= result.claim, result.line()


def test_the_clipped_laplace_step_is_audited_close_to_its_claim() -> None:
    result = audit(CLIPPED_LAPLACE, trials=TRIALS)
    assert result.bound >= 0.85 * result.claim, result.line()
    assert result.delta == 0.0  # a pure claim


def test_the_papers_data_dependent_scale_is_not_eps_bar_dp() -> None:
    """A finding (docs/families/iadmm.md, "Audit"): eq. (9b)'s scale follows the data, and one step's
    realised epsilon is many times eps-bar."""
    result = audit(papers(epsilon=1.0, sensitivity="data-dependent"), trials=TRIALS)
    assert result.exceeded and result.bound > 5.0, result.line()


def _halved_noise(config: RunConfig, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
    """A bug that draws the noise for twice eps-bar (half the scale) while the ledger states eps-bar."""
    return agent_round(dataclasses.replace(config, epsilon=2 * config.epsilon), *args, **kwargs)


@pytest.mark.parametrize("config", [CLIPPED_LAPLACE, main_job()], ids=["objp-laplace", "main-job"])
def test_halved_noise_is_caught(config: RunConfig) -> None:
    result = audit(config, trials=TRIALS, release=_halved_noise)
    assert result.exceeded, result.line()


def test_clipping_at_twice_c_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = oracles.gradient

    def doubled(*args, clip: float | None = None, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return real(*args, clip=None if clip is None else 2 * clip, **kwargs)

    monkeypatch.setattr(oracles, "gradient", doubled)
    result = audit(CLIPPED_LAPLACE, trials=TRIALS)
    assert result.exceeded, result.line()


def test_clipping_in_the_wrong_norm_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Laplace noise calibrated for an L1 sensitivity over terms clipped in L2 (of larger L1 norm)."""
    real = oracles.gradient

    def l2(*args, norm: str = "l1", **kwargs):  # noqa: ANN002, ANN003, ANN202
        return real(*args, norm="l2", **kwargs)

    monkeypatch.setattr(oracles, "gradient", l2)
    result = audit(dataclasses.replace(CLIPPED_LAPLACE, epsilon=2.0), trials=TRIALS)
    assert result.exceeded, result.line()


def test_a_normaliser_from_the_realised_sample_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampled sum divided by the size of the Poisson sample taken instead of the fixed q I: the canary's
    share of a small sample is large."""
    real = native.sampled_gradient

    def realised(rows, y, x_l1, x_l2, z, taken, *, scale, **kwargs):  # noqa: ANN001, ANN003, ANN202
        g = real(rows, y, x_l1, x_l2, z, taken, scale=1.0, **kwargs)
        size = taken.sum(dim=-1).clamp(min=1).to(g.dtype).reshape(*g.shape[:-2], 1, 1)
        return g / size

    monkeypatch.setattr(native, "sampled_gradient", realised)
    result = audit(main_job(), trials=TRIALS)
    assert result.exceeded, result.line()


def test_the_audit_refuses_what_has_no_claim() -> None:
    with pytest.raises(ValueError, match="adds no noise"):
        audit(papers(algorithm="iadmm"), trials=1000)
    with pytest.raises(ValueError, match="model='cnn'"):
        audit(dataclasses.replace(main_job(), model="cnn", dataset="femnist"), trials=1000)


def test_every_trial_is_another_agent_of_the_real_streams() -> None:
    """Two audits of the same configuration see the same draws (keyed by agent id), and the bound of the
    first half of the trials is not that of all of them (each trial is new noise)."""
    first, again = audit(CLIPPED_LAPLACE, trials=20_000), audit(CLIPPED_LAPLACE, trials=20_000)
    assert first.bound == again.bound and first.detail == again.detail
    assert audit(CLIPPED_LAPLACE, trials=40_000).detail["p"] != first.detail["p"]


def test_one_run_with_canaries_stays_below_the_whole_run_claim_and_catches_missing_noise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The main job's whole run, audited from one run: below its claim. A run whose noise was drawn for a
    hundred times eps-bar (a hundredth of the scale) is caught against the small claim of a short Laplace
    run."""
    main = one_run(main_job())
    assert 0 < main.bound <= main.claim and main.trials == 2000, main.line()
    short = papers(algorithm="objp", epsilon=0.05, sensitivity="clipped", clip_norm=1.0, rounds=3)
    fine = one_run(short)
    assert fine.bound <= fine.claim, fine.line()

    real = agent_round
    monkeypatch.setattr("dpadmm.iadmm.engine.agent_round", lambda config, *args, **kwargs: real(
        dataclasses.replace(config, epsilon=100 * config.epsilon), *args, **kwargs))
    broken = one_run(short)
    assert broken.exceeded, broken.line()
