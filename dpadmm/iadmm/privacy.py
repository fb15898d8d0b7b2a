"""DP-IADMM's privacy: the releases of one agent under a :class:`RunConfig`, for the shared ledger.

Theorem 1 of 003 makes one local iterate z^{t,e+1} eps-bar-DP. A round releases the average
of E such iterates (post-processing of E releases), and a run releases T rounds, so the
whole run is the composition of E*T Laplace mechanisms per agent (T Gaussian ones for OutP);
with Poisson subsampling at rate q each is the subsampled mechanism (add-remove neighbours).
This module turns a configuration into that :class:`~dpadmm.privacy.ledger.Release` and its
counts, says in words what the ledger covers (the calibration, the neighbouring relation,
whether the sensitivity is a bound or computed from the data), and calibrates eps-bar for a
whole-run target.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

from dpadmm.iadmm.calibration import calibrated_epsilon, release_of
from dpadmm.iadmm.config import RunConfig
from dpadmm.privacy.device import RunCost, RunRequest, config_digest
from dpadmm.privacy.ledger import (
    Ledger,
    clipped_sensitivity,
    composed_epsilon,
    single_release,
)
from dpadmm.privacy.ledger import ledger as account


def ledger(config: RunConfig, rounds: int | None = None, total_samples: int | None = None) -> Ledger:
    """The ledger of one agent that took part in ``rounds`` rounds (default: all of them).

    ``total_samples`` (I) makes the clipped sensitivity and scale numbers; the epsilons do not
    depend on it. Raises ValueError for a non-private configuration, which releases without noise.
    A configuration with ``target-epsilon`` is calibrated first (:func:`calibrate`), as every agent
    calibrates it: the statement is about the noise the agents add, whoever forgot to calibrate.
    """
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with epsilon={config.epsilon!r} adds no noise: "
                         "it is not differentially private")
    config = calibrate(config)
    rounds = config.rounds if rounds is None else rounds
    release, per_round = release_of(config)
    mechanism, multiplier = release.mechanism, release.noise_multiplier
    if config.algorithm == "outp":
        calibration, covered = "OutP (Huang et al.)", True
        sens = "L2: 2 c1 / (I_p (rho^t + 1/eta^t)), c1 = I_p (changes with t)"
        scale = f"sigma^t = {multiplier:.4g} x Delta_2^t"
        note = ("OutP's Gaussian sensitivity 2c1/(I_p (rho + 1/eta)) with c1 = I_p holds while every "
                "per-sample gradient has L2 norm <= I_p (MNIST: <= 40).")
    elif config.sensitivity == "clipped":
        calibration, covered = "clipped", True
        q = config.sampling_rate
        form = "2C/I" if config.neighbouring == "replace-one" else ("C/I" if q == 1 else "C/(qI)")
        norm = config.clip_norm_type.upper()
        # Laplace: b = Delta / eps-bar (pure eps-bar per step); Gaussian: sigma = Delta x the noise
        # multiplier, whose inverse is no epsilon (the per-step epsilon at delta is the ledger's)
        scale_name = "b = Delta / eps-bar" if mechanism == "laplace" else f"sigma = Delta x {multiplier:.4g}"
        batch = " x I_p / B_p" if config.batch_size else ""  # minibatches of B_p = min(B, I_p) samples
        if total_samples:
            value = clipped_sensitivity(config.clip_norm, total_samples, config.neighbouring, q)
            sens = (f"{norm}: {form}{batch} = {value:.6g}{batch} "
                    f"(C = {config.clip_norm:g}, I = {total_samples} samples of all agents"
                    f"{f', q = {q:g}' if q < 1 else ''})")
            scale = f"{scale_name} = {value / config.epsilon:.6g}{batch}"
        else:
            sens = f"{norm}: {form}{batch} (C = {config.clip_norm:g}{f', q = {q:g}' if q < 1 else ''})"
            scale = scale_name
        note = (f"Per-sample gradients clipped to {norm} norm {config.clip_norm:g}: Delta = {form}{batch} "
                "bounds every step whatever the data, and the step's output depends on the data only "
                "through g + noise, so "
                + ("Theorem 1 of 003 applies as stated." if mechanism == "laplace" else
                   f"each step is the Gaussian mechanism (noise multiplier sigma / Delta = {multiplier:.4g}) "
                   "followed by post-processing.")
                + (f" Minibatches of B = {config.batch_size} (B_p = min(B, I_p) samples of agent p) are not "
                   "credited with amplification by subsampling." if batch else "")
                + (f" Each step takes each sample independently with probability q = {q:g} and scales the "
                   "clipped sum by 1/(qI): it is the Poisson-subsampled mechanism, and the epsilons above "
                   "credit the amplification (dp-accounting's PoissonSampledDpEvent) for one sample added "
                   "or removed. The samples are drawn like the noise (the randomness line says from what); "
                   "who is taken never depends on the data." if q < 1 else ""))
    else:
        calibration, covered = "data-dependent", False
        sens = "eq. (9b): max_i ||x_i||_1 ||h_i - y_i||_1 / I over the agent's data, each step"
        scale = "b = Delta_p^{t,e} / eps-bar (data-dependent)"
        note = ("NOT COVERED by Theorem 1: the Laplace scale is the papers' eq. (9b), computed from the "
                "agent's own data, so the numbers above are nominal, not guarantees.")
    return account(algorithm=config.algorithm, release=release, per_round=per_round, rounds=rounds,
                   delta=config.delta, epsilon_bar=config.epsilon, calibration=calibration, sensitivity=sens,
                   noise_scale=scale, covered=covered, neighbouring=config.neighbouring, note=note)


@lru_cache(maxsize=64)
def calibrate(config: RunConfig) -> RunConfig:
    """``config`` with ``epsilon`` chosen so that the whole run is ``target-epsilon``-DP at ``delta``.

    Inverts the PLD accountant over the noise multiplier of one release, for the configured
    rounds T and local steps E, before training. Returns ``config`` unchanged when no target
    is set. Raises ValueError when the target is smaller than the smallest achievable value.
    Cached (configurations are frozen): a ClientApp calibrates for every message, and building the
    calibrated configuration checks every key again.
    """
    if not config.target_epsilon:
        return config
    if config.epsilon > 0:  # calibrated already (RunConfig refuses any other eps-bar beside a target)
        return config
    return dataclasses.replace(config, epsilon=calibrated_epsilon(config))


def device_request(config: RunConfig, data: str) -> RunRequest:
    """One DP-IADMM run as the device's ledger event (:mod:`dpadmm.privacy.device`): its cost is the whole
    run's (epsilon, delta) by the PLD accountant, computed on the node from the run config the server sent
    (calibrated there, when it sets ``target-epsilon``; the epsilons do not depend on I); the calibrated
    eps-bar is kept as the run's setting, so that the node calibrates once per run. ``data``: the digest of
    the agent's data.
    Covered: the clipped sensitivity and OutP's; the papers' eq. (9b) is computed from the data."""

    def cost() -> RunCost:  # the ledger's whole-run and per-step epsilons, without its other bounds
        run = calibrate(config)  # its statement is remembered (composed_epsilon): the whole run's is free
        release, per_round = release_of(run)
        whole, _ = composed_epsilon(release, per_round * run.rounds, run.delta)
        step, _ = composed_epsilon(release, 1, run.delta)
        return RunCost(whole, run.delta, release.mechanism, {"epsilon": run.epsilon}, release_epsilon=step)

    covered = config.algorithm == "outp" or config.sensitivity == "clipped"
    return RunRequest(algorithm=config.algorithm, rounds=config.rounds,
                      config=config_digest(config.to_mapping()),
                      data=data, private=config.private, covered=covered, cost=cost,
                      neighbouring=config.neighbouring)


def mechanism_of(config: RunConfig) -> str:
    """What one agent releases under ``config``, in the words a reply states it and a server checks it: the
    noise, its multiplier (noise scale / sensitivity, as calibrated), the sampling rate and the releases per
    round; "none" for a non-private configuration. Two agents that state the same string ran the same
    mechanism, so the server's whole-run statement covers both."""
    if not config.private:
        return "none"
    release, per_round = release_of(calibrate(config))
    return (f"{release.mechanism}, noise multiplier {release.noise_multiplier!r}, sampling "
            f"{release.sampling!r}, {per_round} per round")


def spent(config: RunConfig, rounds: int) -> float:
    """epsilon (PLD, at ``delta``) spent so far by an agent that took part in ``rounds`` rounds.

    ``privacy.json`` is written before a run and assumes the agent takes part in all T
    rounds. With partial participation or dropouts it takes part in fewer; which rounds
    does not depend on its data (the sample is a keyed stream, a dropout is a device
    failure), so composing over the rounds actually taken is a valid account. 0 before the
    first round; inf for a non-private configuration. Calibrated first, as :func:`ledger`.
    """
    if not config.private:
        return math.inf
    if rounds <= 0:
        return 0.0
    release, per_round = release_of(calibrate(config))
    return composed_epsilon(release, per_round * rounds, config.delta)[0]


def headline(ledger: Ledger, test_error: float) -> str:
    """The one line a run ends with: its test error and its whole-run guarantee, with what the guarantee
    is about (the full statement is the ledger's summary)."""
    run = ledger.whole_run
    if not math.isfinite(run.epsilon_pld):  # the method says why
        return (f"test error {test_error:.4f}; privacy of the whole run ({run.releases} releases): "
                f"{run.method}")
    covered = "" if ledger.covered else " (NOT COVERED: data-dependent noise scale, nominal only)"
    return (f"test error {test_error:.4f}; privacy: (eps = {run.epsilon_pld:.3g}, delta = {run.delta:g}) "
            f"for the whole run ({run.releases} releases), {ledger.holder}, neighbouring data sets differ "
            f"in one sample ({ledger.neighbouring}), against everyone who sees what the agent sends, the "
            f"server included{covered}; {ledger.randomness}")


def step_line(config: RunConfig) -> str:
    """How private one local step is, as a run's lines say it: eps-bar for the Laplace mechanism (its pure
    epsilon), the per-step epsilon at delta and the noise multiplier for the Gaussian one (whose
    1/multiplier is no epsilon)."""
    if not config.private:
        return "non-private"
    config = calibrate(config)
    release, _ = release_of(config)
    if release.mechanism == "gaussian":
        epsilon = single_release(release, config.delta)
        return (f"eps = {epsilon:.4g}" if math.isfinite(epsilon) else "no guarantee") + (
            f" at delta = {config.delta:g} per local step, noise multiplier {release.noise_multiplier:.4g}")
    return f"eps-bar = {config.effective_epsilon:.4g} per local step"
