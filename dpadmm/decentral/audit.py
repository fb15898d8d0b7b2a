"""004's audit: an attack on one exchanged iterate x_i^k (Theorem 2.2's mechanism), by colluding agents.

The a-priori guarantee (:mod:`dpadmm.decentral.privacy`) prices the k-th release of agent i at
d alpha_k beta_k B, pure, against all other agents colluding: they see every exchanged iterate, so they know
x^{k-1} (every agent's), the duals and the graph, and everything of agent i but its data, its aggregation
weights and its noise. Here they attack iteration k = 1 of agent 0 with the engine's own
:func:`dpadmm.decentral.engine.release` (its weights, its update, its keyed Laplace noise), on three agents of
a complete graph, each trial another key (seed, agent): one run holds :data:`GROUPS` disjoint triangles, so
one batched call draws many trials (one triangle where an update reads beyond the agent's neighbours).

The neighbours (one of agent 0's samples replaced). A sample enters the gradient as u = L z (label times
row), with term -sigma(-x^T u) u / b, so a replacement moves the gradient by at most 2/b per coordinate where
|z_l| <= 1 (B = 2/b, the bound the statement uses). With x_i^{k-1} = -M e_d, the last coordinate drives both
margins: u = (1, ..., 1) against u' = (-1, ..., -1, 1) moves every other coordinate by 2/b, an L1 change of
2 (d - 1) / b, (d - 1)/d of what d B allows. Rows of unit L2 norm, which the Adult loader gives, move the
gradient less (by at most 2 sqrt(d) / b in L1): the statement's B is a per-coordinate bound, and the attack
uses rows at that bound, where the statement is tightest.

With ``weights = fixed`` Term A is one point and the release is the gradient's image plus Laplace noise: the
attack can come close to the claim. With ``weights = random`` Term A is uniform on the interval between the
agent's iterate and its neighbours' mean; two designs are attacked: the neighbour at the agent's iterate (the
interval is a point, the a-priori worst case) and the neighbour away from it, where the random weights
amplify, and the audit's bound is set beside the mean ex-post loss of eq. (10) of the releases it saw (a
diagnostic that depends on the agent's data, not a bound: eq. (10) needs the agent's true
gradient).

:func:`one_run` audits a whole run instead, from one run with canaries (Steinke, Nasr & Jagielski 2023): the
colluding agents see every exchanged iterate.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dpadmm.decentral import engine, privacy
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import Agents
from dpadmm.privacy.audit import ALPHA, AuditResult, counted, one_run_result, release_audit, shown
from dpadmm.privacy.secure import laplace_epsilon_cost

Release = Callable[..., tuple[torch.Tensor, Any]]  # engine.release's signature: what broken variants replace
CANARIES = 2000  # attacked agents of the one-run audit, each holding the canary with probability 1/2
CHUNK = 1 << 14  # trials per call of the release
GROUPS = 32  # disjoint triangles per run: more share one keyed draw per seed, fewer keep the graph small
MARGIN = 40.0  # M: sigma(40) = 1 - 4e-18, the margins' driving coordinate
SPREAD = 4.0  # how far the neighbour sits from the agent in the amplified design, in noise scales
ITERATION = 1
AGENTS = 3  # agent 0 under attack, two colluding neighbours, the complete graph (the fewest a run allows)


def rows(config: DecentralConfig, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Agent 0's samples on D and on D', [b, d] each, labels +1: the canary first, u = (1, ..., 1) on D and
    (-1, ..., -1, 1) on D', the other samples zero rows (a zero row adds no gradient)."""
    features = torch.zeros(config.samples, d, dtype=torch.float64)
    features[0] = 1.0
    features_prime = features.clone()
    features_prime[0, :-1] = -1.0
    return features, features_prime


def groups(config: DecentralConfig) -> int:
    """How many disjoint copies of the three agents one run (seed) holds: agent AGENTS j of each copy j is
    attacked, with its own key (seed, agent), so a run gives that many trials. One copy where an update
    reads beyond an agent's neighbours (DGD's global average, Algorithm 3's sum of all iterates)."""
    return 1 if config.algorithm == "ldp-dgd" or config.exchange == "secret" else GROUPS


def releases(config: DecentralConfig, features: torch.Tensor, start: torch.Tensor, first_seed: int,
             trials: int, release: Release = engine.release) -> tuple[np.ndarray, np.ndarray]:
    """``trials`` exchanged iterates x^1 of an attacked agent holding ``features``, its two neighbours
    holding zero rows, all from x^0 = ``start`` [AGENTS, d]; each trial another key (seed, agent) from seed
    ``first_seed`` on (:func:`groups` disjoint triangles per seed); and their ex-post losses of eq. (10)
    summed over the coordinates: ([trials, d], [trials])."""
    b, d = features.shape
    copies = groups(config)
    alphas, betas = privacy.schedule(config, d)
    data = torch.zeros(copies, AGENTS, b, d, dtype=torch.float64)
    data[:, 0] = features
    data = data.view(copies * AGENTS, b, d)  # the same for every run: one batch of products, not S copies
    triangle = ~torch.eye(AGENTS, dtype=torch.bool)
    adjacency = torch.block_diag(*[triangle] * copies).unsqueeze(0)
    x0 = start.repeat(copies, 1).unsqueeze(0)
    runs = -(-trials // copies)
    out, ex_post = np.empty((runs * copies, d)), np.empty(runs * copies)
    per_chunk = max(1, CHUNK // copies)
    for begin in range(0, runs, per_chunk):
        count = min(per_chunk, runs - begin)
        seeds = list(range(first_seed + begin, first_seed + begin + count))
        agents = Agents(features=data, labels=torch.ones(copies * AGENTS, b, dtype=torch.float64),
                        adjacency=adjacency.expand(count, -1, -1))
        x = x0.expand(count, -1, -1).clone()
        state = engine.State(x=x, dual=torch.zeros_like(x), sums=engine.secret_sums(config, x, seeds, 0))
        exchanged, released = release(config, agents, state, seeds, ITERATION)
        attacked = slice(0, None, AGENTS)
        rows_out = slice(begin * copies, (begin + count) * copies)
        out[rows_out] = exchanged[:, attacked].reshape(-1, d).numpy()
        ex_post[rows_out] = privacy.ex_post(
            exchanged[:, attacked], released.lo[:, attacked], released.hi[:, attacked],
            alphas[0] * config.bound, betas[0]).sum(dim=-1).reshape(-1).numpy()
    return out[:trials], ex_post[:trials]


def claim(config: DecentralConfig, d: int) -> float:
    """The statement's epsilon for the first release of d coordinates: d alpha_1 beta_1 B plus the grid's cost
    (:func:`dpadmm.decentral.privacy.statement` sums these over the run)."""
    alphas, betas = privacy.schedule(config, d)
    return privacy.step_bound(d, alphas[0], betas[0], config.bound) + laplace_epsilon_cost()


def audit(config: DecentralConfig, trials: int = 200_000, alpha: float = ALPHA,
          release: Release = engine.release) -> list[AuditResult]:
    """Lower-bound the epsilon of agent 0's first exchanged iterate under ``config`` (three agents, complete
    graph) and set it beside the statement's claim: one result per design (the a-priori worst case; with
    random weights also the amplified one)."""
    from dpadmm.data.adult import COLUMNS

    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with noise='none' adds no noise: there is no "
                         "privacy claim to audit")
    config = dataclasses.replace(config, agents=AGENTS, graph="complete")
    d = len(COLUMNS)
    epsilon = claim(config, d)
    _, betas = privacy.schedule(config, d)
    features, features_prime = rows(config, d)
    start = torch.zeros(AGENTS, d, dtype=torch.float64)
    start[:, -1] = -MARGIN
    designs = [(start, "the neighbours' iterates at the agent's: Term A is one point (the worst case)")]
    # the updates whose Term A is spread by the random weights (DGD's mixing and the exact x-step have none)
    spread = config.weights == "random" and config.algorithm != "dgd" and config.x_step != "exact"
    if spread:
        apart = start.clone()
        apart[1:, :-1] += SPREAD / betas[0]
        designs.append((apart, f"the neighbours {SPREAD:g} noise scales away in every coordinate but the "
                               "last: the random weights spread Term A"))
    weights = f"{config.weights} weights" if spread or config.weights == "fixed" else "no random weights"
    results = []
    for i, (x, words) in enumerate(designs):
        began = time.perf_counter()
        outputs, ex_post = releases(config, features, x, 2 * i * trials, trials, release)
        outputs_prime, _ = releases(config, features_prime, x, (2 * i + 1) * trials, trials, release)
        bound, detail = release_audit(outputs, outputs_prime, "laplace", 0.0, alpha)
        detail = {**detail, "ex_post_mean": float(ex_post.mean()),
                  "exceeds_ex_post": bool(bound > ex_post.mean())}
        results.append(AuditResult(
            kind=f"{config.algorithm} exchanged iterate (laplace, pure, {weights}, "
                 f"{'worst case' if i == 0 else 'amplified'}{_uncovered(config)})",
            claim=epsilon, delta=0.0, bound=bound, trials=trials, seconds=time.perf_counter() - began,
            alpha=alpha, attack=f"colluding agents; one sample replaced at the per-coordinate bound; {words}",
            detail=detail))
    return results


def one_run(config: DecentralConfig, canaries: int = CANARIES, alpha: float = ALPHA, seed: int = 0
            ) -> AuditResult:
    """Lower-bound the epsilon of an agent's whole run of ``config`` from one run (Steinke, Nasr & Jagielski
    2023).

    ``canaries`` agents in disjoint complete graphs of three (the last of up to five) run the engine's
    iterations (:func:`dpadmm.decentral.engine.iterate`) for K rounds from x^0 = -M e_d, with the samples of
    :func:`rows`: agent j holds u = (1, ..., 1) if canary j is in (probability 1/2, a keyed draw of
    ``seed``), else u' = (-1, ..., -1, 1), one sample replaced. Everything else in the run depends on agent
    j's sample only through agent j's exchanged iterates, so the run is the statement's whole-run
    epsilon-DP in each canary. The colluding agents see every exchanged iterate and score canary j by the
    sum over the iterations of agent j's coordinates 1..d-1, which u raises and u' lowers.
    """
    from dpadmm.data.adult import COLUMNS

    began = time.perf_counter()
    if not config.private:
        raise ValueError(f"algorithm={config.algorithm!r} with noise='none' adds no noise: there is no "
                         "privacy claim to audit")
    if config.exchange == "secret":
        raise ValueError("exchange='secret' is not allowed in the one-run audit: the other agents learn sums "
                         "of iterates, not each agent's release; audit exchange='plain'")
    config = dataclasses.replace(config, agents=AGENTS, graph="complete")
    d = len(COLUMNS)
    whole = privacy.statement(config, d)
    included = torch.rand(canaries, generator=torch.Generator().manual_seed(seed)) < 0.5
    features, features_prime = rows(config, d)
    data = torch.where(included.view(-1, 1, 1), features, features_prime)
    sizes = [AGENTS] * (canaries // AGENTS - 1) + [AGENTS + canaries % AGENTS]
    adjacency = torch.block_diag(*[~torch.eye(size, dtype=torch.bool) for size in sizes]).unsqueeze(0)
    agents = Agents(features=data, labels=torch.ones(data.shape[:2], dtype=torch.float64),
                    adjacency=adjacency)
    x = torch.zeros(1, canaries, d, dtype=torch.float64)
    x[..., -1] = -MARGIN
    state = engine.State(x=x, dual=torch.zeros_like(x))
    scores = torch.zeros(canaries, dtype=torch.float64)
    for k in shown(config.rounds, "iteration"):
        state, _ = engine.iterate(config, agents, state, [seed], k)
        scores += state.x[0, :, :-1].sum(dim=-1)
    length = counted(config.rounds, "iteration")
    return one_run_result(f"{config.algorithm} whole run ({length}{_uncovered(config)})", scores.numpy(),
                          included.numpy(),
                          whole.epsilon, 0.0, began, alpha,
                          attack="one sample of each agent replaced with probability 1/2; the colluding "
                                 "agents' score: the sum of its exchanged coordinates 1..d-1 over the "
                                 "iterations")


def audits(config: DecentralConfig, trials: int = 200_000, alpha: float = ALPHA) -> list[AuditResult]:
    """Every audited kind of release of ``config`` (``dpadmm audit``): the exchanged iterate, per design, and
    (with the plain exchange) the whole run."""
    whole = [one_run(config, alpha=alpha)] if config.exchange == "plain" else []
    return audit(config, trials, alpha) + whole


def _uncovered(config: DecentralConfig) -> str:
    """What an audit line adds when the claim is the paper's, below the bound that holds (B_inf < 2/b_i):
    a claim the statement itself marks NOT COVERED, as ADMM sharing's paper noise is."""
    return "" if config.covered else f", NOT COVERED: B_inf = {config.bound:g} is below 2/b_i"
