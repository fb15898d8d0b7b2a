"""The papers' model: multiclass logistic regression without bias (003 Appendix G, eq. (63)).

Agents' data are held as one padded batch (``AgentData``): agent p's I_p samples occupy
the first I_p rows of its slice and the remaining rows are zero. A zero row has x_i = 0
and y_i = 0, so it adds nothing to X^T (H - Y), to the sensitivity max_i ||x_i||_1 ... or to
the loss: the padding needs no mask in any formula.

The variables z (and w, lambda) may carry one more leading dimension, a batch of independent
runs (seeds) that share the agents' data: z is then [S, P, J, K]. The products fold the run
dimension into the columns (X_p [I_p, J] times [J, S K]), so X_p is read once per step for
all S runs; on CPU, ten MNIST runs cost about twice one (the products are memory-bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from dpadmm import native
from dpadmm.models.modules import fixed_sum

# Where more of X is nonzero, the batched dense products (BLAS) are used: the fused kernel's work grows with
# the nonzeros, and on fully dense data it took 1.4 times the products' time on 2 cores (an early row-wise
# version, FEMNIST-shaped random data). MNIST is 19% nonzero, FEMNIST 12%.
SPARSE_ENOUGH = 0.5


@dataclass(frozen=True)
class AgentData:
    """Training data of P agents, batched: the leading dimension is the agent."""

    x: torch.Tensor  # [P, Imax, J] features
    y: torch.Tensor  # [P, Imax, K] one-hot labels; all-zero rows are padding
    counts: torch.Tensor  # [P] I_p, the number of real rows per agent
    x_l1: torch.Tensor  # [P, Imax] ||x_i||_1, precomputed for eq. (9b) and L1 clipping
    x_l2: torch.Tensor  # [P, Imax] ||x_i||_2, precomputed for L2 clipping (the Gaussian variant)
    agents: torch.Tensor  # [P] int64 agent ids (the keys of the noise streams)
    total: int  # I, the number of samples over all agents (a public parameter)

    @cached_property
    def blocks(self) -> native.Blocks | None:
        """The nonzeros of x by blocks of rows and columns (:func:`dpadmm.native.column_blocks`), built on
        first use, for the fused gradient; None where that kernel does not run (CUDA, no C compiler) or
        x is too dense for it."""
        return native.column_blocks(self.x, max_density=SPARSE_ENOUGH)

    @cached_property
    def rows(self) -> native.Rows | None:
        """x row by row (:func:`dpadmm.native.csr_rows`), built on first use, for the Poisson-sampled
        gradient's kernel, which reads only the rows a sample takes; None where :attr:`blocks` is."""
        return native.csr_rows(self.x) if self.blocks is not None else None

    @property
    def num_agents(self) -> int:
        return self.x.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """(J, K): the shape of w, z_p and lambda_p."""
        return (self.x.shape[2], self.y.shape[2])

    def select(self, agents: slice | torch.Tensor) -> AgentData:
        """The agents of ``agents`` (a slice of the batch: views; or an index tensor: copies)."""
        return AgentData(x=self.x[agents], y=self.y[agents], counts=self.counts[agents],
                         x_l1=self.x_l1[agents], x_l2=self.x_l2[agents], agents=self.agents[agents],
                         total=self.total)

    @classmethod
    def from_blocks(
        cls,
        xs: Sequence[torch.Tensor],
        ys: Sequence[torch.Tensor],
        *,
        num_classes: int,
        total: int,
        agents: Sequence[int],
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> AgentData:
        """Stack per-agent blocks (x: [I_p, J], y: [I_p] int labels) into a padded batch."""
        if not (len(xs) == len(ys) == len(agents)) or not xs:
            raise ValueError(f"need one x, y block per agent; got {len(xs)}, {len(ys)}, {len(agents)}")
        counts = [int(x.shape[0]) for x in xs]
        if any(c == 0 for c in counts):
            raise ValueError(f"every agent needs at least one sample; got counts {counts}")
        if total < sum(counts):
            raise ValueError(f"total={total} is smaller than the agents' {sum(counts)} samples")
        num_features = int(xs[0].shape[1])
        width = max(counts)
        x = torch.zeros(len(xs), width, num_features, dtype=dtype, device=device)
        y = torch.zeros(len(xs), width, num_classes, dtype=dtype, device=device)
        for p, (xp, yp) in enumerate(zip(xs, ys, strict=True)):
            x[p, : counts[p]] = xp.to(device=device, dtype=dtype)
            y[p, : counts[p]] = torch.nn.functional.one_hot(yp.to(device).long(), num_classes).to(dtype)
        return cls(
            x=x,
            y=y,
            counts=torch.tensor(counts, dtype=dtype, device=device),
            x_l1=x.abs().sum(dim=2),
            x_l2=torch.linalg.vector_norm(x, dim=2),
            agents=torch.tensor(list(agents), dtype=torch.int64, device=device),
            total=int(total),
        )


def shared_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a_p b_p for every agent p: a [P, M, N] (the agents' data), b [P, N, K] or [S, P, N, K].

    With a run dimension S the S right-hand sides of agent p become the columns of one
    product a_p [b_p^1 ... b_p^S], so a is read once for all runs.
    """
    if b.dim() == 3:
        return torch.bmm(a, b)
    runs, agents, inner, cols = b.shape
    folded = b.permute(1, 2, 0, 3).reshape(agents, inner, runs * cols)
    return torch.bmm(a, folded).view(agents, a.shape[1], runs, cols).permute(2, 0, 1, 3)


def probabilities(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """h(z; x) = softmax(x z) row by row (eq. (63)); x [P, I, J], z [(S,) P, J, K] -> [(S,) P, I, K]."""
    return torch.softmax(shared_bmm(x, z), dim=-1)


def gradient(data: AgentData, z: torch.Tensor, *, scale: torch.Tensor | float, reg: float,
             probs: torch.Tensor | None = None, clip: float | None = None, norm: str = "l1") -> torch.Tensor:
    """scale * X_p^T (H - Y) + 2 reg z, batched over agents.

    With scale = 1/I and reg = beta/P this is grad f_p of eq. (63) in 003 (note the global I,
    not I_p); OutP uses scale = 1/I_p and reg = beta (its local mean). ``scale`` may be a
    [P] tensor. With ``clip = C`` each sample's term x_i (h_i - y_i)^T is first scaled to
    L1 norm (``norm="l2"``: L2 norm) at most C (``clip_factors``), which bounds the sensitivity
    independently of the data.

    On a CPU (without ``probs``) the fused kernel :func:`dpadmm.native.logistic_gradient` computes
    the same in one pass over each agent's nonzero pixels; the torch code below is the
    definition it is tested against, and what runs elsewhere.
    """
    if probs is None and data.blocks is not None and z.dtype == data.x.dtype:
        return gradient_and_sensitivity(data, z, scale=scale, reg=reg, clip=clip, norm=norm)[0]
    h = probabilities(data.x, z) if probs is None else probs
    residual = h - data.y
    if clip is not None:
        residual = clipped_terms(residual, clip_factors(data, residual, clip, norm))
    if isinstance(scale, torch.Tensor):
        residual = residual * scale.reshape(-1, 1, 1)
        scale = 1.0
    if z.dim() == 3:
        # One fused kernel: 2 reg z + scale X^T (H - Y), without [P, J, K] temporaries.
        return torch.baddbmm(z, data.x.transpose(1, 2), residual, beta=2.0 * reg, alpha=scale)
    g = shared_bmm(data.x.transpose(1, 2), residual)
    return g.mul_(scale).add_(z, alpha=2.0 * reg)


def gradient_and_sensitivity(data: AgentData, z: torch.Tensor, *, scale: torch.Tensor | float, reg: float,
                             clip: float | None = None,
                             norm: str = "l1") -> tuple[torch.Tensor, torch.Tensor]:
    """(:func:`gradient`, :func:`sensitivity`) at z: the data-dependent Delta of eq. (9b) comes with the
    gradient, in the same pass where the fused kernel runs."""
    if data.blocks is not None and z.dtype == data.x.dtype:
        g, worst = native.logistic_gradient(data.blocks, data.y, data.x_l1, data.x_l2, z, scale=scale,
                                            reg=reg, clip=clip, norm=norm)
        return g, worst / data.total
    probs = probabilities(data.x, z)
    g = gradient(data, z, scale=scale, reg=reg, probs=probs, clip=clip, norm=norm)
    return g, sensitivity(data, probs)


def clip_factors(data: AgentData, residual: torch.Tensor, clip: float, norm: str = "l1") -> torch.Tensor:
    """min(1, C / ||x_i (h_i - y_i)^T||) per sample, [(S,) P, Imax], in the L1 or (``norm="l2"``) L2 norm.

    Both norms of the rank-one term factorise, ||x_i||_1 ||h_i - y_i||_1 and
    ||x_i||_2 ||h_i - y_i||_2 (Frobenius), so clipping needs no per-sample gradient tensors.
    Padding rows (x_i = 0) get factor 1 (their term is zero). Clipping is total: a term whose norm is not
    finite (the logits of a server's extreme z overflowed) gets factor 0, a rule that never looks at the
    data's values and stays within C, so that nothing computed from the data can make the release fail.
    """
    if norm == "l2":
        norms = data.x_l2 * torch.linalg.vector_norm(residual, dim=-1)
    else:
        norms = data.x_l1 * residual.abs().sum(dim=-1)
    return total_clip_factors(clip, norms)


def clipped_terms(residual: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Each sample's residual [..., K] times its clip factor [...]: a term of non-finite norm has factor 0
    (:func:`total_clip_factors`), and its NaN or inf entries become 0 with it."""
    return (residual * factors.unsqueeze(-1)).nan_to_num_(0.0, 0.0, 0.0)


def total_clip_factors(clip: float, norms: torch.Tensor) -> torch.Tensor:
    """min(1, C / norm), and 0 where the norm is not finite: per-sample clipping that is total, so that a
    sample's term is within C whatever the server sent and the data hold (the caller zeroes the non-finite
    entries of a dropped term, whose factor is 0)."""
    return torch.where(torch.isfinite(norms), (clip / norms).clamp(max=1.0), torch.zeros_like(norms))


def sensitivity(data: AgentData, probs: torch.Tensor) -> torch.Tensor:
    """Delta_p = max_i ||x_i||_1 ||h(z; x_i) - y_i||_1 / I, eq. (9b) as 003 Section IV evaluates it.

    (003 prints 1/T; the gradient carries 1/I, so 1/I is meant.) This is computed from the
    agent's own data at the current iterate: Theorem 1 does not cover such a data-dependent
    scale, which the privacy reports say.
    """
    residual_l1 = (probs - data.y).abs().sum(dim=-1)  # [(S,) P, Imax]
    return (data.x_l1 * residual_l1).amax(dim=-1) / data.total


def training_loss(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, beta: float,
                  differentiable: bool = False) -> float | torch.Tensor:
    """sum_p f_p(w) = -(1/I) sum_i ln h_{y_i}(w; x_i) + beta ||w||^2 (eqs. (2c), (63)); ``differentiable``:
    a tensor with its autograd graph, for a solver of the problem itself."""
    squared_norm = (w * w).sum()
    return loss_from_logits(x @ w, y, squared_norm if differentiable else float(squared_norm), beta,
                            differentiable)


def loss_from_logits(logits: torch.Tensor, y: torch.Tensor, squared_norm: float | torch.Tensor, beta: float,
                     differentiable: bool = False) -> float | torch.Tensor:
    """-(1/I) sum_i ln softmax(logits_i)_{y_i} + beta ||w||^2: eq. (2c) for any model's logits. A reported
    value sums in a fixed order (:func:`dpadmm.models.modules.fixed_sum`, a float); ``differentiable``
    keeps torch's mean and the autograd graph."""
    nll = -torch.log_softmax(logits, dim=1).gather(1, y.reshape(-1, 1))
    mean = nll.mean() if differentiable else fixed_sum(nll) / nll.shape[0]
    return mean + beta * squared_norm


def error_rate(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> float:
    """Fraction of samples whose arg-max class under w is wrong."""
    return error_from_logits(x @ w, y)


def error_from_logits(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows whose arg-max is not the label."""
    return float((logits.argmax(dim=1) != y).double().mean())
