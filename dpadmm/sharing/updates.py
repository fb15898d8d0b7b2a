"""The equations of ADMM sharing (paper 001, Hu et al.), one function each, batched over seeds and parties.

Shapes: S runs (seeds), M parties, N samples; a party's block D_m is [N, d_m], stored zero-padded to
the widest block, [M, N, d]. Padded columns are zero, so they add zero eigenvalues whose
coordinates of x stay 0: the parties batch without changing any party's mathematics.

The objective (eq. (1)-(2), with the choices stated in :mod:`dpadmm.sharing.config`):
F(x) = l(sum_m D_m x_m) + l2 sum_m ||x_m||^2 / 2, l(z) = (1/N) sum_i log(1 + exp(-Y_i z_i)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEWTON_STEPS = 50  # at most; the z- and ball problems stop when no entry moves (they need 3-8)


def loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """l(z) = (1/N) sum_i log(1 + exp(-Y_i z_i)) per run: [S] from scores [S, N] and labels +-1 [N]."""
    return torch.nn.functional.softplus(-labels * scores).mean(dim=-1)


def loss_gradient(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """grad l(z)_i = -(Y_i / N) sigmoid(-Y_i z_i): [S, N]. Every entry is at most 1/N in size."""
    return -labels * torch.sigmoid(-labels * scores) / scores.shape[-1]


def error(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The share of samples misclassified, per run: [S] from scores [S, N] and labels +-1 [N]. A score of 0
    counts as an error for either class (no decision)."""
    return (scores * labels <= 0).to(scores.dtype).mean(dim=-1)


def undecided(scores: torch.Tensor) -> torch.Tensor:
    """The share of samples whose score is exactly 0, per run: [S] from scores [S, N]. :func:`error` counts
    them as errors, so a model that decides nothing (x = 0, as after round 1) has error 1; the logs say how
    much of an error is this."""
    return (scores == 0).to(scores.dtype).mean(dim=-1)


def objective(scores: torch.Tensor, labels: torch.Tensor, x: torch.Tensor, l2: float) -> torch.Tensor:
    """F = l(sum_m D_m x_m) + l2 sum_m ||x_m||^2 / 2 (001 eq. (2)): [S] from x [S, M, d]."""
    return loss(scores, labels) + 0.5 * l2 * x.square().sum(dim=(-2, -1))


@dataclass(frozen=True)
class Geometry:
    """What of every party's block stays fixed between rounds: D_m^T stored contiguously, [M, d, N], and the
    eigendecomposition D_m^T D_m = Q diag(lam) Q^T, [M, d] and [M, d, d], so that the x-step of eq. (6) and
    the paper's noise of eq. (16) are products. The transposed copy is there for speed: the x-step's
    D_m^T v read from it takes a third of the time it takes from D_m's rows (``docs/benchmarks.md``)."""

    columns: torch.Tensor
    eigenvalues: torch.Tensor
    eigenvectors: torch.Tensor


def geometry(blocks: torch.Tensor) -> Geometry:
    """:class:`Geometry` of the blocks [M, N, d].

    The eigendecomposition runs on one thread: LAPACK's eigenvectors differ in their last digits with the
    number of threads it splits the work over, those digits reach the x-step and so the iterates, and a run
    must compute the same numbers whatever threads it was given (a grid cell on a Ray worker with one
    thread, the same cell here with all the cores: :mod:`dpadmm.runs.grid`). It runs once per data set."""
    gram = blocks.transpose(-2, -1) @ blocks
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        values, vectors = torch.linalg.eigh(gram)
    finally:
        torch.set_num_threads(threads)
    return Geometry(columns=blocks.transpose(-2, -1).contiguous(), eigenvalues=values.clamp_min(0),
                    eigenvectors=vectors)


def scores(blocks: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """D_m x_m of every run and party, [S, M, N] from blocks [M, N, d] and x [S, M, d]: one batched matrix
    product with the runs as its columns, which reads each block once."""
    return torch.bmm(blocks, x.permute(1, 2, 0)).permute(2, 0, 1)


def transposed_scores(geo: Geometry, v: torch.Tensor) -> torch.Tensor:
    """D_m^T v_m of every run and party, [S, M, d] from v [S, M, N], read from the stored D_m^T: for one run
    as v^T D_m (its columns are contiguous), for several as D_m^T [v_1 .. v_S], the faster of the two
    layouts for each case here."""
    if v.shape[0] == 1:
        return torch.bmm(v.transpose(0, 1), geo.columns.transpose(-2, -1)).transpose(0, 1)
    return torch.bmm(geo.columns, v.permute(1, 2, 0)).permute(2, 0, 1)


def party_target(pulled: torch.Tensor, own_message: torch.Tensor) -> torch.Tensor:
    """r_m = z - sum_{k != m} D_k x_k from the pulled s - z and the party's cached D_m x_m (Algorithm 1, party
    step 2, the subtraction trick): r_m = D_m x_m - (s - z). [S, M, N] from [S, N] and [S, M, N]."""
    return own_message - pulled.unsqueeze(-2)


def x_step(geo: Geometry, target: torch.Tensor, y: torch.Tensor, rho: float, l2: float, bound: float
           ) -> torch.Tensor:
    """x_m^{t+1} of eq. (6) for every party at once (Jacobi): the minimiser over ||x_m|| <= b of
    l2 ||x_m||^2 / 2 + <y, D_m x_m> + (rho/2) ||D_m x_m - r_m||^2, with r_m = :func:`party_target`.

    The quadratic has Hessian H = l2 I + rho D_m^T D_m and linear term g = D_m^T (rho r_m - y); the
    unconstrained minimiser is H^-1 g, and on the ball it is (H + nu I)^-1 g with the nu >= 0 at which
    its norm is b (the trust-region condition), found by Newton on 1/||x(nu)|| - 1/b, which is concave
    and increasing in nu, so that Newton from nu = 0 rises to the root without overshooting.
    [S, M, d] from the blocks' geometry, target [S, M, N], y [S, N].
    """
    g = transposed_scores(geo, rho * target - y.unsqueeze(-2))
    c = torch.einsum("mde,smd->sme", geo.eigenvectors, g)  # Q^T g
    h = l2 + rho * geo.eigenvalues  # [M, d]
    nu = torch.zeros(c.shape[:-1], dtype=c.dtype, device=c.device)
    for _ in range(NEWTON_STEPS):
        scaled = c / (h + nu.unsqueeze(-1))
        norm = torch.linalg.vector_norm(scaled, dim=-1)
        outside = norm > bound * (1 + 1e-12)
        if not bool(outside.any()):
            break
        slope = (scaled.square() / (h + nu.unsqueeze(-1))).sum(dim=-1) / norm**3
        step = (1 / norm - 1 / bound) / slope
        nu = torch.where(outside, nu - step, nu)
    x = torch.einsum("mde,sme->smd", geo.eigenvectors, c / (h + nu.unsqueeze(-1)))
    return onto_ball(x, bound)


def onto_ball(x: torch.Tensor, bound: float) -> torch.Tensor:
    """x [..., d] projected onto ||x|| <= b, and 0 where its norm is not finite (a singular H with l2 = 0):
    the sensitivity 2 b sqrt(N) of the messages (:mod:`dpadmm.sharing.privacy`) needs ||x_m|| <= b whatever
    the x-step's Newton iterations reached, and a deployed party must never fail on its data."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    inside = x * (bound / norm).clamp(max=1.0)
    return torch.where(torch.isfinite(norm), inside, torch.zeros_like(x))


def z_step(s: torch.Tensor, y: torch.Tensor, labels: torch.Tensor, rho: float) -> torch.Tensor:
    """z^{t+1} of eq. (7), entry-wise: z_i minimises l_i(z_i) - y_i z_i + (rho/2)(s_i - z_i)^2, by
    vectorised Newton from s + y / rho (the minimiser without the loss). Each problem is strongly convex with
    curvature in [rho, rho + 1/(4N)], so Newton converges in a few steps. [S, N] from s [S, N], y [S, N]."""
    n = s.shape[-1]
    z = s + y / rho
    for _ in range(NEWTON_STEPS):
        p = torch.sigmoid(-labels * z)
        slope = -labels * p / n - y + rho * (z - s)
        step = slope / (p * (1 - p) / n + rho)
        z = z - step
        if not bool((step.abs() > 1e-15 * (1 + z.abs())).any()):
            break
    return z


def dual_step(y: torch.Tensor, s: torch.Tensor, z: torch.Tensor, rho: float) -> torch.Tensor:
    """y^{t+1} = y^t + rho (sum_m D_m x_m^{t+1} - z^{t+1}) (001 eq. (8)); afterwards grad l(z^{t+1}) = y^{t+1}
    (Lemma 2)."""
    return y + rho * (s - z)


def paper_noise(geo: Geometry, standard: torch.Tensor, std: float, ridge: torch.Tensor) -> torch.Tensor:
    """xi_m ~ N(0, sigma^2 (D_m^T D_m + tau_m I)^-1) of eq. (16) on the row space of D_m, from standard normal
    draws g [S, M, d]: sigma Q diag(r) Q^T g with r = (lam + tau_m)^-1/2 where lam > tau_m and 0 elsewhere.

    Being a function of the Gram matrix, it does not depend on how eigh orders or rotates equal
    eigenvalues, so a party's real coordinates get the same xi whether its block is padded in a batch or
    alone. Where D_m has full column rank it is the paper's covariance with a small ridge tau_m. Where it
    is rank-deficient (a9a's one-hot groups, MNIST's blank border pixels) the inverse does not exist, and
    the directions with eigenvalue at most tau_m (its null space, up to rounding) get no noise, as with the
    pseudo-inverse: x_m never moves in them (the x-step of eq. (6) lies in the row space of D_m) and noise
    there changes no message; a ridge alone would put noise of scale sigma / sqrt(tau_m) there, which only
    inflates ||x~_m|| and the test scores."""
    values = geo.eigenvalues
    root = torch.where(values > ridge.unsqueeze(-1), (values + ridge.unsqueeze(-1)).rsqrt(),
                       torch.zeros_like(values))
    rotated = torch.einsum("mde,smd->sme", geo.eigenvectors, standard)
    return std * torch.einsum("mde,sme->smd", geo.eigenvectors, root * rotated)
