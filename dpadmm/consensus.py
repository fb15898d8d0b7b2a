"""The server's side of DP-IADMM: the global and dual updates, batched over agents.

The dual update is also the agents' line 23: server and agent apply this one function to
the same (lambda_p, w, z_p, rho), so their copies of lambda_p stay identical.
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


def dual_digest(lam: torch.Tensor) -> tuple[float, float]:
    """(sum, L1 norm) of one agent's lambda_p [J, K]: a cheap checksum for comparing copies.

    Server and agent each keep lambda_p (lines 8 and 23 of 003); the agent reports this
    digest so the server can detect copies that drifted apart. lambda_p is a function of
    the released z_p and w alone, so the digest discloses nothing new.
    """
    lam = lam.double()
    return float(lam.sum()), float(lam.abs().sum())
