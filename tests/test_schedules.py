"""rho^t of eq. (24) with both presets, eta^t, the trust radius, OutP's step and noise."""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from benchmarks import compare_dp
from dpadmm.iadmm import engine, schedules
from dpadmm.iadmm.config import LOGISTIC_RATE_SHARE, RunConfig, main_job, papers
from dpadmm.models.modules import build_model
from tests.conftest import ROOT, words


def test_rho_eq_24_presets() -> None:
    mnist = papers(dataset="mnist", epsilon=0.05)
    assert schedules.rho_at(mnist, 1) == pytest.approx(2.0 + 5.0 / 0.05)
    assert schedules.rho_at(mnist, 9999) == pytest.approx(2.0 + 100.0)
    assert schedules.rho_at(mnist, 10000) == pytest.approx(2.0 * 1.2 + 100.0)
    assert schedules.rho_at(mnist, 20000) == pytest.approx(2.0 * 1.44 + 100.0)
    femnist = papers(rho_preset="femnist", epsilon=1.0)
    assert schedules.rho_at(femnist, 4000) == pytest.approx(0.005 * 1.44 + 0.05)
    non_private = papers(algorithm="iadmm", epsilon=0.05)
    assert schedules.rho_at(non_private, 1) == 2.0  # the c2 / eps term vanishes
    assert schedules.rho(10**6, 2.0, 5.0, 1, 1.0) == 1e9  # the upper bound


def test_eta_and_trust_radius() -> None:
    assert schedules.eta(4, 1.0) == 0.5
    assert schedules.eta(9, 3.0) == 1.0
    assert schedules.trust_radius(10, 1.0) == pytest.approx(0.01)
    assert schedules.trust_radius(2, 4.0) == 1.0
    assert schedules.trust_radius(2, 4.0, "paper") == 1.0
    # The authors' code: a / (iteration+1)*(iteration+1), which Python reads as (a / t) * t.
    for t in (1, 7, 20000):
        assert schedules.trust_radius(t, 4.0, "reference") == 4.0 == pytest.approx(4.0 / t * t)


def test_outp_step_and_sigma() -> None:
    jk, delta = 7840, 1e-6
    inv = schedules.outp_inverse_eta(3, 6000, jk, 0.1, delta, 1.0)
    expected = 0.25 * 6000 + 4 * math.sqrt(jk * 3 * math.log(1.25 / delta)) / (0.1 * math.sqrt(4 * jk))
    assert inv == pytest.approx(expected)
    assert schedules.outp_inverse_eta(3, 6000, jk, math.inf, delta, 2.0) == pytest.approx(750.0)
    sigma = schedules.outp_sigma(0.1, delta, 102.0, inv)
    assert sigma == pytest.approx(2 * math.sqrt(2 * math.log(1.25 / delta)) / (0.1 * (102.0 + inv)))
    assert schedules.outp_sigma(math.inf, delta, 2.0, inv) == 0.0


def test_participants_are_a_keyed_sample_of_ceil_fraction_p() -> None:
    config = papers(num_agents=10, fraction_train=0.3, seed=5)
    samples = [schedules.participants(config, t) for t in range(1, 51)]
    assert all(len(s) == 3 and s == sorted(set(s)) and all(0 <= p < 10 for p in s) for s in samples)
    assert samples == [schedules.participants(config, t) for t in range(1, 51)]  # a function of (seed, t)
    assert len({tuple(s) for s in samples}) > 20  # rounds differ
    counts = [sum(p in s for s in samples) for p in range(10)]
    assert min(counts) > 5  # every agent takes part now and then (expected 15 of 50)
    other_seed = [schedules.participants(config, t, seed=6) for t in range(1, 51)]
    assert other_seed != samples
    assert schedules.participants(papers(num_agents=7), 3) == list(range(7))
    assert len(schedules.participants(papers(num_agents=7, fraction_train=0.01), 3)) == 1  # at least one
    assert len(schedules.participants(papers(num_agents=10, fraction_train=0.7), 1)) == 7  # ceil, exactly


def test_fraction_train_must_be_in_0_1() -> None:
    for bad in (0.0, -0.5, 1.5, math.nan):
        with pytest.raises(ValueError, match=r"fraction-train=.* must be in \(0, 1\]"):
            papers(fraction_train=bad)


def test_the_main_jobs_rate_follows_the_noise() -> None:
    """The main job's step (prox-scale 0) shrinks its learning rate R to room / r where one step's noise,
    r = sigma sqrt(d) P / C times its largest clean gradient, would exceed it: R = 4 / C for a network and
    a C / ((1 + 0.2) P) for logistic regression's a = 13 P / C (about 11); the room is 20 for the built-in
    MLP, sqrt(P K) for logistic regression with K classes (10 in the main job) and 10 for every other
    model, a custom module's included, unless noise-room gives one; a given prox-scale and a run without
    noise keep their step."""
    d = 10_000
    for model, agents, classes, rate, room in (
            ("mlp", 10, 10, 4.0, 20.0), ("small-cnn", 10, 62, 4.0, 10.0), ("custom", 195, 0, 4.0, 10.0),
            ("logistic", 10, 10, 13.0 / 1.2, 10.0), ("logistic", 195, 62, 13.0 / 1.2, math.sqrt(195 * 62))):
        config = dataclasses.replace(main_job(), model=model, num_agents=agents, clip_norm=2.0)
        assert config.noise_room_for(classes) == room
        for r in (0.5, 2.0, 20.0):
            sigma = torch.full((agents,), r * config.clip_norm / (math.sqrt(d) * config.num_agents))
            damping = schedules.noise_damping(config, sigma, d, classes)
            assert damping * rate == pytest.approx(min(rate, room / r))
        chosen = dataclasses.replace(config, noise_room=3.0)  # noise-room given: the model's room replaced
        sigma = torch.full((agents,), 2.0 * config.clip_norm / (math.sqrt(d) * config.num_agents))
        assert chosen.noise_room_for(classes) == 3.0
        damped = schedules.noise_damping(chosen, sigma, d, classes)
        assert damped * rate == pytest.approx(min(rate, 3.0 / 2.0))
        assert schedules.noise_damping(config, None, d, classes) == 1.0
        given = dataclasses.replace(config, prox_scale=7.0)
        assert schedules.noise_damping(given, torch.full((agents,), 1e3), d, classes) == 1.0


def test_the_main_jobs_rate_decays_only_as_far_as_its_noise_needs() -> None:
    """local_eta: under the main job's rule a private run of any model takes min(R, room / (r sqrt(t))), eq.
    (8)'s eta^t = a / sqrt(t) times the damping where the noise binds from t = 1 (as before, to the bit); a
    network without noise a constant a; logistic regression without noise (unclipped) and a given
    prox-scale keep eq. (8)'s decay."""
    d = 10_000

    def sigma(config: RunConfig, r: float) -> torch.Tensor:
        return torch.full((10,), r * config.clip_norm / (math.sqrt(d) * config.num_agents))

    network = dataclasses.replace(main_job(), model="small-cnn", num_agents=10, clip_norm=2.0)
    logistic = dataclasses.replace(network, model="logistic")
    for config, rate, room in ((network, 4.0, 10.0), (logistic, 13.0 / 1.2, 10.0)):
        a = config.scale
        for t in (1, 2, 5, 50):
            binds = sigma(config, 5.0)  # R r > room: damped from the first round
            assert schedules.local_eta(config, t, binds, d, 10) == schedules.eta(
                t, a * schedules.noise_damping(config, binds, d, 10))
            damped = room / (5.0 * math.sqrt(t))
            assert schedules.local_eta(config, t, binds, d, 10) * rate / a == pytest.approx(damped)
            free = sigma(config, room / (5.0 * rate))  # D = 5: the rate stays R while t <= 25
            expected = a * min(1.0, 5.0 / math.sqrt(t))
            assert schedules.local_eta(config, t, free, d, 10) == pytest.approx(expected)
    for t in (1, 2, 5, 50):
        assert schedules.local_eta(network, t, None, d, 10) == network.scale  # DP-SGD's constant rate
        assert schedules.local_eta(logistic, t, None, d, 10) == schedules.eta(t, logistic.scale)
    given = dataclasses.replace(network, prox_scale=7.0)
    for t in (1, 4, 9):
        for r in (0.01, 0.5, 5.0):
            assert schedules.local_eta(given, t, sigma(given, r), d, 10) == schedules.eta(t, 7.0)


class _FirstStep(Exception):
    """Raised by the recording step rule: r is known at the first local step, and nothing after it runs."""


def _noise_ratios(monkeypatch: pytest.MonkeyPatch, setting: str, eps: list[float],
                  data_dirs: dict[str, Path] | None = None) -> dict[float, tuple[float, float]]:
    """(r, noise scale) of the first local step of DP-IADMM's defaults on a model study setting at each
    whole-run eps: r = sigma sqrt(d) P / C from the scale and parameter count the engine hands the step rule,
    as :func:`dpadmm.iadmm.schedules.noise_damping` reads them."""
    dirs = {"mnist_dir": "", "femnist_dir": "", "data_root": None} | {k: str(v) for k, v in
                                                                       (data_dirs or {}).items()}
    ctx = compare_dp.load_context(setting, argparse.Namespace(**dirs), Path())
    seen: dict[float, tuple[float, float]] = {}

    def recording(config: RunConfig, t: int, noise_scale: torch.Tensor | None, num_params: int,
                  classes: int) -> float:
        seen[config.target_epsilon] = (schedules.noise_ratio(config, noise_scale, num_params),
                                       float(noise_scale.mean()))
        raise _FirstStep

    monkeypatch.setattr(schedules, "local_eta", recording)
    for e in eps:
        with pytest.raises(_FirstStep):
            engine.run(compare_dp.iadmm_config(ctx, {"defaults": 1}, e), dataset=ctx.data, write=False,
                       progress=False)
    return seen


def test_the_noise_ratios_the_pages_give_on_the_main_jobs_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """The r of each model the family page and :func:`schedules.noise_damping` give on the main job's data
    (10 agents of 400 images, T = 10, E = 10, q = 0.2, C = 1), recomputed from what the engine's first step
    sees; the LEAF CNN's from the same calibrated scale (a network's noise scale does not depend on its
    size) and its parameter count."""
    page, rule = words((ROOT / "docs" / "families" / "iadmm.md").read_text()), words(
        schedules.noise_damping.__doc__ or "")
    eps = [8.0, 4.0, 2.0, 1.0]
    logistic, cnn, mlp = (_noise_ratios(monkeypatch, f"main/{model}", eps)
                          for model in ("logistic", "small-cnn", "mlp"))
    assert {e: s for e, (_, s) in cnn.items()} == {e: s for e, (_, s) in mlp.items()}
    leaf = cnn[8.0][1] * math.sqrt(sum(p.numel() for p in build_model("cnn", 784, 10).parameters())) * 10
    assert (f"r is {', '.join(f'{logistic[e][0]:.1f}' for e in eps[:3])} and {logistic[1.0][0]:.1f} for "
            f"logistic regression at eps 8, 4, 2 and 1") in page
    assert (f"{cnn[8.0][0]:.1f} and {cnn[2.0][0]:.1f} for the small CNN at eps 8 and 2, {mlp[8.0][0]:.1f} "
            f"and {mlp[2.0][0]:.1f} for the MLP, and {leaf:.0f} for the LEAF CNN") in page
    room = RunConfig(model="cnn").noise_room_for(0)
    assert f"LEAF CNN (r = {leaf:.0f}, rule rate {room / leaf:.2f})" in page
    assert f"(r from {logistic[8.0][0]:.1f} at eps 8 to {logistic[1.0][0]:.1f} at eps 1)" in rule
    assert f"(r {cnn[8.0][0]:.1f} at eps 8 to {cnn[1.0][0]:.0f} at eps 1)" in rule
    assert f"(r {mlp[8.0][0]:.1f} to {mlp[1.0][0]:.0f})" in rule
    assert f"the LEAF CNN (r {leaf:.0f})" in rule


@pytest.mark.slow  # about 30 s: full MNIST's and FEMNIST's first gradients
def test_the_noise_ratios_the_pages_give_on_full_mnist_and_femnist(
        monkeypatch: pytest.MonkeyPatch, mnist_dir: Path, femnist_dir: Path) -> None:
    """Full MNIST's r for the small CNN and logistic regression (10 agents of 6,000 images) and FEMNIST's for
    logistic regression (195 writers, 62 classes), as the family page and the step rule's docstrings give
    them."""
    page = words((ROOT / "docs" / "families" / "iadmm.md").read_text())
    rule, decay = (words(f.__doc__ or "") for f in (schedules.noise_damping, schedules.local_eta))
    mnist = _noise_ratios(monkeypatch, "mnist/small-cnn", [8.0, 2.0, 1.0], {"mnist_dir": mnist_dir})
    linear = _noise_ratios(monkeypatch, "mnist/logistic", [8.0, 4.0, 2.0, 1.0], {"mnist_dir": mnist_dir})
    assert max(linear.values()) == linear[1.0]
    assert f"there (r = {linear[1.0][0]:.2f} at eps 1, less at larger eps)" in decay
    assert page.count(f"(r = {linear[1.0][0]:.2f} at eps 1 and less above)") == 2
    # "stays for all ten rounds at eps 4 and 8, for the first eight at eps 2 and the first two at eps 1":
    # while sqrt(t) <= D = room / (R r)
    config = RunConfig(num_agents=10)  # R = a C / ((1 + LOGISTIC_RATE_SHARE) P), as noise_damping reads it
    rate = config.scale * config.clip_norm / ((1 + LOGISTIC_RATE_SHARE) * config.num_agents)
    allowance = {e: config.noise_room_for(10) / (rate * r) for e, (r, _) in linear.items()}
    assert min(allowance[e] for e in (4.0, 8.0)) >= math.sqrt(10)
    assert [math.floor(allowance[e] ** 2) for e in (2.0, 1.0)] == [8, 2]
    assert ("stays for all ten rounds at eps 4 and 8, for the first eight at eps 2 and the first two at eps 1"
            in page)
    femnist = _noise_ratios(monkeypatch, "femnist/logistic", [8.0, 1.0], {"femnist_dir": femnist_dir})
    assert f"r = {mnist[1.0][0]:.2f} at eps 1 and {mnist[8.0][0]:.2f} at eps 8 for the small CNN" in page
    assert f"(r = {mnist[8.0][0]:.2f} at eps 8)" in page
    assert f"r is {mnist[2.0][0]:.2f} at eps 2" in decay and f"(r = {mnist[1.0][0]:.2f})" in decay
    assert f"({femnist[8.0][0]:.0f} to {femnist[1.0][0]:.0f} on FEMNIST)" in page
    assert f"r from {femnist[8.0][0]:.0f} at eps 8 to {femnist[1.0][0]:.0f} at eps 1" in rule
