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
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from dpadmm.privacy.audit import ALPHA, AuditResult, release_audit
from dpadmm.sharing import engine, privacy
from dpadmm.sharing.config import SharingConfig

PartyStep = Callable[..., tuple[torch.Tensor, torch.Tensor]]  # engine.party_step's signature
SAMPLES = 16  # N, the rows (an even count: the alternating block's messages are orthogonal to the pull)
WIDTH = 2  # d_m, the party's columns
PULL = 10.0  # R, in units of b: how far the broadcast pulls every score
CHUNK = 1 << 14  # seeds (trials) per call of the party step
ROUND = 1


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
    for start in range(0, trials, CHUNK):
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


def audits(config: SharingConfig, trials: int = 200_000, alpha: float = ALPHA) -> list[AuditResult]:
    """Every audited kind of release of ``config`` (``dpadmm audit``): the party's message."""
    return [audit(config, trials, alpha)]
