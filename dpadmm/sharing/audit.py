"""001's audit: an attack on one party's noisy message of one round (Theorem 3's Gaussian release).

Each round party m sends D_m x_m plus N(0, sigma^2 I_N) (``noise = message``), with sigma from Theorem 3 for
the sensitivity C = 2 b sqrt(N) of any change of its block (unit rows, ||x_m|| <= b;
:mod:`dpadmm.sharing.privacy`). The attacker is everyone who sees the messages, the server included: it knows
the broadcast s - z and y, the party's previous message and the two candidate blocks, and runs the party's
step itself. The release is :func:`dpadmm.sharing.engine.party_step`, the x-step of eq. (6) and the keyed
noise, with each trial another seed.

The neighbours: the broadcast pulls every score towards +R, so the x-step on a block whose rows are all e_1
sends b (1, ..., 1), the largest message; the replacing block's rows alternate e_1 and -e_1, whose messages
x_1 (1, -1, 1, ...) are orthogonal to that pull, so it sends 0. The messages differ by b sqrt(N), half of C:
C lets every score swing from +b to -b, but the x-step projects one shared target onto the block's set of
messages, and no replacement of the block sends the opposite of the pull. The audit can therefore reach
about half of the claimed epsilon, and the page says so. With ``noise = paper`` (eq. (16), not covered) the
noise lies in the block's column space, which the two blocks do not share: the audit shows how far from a
guarantee that is.

:func:`one_run` audits a whole run instead, from one run with canaries (Steinke, Nasr & Jagielski 2023). The
privacy unit of 001 is a party's block, so the canaries are parties: M of them, each holding the block on D
or its replacement on D' with probability 1/2. The run is DP in each party's block at the ledger's whole-run
(epsilon, delta): each party's messages are DP in its own block, and everything else released depends on
that block only through them (the other parties' x-steps read the broadcast, the server's z and y the sum).
In a run the x-step is driven by the party's own last noisy message (its noise, sigma >> b, dominates the
target), so nearly every message sits on the ball, +-b (1, ..., 1) for the block of rows e_1 and
+-b (1, -1, ...) for the replacement, with a sign that the attacker, who sees that last message, predicts:
they differ by b sqrt(2N), 0.71 C, in each round after the first.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from dpadmm.privacy.audit import ALPHA, AuditResult, counted, one_run_result, release_audit, shown
from dpadmm.sharing import engine, privacy
from dpadmm.sharing.config import SharingConfig

PartyStep = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # engine.party_step's signature
SAMPLES = 16  # N, the rows (an even count: the alternating block's messages are orthogonal to the pull)
WIDTH = 2  # d_m, the party's columns
PULL = 10.0  # R, in units of b: how far the broadcast pulls every score
CHUNK = 1 << 14  # seeds (trials) per call of the party step
ROUND = 1
CANARIES = 2000  # canary parties of the one-run audit


def blocks() -> tuple[torch.Tensor, torch.Tensor]:
    """The party's block on D (every row e_1) and on D' (rows e_1 and -e_1 alternating), [N, WIDTH]."""
    block = torch.zeros(SAMPLES, WIDTH, dtype=torch.float64)
    block[:, 0] = 1.0
    replaced = block.clone()
    replaced[1::2, 0] = -1.0
    return block, replaced


def releases(config: SharingConfig, block: torch.Tensor, first_seed: int, trials: int,
             party_step: PartyStep = engine.party_step) -> np.ndarray:
    """``trials`` messages of round 1 of the party holding ``block``, one per seed from ``first_seed``:
    [trials, N]."""
    parties = engine.parties_from_blocks([block], [block], [0])
    std = privacy.noise_std(config, SAMPLES)
    rho = config.penalty(SAMPLES)
    out = np.empty((trials, SAMPLES))
    for batch in shown(-(-trials // CHUNK), f"batch of {CHUNK} trials"):  # 10^7 trials take about 40 minutes
        start = (batch - 1) * CHUNK
        count = min(CHUNK, trials - start)
        seeds = list(range(first_seed + start, first_seed + start + count))
        # the broadcast s - z = -R b 1 (so that the target r = own - (s - z) = R b 1), y = 0, the party's
        # previous message 0 (the start)
        pulled = torch.full((count, SAMPLES), -PULL * config.x_bound, dtype=torch.float64)
        own = torch.zeros(count, 1, SAMPLES, dtype=torch.float64)
        y = torch.zeros(count, SAMPLES, dtype=torch.float64)
        _, messages = party_step(parties, pulled, own, y, config, rho, seeds, ROUND, std)
        out[start:start + count] = messages[:, 0].numpy()
    return out


def audit(config: SharingConfig, trials: int = 200_000, alpha: float = ALPHA,
          party_step: PartyStep = engine.party_step) -> AuditResult:
    """Lower-bound the epsilon of one message of ``config`` (N = :data:`SAMPLES` rows) and set it beside the
    ledger's epsilon for one release (its ``per_step``, at the configured delta)."""
    began = time.perf_counter()
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with epsilon=inf adds no noise: there is no "
                         "privacy claim to audit")
    step = privacy.ledger(config, SAMPLES).per_step
    block, replaced = blocks()
    outputs = releases(config, block, 0, trials, party_step)
    outputs_prime = releases(config, replaced, trials, trials, party_step)
    bound, detail = release_audit(outputs, outputs_prime, "projection", step.delta, alpha)
    covered = "" if config.noise == "message" else ", NOT COVERED"
    return AuditResult(kind=f"{config.algorithm} party message of one round (gaussian, {config.noise} "
                            f"noise{covered})",
                       claim=step.epsilon_pld, delta=step.delta, bound=bound, trials=trials,
                       seconds=time.perf_counter() - began, alpha=alpha,
                       attack="the party's block replaced: rows e_1 against rows +-e_1 alternating, under a "
                              "broadcast that pulls every score up",
                       detail=detail)


def canary_problem(included: torch.Tensor) -> engine.Problem:
    """One canary party per flag, holding the block of :func:`blocks` on D where it is set and the replacing
    block where it is not (as test block too); N = :data:`SAMPLES` rows, all labelled +1."""
    block, replaced = blocks()
    held = [block if flag else replaced for flag in included.tolist()]
    parties = engine.parties_from_blocks(held, held, list(range(len(held))))
    labels = torch.ones(SAMPLES, dtype=torch.float64)
    return engine.Problem(name="canaries", widths=(WIDTH,) * len(held), parties=parties, labels=labels,
                          test_labels=labels.clone())


def one_run(config: SharingConfig, canaries: int = CANARIES, alpha: float = ALPHA, seed: int = 0
            ) -> AuditResult:
    """Lower-bound the epsilon of a whole run of ``config`` from one run (Steinke, Nasr & Jagielski 2023).

    ``canaries`` parties, each holding the block of rows e_1 (D) with probability 1/2 (a keyed draw of
    ``seed``) and else the block of rows +-e_1 alternating (D'), neighbours under 001's relation (a party's
    block replaced); N = :data:`SAMPLES`, labels +1. A whole run is DP in each party's block at the ledger's
    whole-run (epsilon, delta): a party's messages are DP in its block, and the other parties' messages,
    z and y depend on it only through them (post-processing). The run is the engine's round
    (:func:`dpadmm.sharing.engine.iterate`) with the engine's sigma, T rounds from the paper's start.

    The attacker is the server, who sees every message and the broadcast: before round t it knows s - z, y
    and each party's last message, so it runs the party's step (:func:`dpadmm.sharing.engine.party_step`,
    no noise) on both candidate blocks and gets both means, mu and mu', of the message it will see. Canary
    j's score is the sum over the rounds of <message - (mu + mu') / 2, mu - mu'>, the log-likelihood ratio
    of its messages (times sigma^2) under Gaussian noise of one scale: the most powerful test of each round,
    which adapts to the sign that the party's own last noise gives its x-step. With ``noise = paper`` (not
    covered) a message lies in its block's column space, noise and all, and the score is instead how much
    farther it lies from the replacing block's column space than from the block's. The claim is the
    ledger's whole-run epsilon at its delta.
    """
    began = time.perf_counter()
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with epsilon=inf adds no noise: there is no "
                         "privacy claim to audit")
    run = privacy.ledger(config, SAMPLES).whole_run
    std = privacy.noise_std(config, SAMPLES)
    included = torch.rand(canaries, generator=torch.Generator().manual_seed(seed)) < 0.5
    problem = canary_problem(included)
    block, replaced = blocks()
    ids = list(range(canaries))
    hypotheses = [engine.parties_from_blocks([b] * canaries, [b] * canaries, ids) for b in (block, replaced)]
    rho = config.penalty(SAMPLES)
    state = engine.initial_state(problem, 1)
    scores = torch.zeros(canaries, dtype=torch.float64)
    for t in shown(config.rounds, "round"):
        # what the server broadcast before round t (as engine.iterate computes it) and the two candidates'
        # noiseless messages, [M, N] each
        pulled = state.messages.sum(dim=1) - state.z
        mu, mu_prime = (engine.party_step(h, pulled, state.messages, state.y, config, rho, [seed], t,
                                          0.0)[1][0] for h in hypotheses)
        state = engine.iterate(problem, state, config, [seed], t, std)
        sent = state.messages[0]
        if config.noise == "message":
            scores += ((sent - (mu + mu_prime) / 2) * (mu - mu_prime)).sum(dim=-1)
        else:
            scores += _residual(replaced, sent) - _residual(block, sent)
    covered = "" if config.noise == "message" else ", NOT COVERED"
    length = counted(config.rounds, "round")
    return one_run_result(f"{config.algorithm} whole run ({length}, {config.noise} noise{covered})",
                          scores.numpy(), included.numpy(), run.epsilon_pld, run.delta, began, alpha,
                          attack="canary parties, each holding rows e_1 (else rows +-e_1 alternating) with "
                                 "probability 1/2; the server's score: the summed log-likelihood ratio of "
                                 "each party's messages, from its step run on both blocks")


def _residual(block: torch.Tensor, messages: torch.Tensor) -> torch.Tensor:
    """The squared distance of each message [M, N] from the column space of ``block`` [N, d], [M]."""
    u, singular, _ = torch.linalg.svd(block, full_matrices=False)
    basis = u[:, singular > 1e-9 * singular.max()]
    return messages.square().sum(dim=-1) - (messages @ basis).square().sum(dim=-1)


def audits(config: SharingConfig, trials: int = 200_000, alpha: float = ALPHA) -> list[AuditResult]:
    """Every audited kind of release of ``config`` (``dpadmm audit``): the party's message and the whole
    run."""
    return [audit(config, trials, alpha), one_run(config, alpha=alpha)]
