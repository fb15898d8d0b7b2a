"""The server's side of DP-IADMM: the global and dual updates, batched over agents.

The dual update is line 8 of Algorithm 1 and also the agents' line 23, which computes the
same value from the same (lambda_p, w, z_p, rho): the Flower server computes it once and
sends each agent its lambda_p, the engine computes it for all agents at once.

Variables are logistic regression's tensors (agents in dimension -3: [(S,) P, J, K]) or a
module's parameters, dicts of [P, ...] tensors (agents first); the updates apply per tensor.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dpadmm.models.modules import Params, fixed_sum, tree_map

Tree = torch.Tensor | Params


def mean_release(z: Tree) -> Tree:
    """zbar = (1/P) sum_p z_p: [(S,) P, J, K] -> [(S,) J, K], or dicts of [P, ...] -> [...]."""
    agent_dim = 0 if isinstance(z, Mapping) else -3
    return tree_map(lambda z_: z_.mean(dim=agent_dim), z)


def global_update(z: Tree, lam: Tree, rho: float, update: str = "admm") -> Tree:
    """w^{t+1} = (1/P) sum_p (z_p^t - lambda_p^t / rho^t): the minimiser of eq. (4a), line 5 of 003; or with
    ``update="mean"`` the mean release zbar^t (:func:`dual_reference` says why the two agree there).

    z, lam: [(S,) P, J, K] -> w: [(S,) J, K] (S: a batch of independent runs); or dicts of
    [P, ...] -> [...].

    In 003's order (w, then the agents' z, then the dual update with the same rho) the agents' mean
    dual is rho^t (zbar^{t-1} - zbar^t) after round t (zbar: the agents' average release, zbar^0 = z^0),
    so w^{t+1} = zbar^t + (rho^t / rho^{t+1}) (zbar^t - zbar^{t-1}): with a constant rho of any size the
    server extrapolates the average, 2 zbar^t - zbar^{t-1}, which FedAvg's server does not. In the agents'
    steps (eq. (8)) lambda_p enters as it is, so there the dual's pull scales with rho; here it enters
    divided by rho. Under noise the extrapolation costs: the noise of two rounds' releases enters w with
    weights 2 and -1, five times the variance of zbar^t's. Both are post-processing of the releases.
    """
    if update == "mean":
        return mean_release(z)
    agent_dim = 0 if isinstance(z, Mapping) else -3
    # mean(z) - mean(lam) / rho: no [P, ...] temporaries (for a network, each is P copies of the model)
    return tree_map(lambda z_, lam_: z_.mean(dim=agent_dim).sub_(lam_.mean(dim=agent_dim), alpha=1.0 / rho),
                    z, lam)


def model_after_round(algorithm: str, w: Tree, z: Tree, lam: Tree, rho_next: float,
                      update: str = "admm") -> Tree:
    """The model after a round's replies: what round t's metrics evaluate and a run returns after round T.

    Flower's convention (``evaluate_fn(t, arrays)`` receives the model after round t) rather than the model
    round t sent. For the objective-perturbation family it is the w-update that round t + 1 would start
    with (line 5 of 003's Algorithm 1, eq. (4a) with rho^{t+1}, or the server's ``update``), computed from
    round t's releases z_p and the duals they determine: post-processing, free of privacy cost, so the last
    round's releases are used too. OutP (Huang et al.'s order) computes its w after the agents' replies
    already: ``w`` itself.

    The authors' reference code evaluates the model each round sent instead (the w of line 5, before that
    round's releases); after thousands of rounds the two differ by one round's step.
    """
    if algorithm == "outp":
        return w
    return global_update(z, lam, rho_next, update)


def dual_reference(update: str, w: Tree, z: Tree) -> Tree:
    """The w that eq. (4c) updates the duals against after a round: ``admm``, 003's order, the w the round
    sent; ``mean``, the mean zbar of the releases z it received, which is the next round's w (the order of
    consensus ADMM in Boyd et al., "Distributed Optimization and Statistical Learning via the Alternating
    Direction Method of Multipliers", Foundations and Trends in Machine Learning, 2011, Section 7.1: local
    steps, then the mean, then the duals).

    In 003's order the mean dual is rho^t (zbar^{t-1} - zbar^t) (:func:`global_update`), and in the local
    steps (eq. (8), where lambda_p enters as it is) it pulls every agent back along the last round's progress,
    by eta rho of it per step, while eq. (4a)'s extrapolation makes up for it at the server. Against the mean
    the duals of a round where every agent replied sum to zero: eq. (4a) is then zbar itself, and the duals
    only correct each agent's drift from the mean. (Under partial participation only the replying agents'
    duals move, against the mean of every agent's last release, so their sum need not stay zero; the server
    takes the mean release as w either way.)
    """
    return w if update == "admm" else mean_release(z)


def dual_update(lam: Tree, w: Tree, z: Tree, rho: float) -> Tree:
    """lambda_p^{t+1} = lambda_p^t + rho^t (w^{t+1} - z_p^{t+1}): eq. (4c), lines 8 and 23 of 003.

    lam, z: [(S,) P, J, K] with w [(S,) J, K], or one agent's [J, K] copies; or dicts of
    [P, ...] (or one agent's [...]) with w's [...].
    """
    if not isinstance(lam, Mapping) and lam.dim() == 4:
        w = w.unsqueeze(-3)
    return tree_map(lambda lam_, w_, z_: lam_ + rho * (w_ - z_), lam, w, z)


def consensus_violation(w: Tree, z: Tree) -> float:
    """sum_p ||w - z_p||_1 / P, the consensus violation of 000 (Appendix A.10); w [J, K], z [P, J, K]
    (or dicts of [...] and [P, ...]: the L1 norm over all parameters).

    Summed a few agents at a time (a [P, ...] temporary of a network is P copies of the model), in a
    fixed order (:func:`dpadmm.models.modules.fixed_sum`: the same at any thread count).
    """
    pairs = [(w[k], z[k]) for k in z] if isinstance(z, Mapping) else [(w, z)]
    agents = pairs[0][1].shape[0]
    return sum(fixed_sum((part - w_).abs_()) for w_, z_ in pairs for part in z_.split(8)) / agents
