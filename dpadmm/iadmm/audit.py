"""DP-IADMM's audit: an attack on one released local step, with the code that trains.

The ledger composes releases of one kind: one local step of the objective perturbation (003 eq. (8), 000
eq. (9) for ObjT; Laplace or Gaussian noise, each step on a Poisson sample at rate q or on all the data) or
one OutP output. The attacker of the ledger's threat model (the server, or anyone who sees what an agent
sends) knows everything but the noise: the model w, lambda_p, rho, eta, z^{t,e} and the two candidate data
sets. It sees the release z^{t+1}_p of round t = 1 with E = 1 (z^{1,1} = w = lambda = 0, so every step's
output is an affine image of g + noise) and tests it (:func:`dpadmm.privacy.audit.release_audit`).

Each trial is another agent id of :func:`dpadmm.iadmm.local.agent_round` itself, so the draws are the real
keyed noise and sampling streams and the clipping is the real clipping. The neighbours are the worst case of
the configuration's relation, on a canary sample with a feature of magnitude far above the clip norm (its
clipped term has the norm C, the largest change clipping allows) and other samples of zero features (no
term of their own):

* ``add-remove``: D holds the canary, D' does not; the normaliser I (the public sample count, a node's
  ``num-samples-total``) is the same for both, as the ledger's C/(qI) assumes. A second pair adds the canary
  to a crowd of samples whose clipped terms oppose it: the real code leaves the crowd's sum as it is, but a
  normaliser that followed the realised Poisson sample would move the crowd's mean too. Each pair is tested
  at alpha / 2 and the larger bound kept.
* ``replace-one``: the canary's label is flipped: its clipped term turns around (2C/I).
* the papers' data-dependent scale (eq. (9b), not covered): D holds faint samples, so its own scale is tiny,
  and D' replaces one with a bright, misclassified one whose scale and gradient are large.
* OutP (replace-one): the canary's term at the norm c1 = I_p that OutP's sensitivity assumes, flipped.

:func:`one_run` audits a whole run instead, from one run with canaries (Steinke, Nasr & Jagielski 2023).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dpadmm.iadmm import privacy
from dpadmm.iadmm.config import RunConfig
from dpadmm.iadmm.local import LocalResult, agent_round
from dpadmm.models.logistic import AgentData
from dpadmm.privacy.audit import ALPHA, AuditResult, counted, one_run_result, release_audit, shown
from dpadmm.privacy.ledger import single_release

Release = Callable[..., LocalResult]  # agent_round's signature: what the tests' broken variants replace
CHUNK = 1 << 18  # trials per call of the release: their data and noise stay within a few hundred MB
CANARIES = 2000  # candidate samples of the one-run audit (its data is [about CANARIES / 2, CANARIES])
CROWD = 100  # samples of the crowd design (add-remove), the canary included
FEATURES = 2  # the canary's feature and one that no sample uses: the noise of a coordinate without signal


def claim(config: RunConfig) -> tuple[float, float]:
    """(epsilon, delta) the ledger states for one release of ``config``: pure eps-bar for unsampled Laplace
    noise, else the ledger's per-step epsilon at its delta."""
    release, _ = privacy.release_of(config)
    if release.mechanism == "laplace" and release.sampling == 1:
        return single_release(release, 0.0), 0.0
    return privacy.ledger(config).per_step.epsilon_pld, config.delta


Design = tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor], str]


def neighbours(config: RunConfig, samples: int) -> list[Design]:
    """The attack's pairs (D, D', the pair in words) for ``config``: features [I, FEATURES] and labels [I]."""
    x = torch.zeros(samples, FEATURES, dtype=torch.float64)
    labels = torch.zeros(samples, dtype=torch.long)
    # at z = 0 with two classes, h - y = (-1/2, 1/2): the term x (h - y)^T has L1 norm ||x||_1 and L2 norm
    # ||x||_2 / sqrt(2); label 1 turns it around
    if config.algorithm == "outp":  # OutP's c1 = I_p: the largest term its sensitivity allows
        x[0, 0] = math.sqrt(2.0) * samples
        return [_flipped(x, labels, "the canary's term at norm c1 = I_p, its label flipped")]
    if not config.clipped:  # the papers' eq. (9b): the scale follows the data
        faint, bright = 1e-2, 1e2
        x[:, 0] = faint
        x_prime, flipped = x.clone(), labels.clone()
        x_prime[0, 0], flipped[0] = bright, 1
        return [((x, labels), (x_prime, flipped), "faint samples against one replaced by a bright, "
                 "misclassified one (eq. (9b)'s scale follows it)")]
    x[0, 0] = 4.0 * config.clip_norm  # clipped to norm C in either norm
    if config.neighbouring == "replace-one":
        return [_flipped(x, labels, "the canary's label flipped (its clipped term turns around)")]
    # The canary alone (the others add no term) is the tightest pair for the mechanism the ledger
    # describes. Against a large crowd whose clipped terms oppose it, a normaliser that followed the realised
    # sample would move the crowd's mean by about 2C/(qI) too (the real one leaves the crowd's sum as it is).
    crowd_x = torch.zeros(CROWD, FEATURES, dtype=torch.float64)
    crowd_labels = torch.ones(CROWD, dtype=torch.long)
    crowd_x[:, 0], crowd_labels[0] = 4.0 * config.clip_norm, 0
    return [((x, labels), (x[1:].clone(), labels[1:].clone()), "the canary (clipped to C) added or removed"),
            ((crowd_x, crowd_labels), (crowd_x[1:].clone(), crowd_labels[1:].clone()),
             "the canary added to or removed from a crowd of opposed samples")]


def _flipped(x: torch.Tensor, labels: torch.Tensor, words: str) -> Design:
    """D and D' that differ in the label of sample 0 only."""
    flipped = labels.clone()
    flipped[0] = 1
    return (x, labels), (x.clone(), flipped), words


def releases(config: RunConfig, x: torch.Tensor, labels: torch.Tensor, total: int, first_agent: int,
             trials: int, release: Release = agent_round) -> np.ndarray:
    """``trials`` releases z^{2}_p of round 1 on the data set (x, labels), one per agent id from
    ``first_agent``: [trials, FEATURES * 2]."""
    one = AgentData.from_blocks([x], [labels], num_classes=2, total=total, agents=[0])
    out = np.empty((trials, FEATURES * 2))
    for start in range(0, trials, CHUNK):
        count = min(CHUNK, trials - start)
        # the same data set for every trial (views, not copies); each trial has its own keyed streams
        data = AgentData(x=one.x.expand(count, -1, -1), y=one.y.expand(count, -1, -1),
                         counts=one.counts.expand(count), x_l1=one.x_l1.expand(count, -1),
                         x_l2=one.x_l2.expand(count, -1),
                         agents=torch.arange(first_agent + start, first_agent + start + count), total=total)
        zeros = torch.zeros((count, FEATURES, 2), dtype=torch.float64)
        w = torch.zeros(FEATURES, 2, dtype=torch.float64)
        out[start:start + count] = release(config, data, w, zeros, zeros, 1).z_sent.reshape(count, -1).numpy()
    return out


def audit(config: RunConfig, trials: int = 200_000, alpha: float = ALPHA, samples: int = 10,
          release: Release = agent_round) -> AuditResult:
    """Lower-bound the epsilon of one release of ``config`` (calibrated first where it has a target) with
    ``trials`` releases on each neighbour of each pair of :func:`neighbours`, and set the largest bound beside
    the ledger's claim."""
    began = time.perf_counter()
    config = privacy.calibrate(config)
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with epsilon={config.epsilon!r} adds no noise: "
                         "there is no privacy claim to audit")
    if config.model != "logistic":
        raise ValueError(f"model={config.model!r} is not audited; the attack runs on the logistic model, "
                         "whose release is the same mechanism (clipping and noise do not depend on it)")
    # one local step: every step of a run is this release, at other inputs
    config = dataclasses.replace(config, local_steps=1 if config.algorithm == "objpm" else 0, num_agents=1,
                                 target_epsilon=0.0)
    epsilon, delta = claim(config)
    statistic = "laplace" if config.mechanism == "laplace" and config.algorithm != "outp" else "projection"
    designs = neighbours(config, samples)
    found: list[tuple[float, dict[str, Any], str]] = []
    for i, ((x, labels), (x_prime, labels_prime), attack) in enumerate(designs):
        first = 2 * i * trials  # every release of the audit from agent ids of its own
        total = x.shape[0]  # the public count I, the same for D and D'
        outputs = releases(config, x, labels, total, first, trials, release)
        outputs_prime = releases(config, x_prime, labels_prime, total, first + trials, trials, release)
        # each pair at alpha / (pairs): the largest bound holds at alpha (Bonferroni)
        found.append((*release_audit(outputs, outputs_prime, statistic, delta, alpha / len(designs)), attack))
    bound, detail, attack = max(found, key=lambda f: f[0])
    mechanism = "gaussian" if config.algorithm == "outp" else config.mechanism
    sampled = f", Poisson q = {config.sampling_rate:g}" if config.sampling_rate < 1 else ""
    calibration = "OutP" if config.algorithm == "outp" else config.sensitivity
    kind = (f"{config.algorithm} local step ({mechanism}{sampled}, {calibration} sensitivity, "
            f"{config.neighbouring})")
    return AuditResult(kind=kind, claim=epsilon, delta=delta, bound=bound, trials=trials,
                       seconds=time.perf_counter() - began, alpha=alpha, attack=attack, detail=detail)


def one_run(config: RunConfig, canaries: int = CANARIES, alpha: float = ALPHA, seed: int = 0) -> AuditResult:
    """Lower-bound the epsilon of a whole run of ``config`` from one run (Steinke, Nasr & Jagielski 2023).

    One agent holds ``canaries`` candidate samples, each in its data with probability 1/2 (a keyed draw of
    ``seed``): sample j has the feature e_j at magnitude far above the clip norm and label 0, so that its
    clipped term lies in row j of the gradient alone (a Dirac canary: no two interact). The run is the
    engine's round (:func:`dpadmm.iadmm.engine.step`), T rounds of the configured E steps, with the
    normaliser I the public count ``canaries``. The attacker is the server, who sees z_p after every round:
    canary j's score is the sum over the rounds of z_p[j, 0] - z_p[j, 1], which its term raises each step
    that samples it. The claim is the ledger's whole-run epsilon at its delta.
    """
    from dpadmm.iadmm import engine

    began = time.perf_counter()
    config = privacy.calibrate(config)
    if not config.private or config.model != "logistic":
        raise ValueError(f"algorithm={config.algorithm!r}, model={config.model!r}: the one-run audit needs a "
                         "private run of the logistic model")
    config = dataclasses.replace(config, num_agents=1, target_epsilon=0.0, fraction_train=1.0)
    run = privacy.ledger(config).whole_run
    included = torch.rand(canaries, generator=torch.Generator().manual_seed(seed)) < 0.5
    rows = torch.nonzero(included).flatten()
    x = torch.zeros(max(len(rows), 1), canaries, dtype=torch.float64)
    x[torch.arange(len(rows)), rows] = 4.0 * config.clip_norm  # clipped to norm C in either norm
    labels = torch.zeros(x.shape[0], dtype=torch.long)
    data = AgentData.from_blocks([x], [labels], num_classes=2, total=canaries, agents=[0])
    zeros = torch.zeros((1, 1, canaries, 2), dtype=torch.float64)
    state = engine.EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(),
                               lam=zeros.clone())
    scores = torch.zeros(canaries, dtype=torch.float64)
    for t in shown(config.rounds, "round"):
        engine.step(config, data, state, t)
        scores += state.z[0, 0, :, 0] - state.z[0, 0, :, 1]
    length = f"{counted(config.rounds, 'round')} of {counted(config.steps, 'step')}"
    return one_run_result(f"{config.algorithm} whole run ({length})", scores.numpy(), included.numpy(),
                          run.epsilon_pld, run.delta, began, alpha,
                          attack="Dirac canaries, each in the agent's data with probability 1/2; the "
                                 "server's score: the sum of z_p[j, 0] - z_p[j, 1] over the rounds")


def audits(config: RunConfig, trials: int = 200_000, alpha: float = ALPHA) -> list[AuditResult]:
    """Every audited kind of release of ``config`` (``dpadmm audit``): its local step and the whole run."""
    return [audit(config, trials, alpha), one_run(config, alpha=alpha)]
