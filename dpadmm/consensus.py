"""The server's side of DP-IADMM: the global and dual updates, batched over agents.

The dual update is line 8 of Algorithm 1 and also the agents' line 23, which computes the
same value from the same (lambda_p, w, z_p, rho): the Flower server computes it once and
sends each agent its lambda_p, the engine computes it for all agents at once.
"""

from __future__ import annotations

import torch


def global_update(z: torch.Tensor, lam: torch.Tensor, rho: float) -> torch.Tensor:
    """w^{t+1} = (1/P) sum_p (z_p^t - lambda_p^t / rho^t): the minimiser of eq. (4a), line 5 of 003.

    z, lam: [(S,) P, J, K] -> w: [(S,) J, K] (S: a batch of independent runs).
    """
    return (z - lam / rho).mean(dim=-3)


def dual_update(lam: torch.Tensor, w: torch.Tensor, z: torch.Tensor, rho: float) -> torch.Tensor:
    """lambda_p^{t+1} = lambda_p^t + rho^t (w^{t+1} - z_p^{t+1}): eq. (4c), lines 8 and 23 of 003.

    lam, z: [(S,) P, J, K]; w: [(S,) J, K], or [J, K] for a single agent's copy.
    """
    if lam.dim() == 4:
        w = w.unsqueeze(-3)
    return lam + rho * (w - z)


def consensus_violation(w: torch.Tensor, z: torch.Tensor) -> float:
    """sum_p ||w - z_p||_1 / P, the consensus violation of 000 (Appendix A.10); w [J, K], z [P, J, K]."""
    return float((w - z).abs().sum() / z.shape[0])

