"""What a local step needs from the model: the gradient g of f_p and the scale of its noise.

One local step of 003 Algorithm 1 (eq. (8), or 000's trust region, eq. (9)) is the same
closed form for every model: only g and the noise scale depend on it. An *oracle* gives
both for a batch of agents:

- :class:`LogisticOracle`, the papers' multiclass logistic regression on [(S,) P, J, K]
  tensors: closed-form gradients, per-sample clipping by a factorised norm, and also the
  papers' data-dependent eq. (9b);
- :class:`ModuleOracle`, any ``nn.Module`` on dicts of [P, ...] parameter tensors:
  per-sample gradients with ``torch.func`` (``vmap(grad)``), each clipped to norm C before
  they are summed, batched over agents with a second ``vmap`` over stacked parameters
  (``functional_call``), in chunks of agents and samples that fit a memory budget; or,
  with ``per-sample = "factorized"``, per-sample norms of Linear and Conv2d layers from
  their inputs and output gradients (:func:`factorized_clipped_sum`), which never holds
  a per-sample copy of a large weight matrix.

With clipping the sensitivity is a theorem, not a measurement: one sample changes the
clipped gradient by at most 2C/I (replace-one; C/I add-remove) in the clipping norm, L1
for the Laplace mechanism and L2 for the Gaussian one (``models.clipped_sensitivity``).
With a minibatch of B_p = min(B, I_p) samples the gradient is rescaled by I_p / B_p to stay
an unbiased estimate of the full one, and so is its sensitivity (I_p is fixed between
replace-one neighbours, so the scale is still data-independent; no amplification by
subsampling is claimed).

With Poisson subsampling at rate q (:func:`poisson_rows`) each step takes each sample
independently with probability q and the clipped sum is scaled by 1/(qI), its expectation's
1/I: one sample added or removed moves it by at most C/(qI), and the step is the
Poisson-subsampled mechanism whose amplification the ledger credits (add-or-remove
neighbours; DP-SGD's sampling, Abadi et al. 2016).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpadmm import native
from dpadmm.models.logistic import (
    AgentData,
    gradient,
    gradient_and_sensitivity,
    probabilities,
    total_clip_factors,
)
from dpadmm.models.modules import MLP, LeafCNN, Params, ScatterCNN, SmallCNN, numel, prepared
from dpadmm.privacy import noise
from dpadmm.privacy.ledger import clipped_sensitivity
from dpadmm.privacy.randomness import Secret

# Elements of per-sample gradients held at once by ModuleOracle (2**26 float32: 256 MiB).
PER_SAMPLE_BUDGET = 2**26


# The built-in networks: each Linear and Conv2d layer applied once per forward pass (per_sample_path)
FACTORIZED_NETWORKS = (MLP, SmallCNN, LeafCNN, ScatterCNN)


@dataclass(frozen=True)
class GradientSpec:
    """What an oracle needs of a family's configuration (it imports none): the regulariser, the
    per-sample clipping, the noise's scale per unit sensitivity and the minibatches.

    ``clip=None`` is the plain gradient; with ``noise`` set as well, the logistic oracle gives
    the papers' data-dependent eq. (9b) as the sensitivity (a module oracle has no such bound
    and refuses it). ``noise=None`` means no noise is drawn (the scale is None).
    """

    beta: float  # f_p's regulariser (beta / P) ||z||^2 (eq. (2c) of 003)
    num_agents: int  # P
    clip: float | None = None  # C: each per-sample gradient clipped to norm C
    norm: str = "l1"  # the norm of the clipping and of the sensitivity: l1 (Laplace) or l2 (Gaussian)
    noise: float | None = None  # noise scale / sensitivity (1 / eps-bar); None = no noise
    neighbouring: str = "replace-one"  # the relation of the sensitivity (2C/I or C/I)
    batch_size: int = 0  # samples per step, drawn from the keyed stream of ``seed``; 0 = full batch
    sampling: float = 1.0  # Poisson rate q of each step's samples (keyed stream of ``seed``); 1 = all
    seed: int = 0
    per_sample: str = "vmap"  # a module's per-sample clipping: auto, vmap or factorized (per_sample_path)

    @property
    def data_dependent(self) -> bool:
        return self.noise is not None and self.clip is None


def summed_loss(module: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """sum_i l_i(z) = -sum_i sum_k y_ik ln softmax(model(z; x_i))_k over the rows of x (y one-hot).

    The data term of eq. (63) of 003 with the module's logits in place of x z, without the 1/I
    (applied after clipping). Padding rows (y_i = 0) add nothing and have zero gradient.
    """
    out = functional_call(module, dict(params), (x,))
    return -(y * torch.log_softmax(out, dim=-1)).sum()


def poisson_taken(seeds: Sequence[int], data: AgentData, t: int, e: int, rate: float,
                  randomness: Secret | None = None) -> torch.Tensor:
    """The Poisson samples of step (t, e) for every run and agent, as a mask [S, P, Imax].

    Sample i of agent p enters independently with probability q = ``rate``: in simulation when the
    keyed uniform u_i(seed, p, t, e) of stream ``STREAM_BATCH`` is below q, so a Flower client and the
    engine take the same samples; in deployment (``randomness``, one run) by an exact Bernoulli(q) of the
    agent's secret stream. Who is taken never depends on the data. Padding rows are never taken.
    """
    width = data.x.shape[1]
    real = torch.arange(width, device=data.x.device) < data.counts.unsqueeze(1)  # [P, Imax]
    if randomness is not None:
        taken = randomness.bernoulli(data.agents, t, e, noise.STREAM_BATCH, width, rate).to(real.device)
        return taken.unsqueeze(0) & real
    return torch.stack([noise.uniform(s, data.agents, t, e, noise.STREAM_BATCH, width).to(real.device) < rate
                        for s in seeds]) & real


def poisson_rows(seeds: Sequence[int], data: AgentData, t: int, e: int, rate: float,
                 randomness: Secret | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`poisson_taken` as (rows, taken), both [S, P, B] (:func:`compacted`)."""
    return compacted(poisson_taken(seeds, data, t, e, rate, randomness))


def compacted(taken: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A mask [S, P, Imax] as (rows, taken), both [S, P, B]: ``rows`` lists each sample's taken rows
    first; B is the largest sample over runs and agents (at least 1), and the rows after a smaller
    sample have ``taken`` False."""
    size = max(int(taken.sum(dim=-1).max()), 1)
    rows = torch.argsort((~taken).to(torch.int8), dim=-1, stable=True)[..., :size]
    return rows, torch.take_along_dim(taken, rows, dim=-1)


class LogisticOracle:
    """g = (1/I) X_p^T (H - Y) + (2 beta/P) z (eq. (63) of 003) and the Laplace scale of eq. (9a).

    ``seeds`` are the runs of a batched z [S, P, J, K], whose Poisson samples each come from
    their own seed's stream (None: one run of ``spec.seed``); ``randomness`` (deployment, one run)
    draws them from the agents' secret streams instead.
    """

    def __init__(self, spec: GradientSpec, data: AgentData, seeds: Sequence[int] | None = None,
                 randomness: Secret | None = None):
        if randomness is not None and seeds is not None and len(seeds) != 1:
            raise ValueError(f"seeds={list(seeds)} is not allowed with deployment randomness: one run")
        self.spec = spec
        self.data = data
        self.agents = data.agents
        self.seeds = [spec.seed] if seeds is None else list(seeds)
        self.randomness = randomness
        self._rows = torch.empty(0, dtype=data.x.dtype, device=data.x.device)  # the sampled rows of x, reused

    def gradient(self, z: torch.Tensor, t: int, e: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(g, noise scale per agent [(S,) P]) at z [(S,) P, J, K]; the scale is None without noise."""
        spec, data = self.spec, self.data
        if spec.sampling < 1:
            return self._sampled(z, t, e)
        scale, reg = 1.0 / data.total, spec.beta / spec.num_agents
        if spec.data_dependent:
            g, delta = gradient_and_sensitivity(data, z, scale=scale, reg=reg)
            return g, delta * spec.noise
        g = gradient(data, z, scale=scale, reg=reg, clip=spec.clip, norm=spec.norm)
        if spec.noise is None:
            return g, None
        delta = clipped_sensitivity(spec.clip, data.total, spec.neighbouring)
        return g, torch.full(z.shape[:-2], delta * spec.noise, dtype=z.dtype, device=z.device)

    def _sampled(self, z: torch.Tensor, t: int, e: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """g = (1/(qI)) sum_{i in the step's Poisson sample} clip(x_i (h_i - y_i)^T) + (2 beta/P) z, and
        the scale (C/(qI)) / eps-bar.

        On a CPU with the fused kernels (sparse data, :mod:`dpadmm.native`), one pass reads only the
        rows some run took, row by row, and gives a run no term from a row it did not take: about
        1 - (1 - q)^S of the full batch's work. Elsewhere the samples are gathered into a batch of
        their own ([S P, B, J]; the rows after a smaller sample get h = y = 0, so they add nothing)
        and the dense products run on it: about q of the full batch's products.
        """
        spec, data = self.spec, self.data
        taken = poisson_taken(self.seeds, data, t, e, spec.sampling, self.randomness)  # [S, P, Imax]
        if z.shape[:-2].numel() != taken.shape[0] * taken.shape[1]:
            raise ValueError(f"z of shape {tuple(z.shape)} does not match the oracle's seeds {self.seeds}")
        scale = 1.0 / (spec.sampling * data.total)
        if data.rows is not None and z.dtype == data.x.dtype:
            g = native.sampled_gradient(data.rows, data.y, data.x_l1, data.x_l2, z, taken, scale=scale,
                                        reg=spec.beta / spec.num_agents, clip=spec.clip, norm=spec.norm)
        else:
            g = self._gathered(z, taken, scale)
        if spec.noise is None:
            return g, None
        delta = clipped_sensitivity(spec.clip, data.total, spec.neighbouring, spec.sampling)
        return g, torch.full(z.shape[:-2], delta * spec.noise, dtype=z.dtype, device=z.device)

    def _gathered(self, z: torch.Tensor, taken: torch.Tensor, scale: float) -> torch.Tensor:
        """The sampled gradient of :meth:`_sampled` by gathering each run's sample into a dense batch."""
        spec, data = self.spec, self.data
        rows, taken = compacted(taken)
        width = data.x.shape[1]
        index = (rows + torch.arange(data.num_agents, device=rows.device).view(1, -1, 1) * width).flatten()

        def gather(v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            """[P, Imax, ...] -> [S P, B, ...], whole rows at a time."""
            out = torch.index_select(v.reshape(-1, *v.shape[2:]), 0, index, out=out)
            return out.view(-1, rows.shape[-1], *v.shape[2:])

        if self._rows.numel() < index.numel() * data.x.shape[2]:  # a fresh 40 MB array costs 4x its copy in
            self._rows = data.x.new_empty(index.numel() * data.x.shape[2])  # page faults (MNIST, 2 seeds)
        x = gather(data.x, self._rows[:index.numel() * data.x.shape[2]].view(index.numel(), -1))
        keep = taken.to(data.x.dtype).view(-1, rows.shape[-1], 1)
        batch = AgentData(x=x, y=gather(data.y) * keep, counts=keep.sum(dim=(1, 2)),
                          x_l1=gather(data.x_l1), x_l2=gather(data.x_l2),
                          agents=data.agents.repeat(len(self.seeds)), total=data.total)
        flat = z.reshape(-1, *z.shape[-2:])
        probs = probabilities(batch.x, flat) * keep  # rows not taken: h = y = 0, so their term is zero
        return gradient(batch, flat, scale=scale, reg=spec.beta / spec.num_agents, probs=probs,
                        clip=spec.clip, norm=spec.norm).view_as(z)


class ModuleOracle:
    """g = (1/I) sum_i clip(grad l_i(z)) + (2 beta/P) z for any module (``dpadmm.models.modules``), per agent.

    ``vectorize=False`` computes the agents one after the other (a plain loop, each agent's
    samples still vectorised); the default stacks them under ``vmap``. Both give the same
    numbers up to floating-point rounding.
    """

    def __init__(self, spec: GradientSpec, module: nn.Module, data: AgentData, *, vectorize: bool = True,
                 budget: int = PER_SAMPLE_BUDGET, randomness: Secret | None = None):
        if spec.data_dependent:
            raise ValueError("noise without clipping needs the data-dependent sensitivity of eq. (9b), "
                             "which is derived for logistic regression only, not "
                             f"{type(module).__name__}; set a clip")
        if any(True for _ in module.buffers()):
            raise ValueError(f"{type(module).__name__} has buffers (e.g. BatchNorm statistics), which mix "
                             "samples and break per-sample clipping; use a module without buffers "
                             "(GroupNorm instead of BatchNorm)")
        self.spec = spec
        self.module = module
        self.per_sample = per_sample_path(spec.per_sample, module)
        self.data = dataclasses.replace(data, x=prepared(module, data.x))  # a fixed front end, once
        self.agents = data.agents
        self.vectorize = vectorize
        self.budget = budget
        self.randomness = randomness  # deployment: the samples from the agents' secret streams

        def sample_loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return summed_loss(module, params, x.unsqueeze(0), y.unsqueeze(0))

        def batch_loss(params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return summed_loss(module, params, x, y)

        per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))
        clip, norm = spec.clip, spec.norm

        def clipped_sum(params: Params, x: torch.Tensor, y: torch.Tensor) -> Params:
            """sum_i min(1, C / ||g_i||) g_i over one agent's samples x [c, J], y [c, K]."""
            grads = per_sample(params, x, y)
            flat = [g.flatten(1) for g in grads.values()]
            # vector_norm reduces without the [c, n] temporary of abs() or square(): one pass less over
            # per-sample gradients far larger than the cache, and one large allocation less (page faults)
            if norm == "l2":
                norms = torch.sqrt(sum(torch.linalg.vector_norm(f, dim=1).square() for f in flat))
            else:
                norms = sum(torch.linalg.vector_norm(f, ord=1, dim=1) for f in flat)
            factors = total_clip_factors(clip, norms)  # padding rows: gradient 0, norm 0, factor 1
            return {k: torch.tensordot(factors, g.nan_to_num(0.0, 0.0, 0.0), dims=1)
                    for k, g in grads.items()}

        if clip is not None and self.per_sample == "factorized":
            layers = factorizable_layers(module)
            self.vectorize = False  # one agent at a time: each call is already batched over its samples
            self._agent_sum = lambda params, x, y: factorized_clipped_sum(module, layers, params, x, y, clip,
                                                                            norm)
        else:
            self._agent_sum = clipped_sum if clip is not None else grad(batch_loss)
        self._agents_sum = vmap(self._agent_sum, in_dims=(0, 0, 0))

    def gradient(self, z: Params, t: int, e: int) -> tuple[Params, torch.Tensor | None]:
        """(g, noise scale per agent [P]) at z (dict of [P, ...] tensors); the scale is None without noise."""
        spec, data = self.spec, self.data
        rows, taken, factor = self._batch(t, e)
        sums = self._sum(z, rows, taken)
        reg = 2.0 * spec.beta / spec.num_agents
        g = {k: sums[k].mul_(_expand(factor, sums[k])).add_(z[k], alpha=reg) for k in z}
        if spec.noise is None:
            return g, None
        delta = clipped_sensitivity(spec.clip, data.total, spec.neighbouring)
        return g, factor * (data.total * delta * spec.noise)

    def _batch(self, t: int, e: int) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The rows of step (t, e) per agent ([P, B], None for all), which of them are taken ([P, B], None
        for all) and the factor of the sum per agent.

        Full batch: 1/I (eq. (63)). Poisson sample at rate q (:func:`poisson_rows`): 1/(qI).
        Minibatch: B_p = min(B, I_p) rows drawn without replacement from the keyed stream
        (seed, agent, t, e), factor I_p / (B_p I).
        """
        data, size, rate = self.data, self.spec.batch_size, self.spec.sampling
        counts = data.counts
        if rate < 1:
            rows, taken = poisson_rows([self.spec.seed], data, t, e, rate, self.randomness)
            return rows[0], taken[0], torch.full_like(counts, 1.0 / (rate * data.total))
        if not size or size >= data.x.shape[1]:
            return None, None, torch.full_like(counts, 1.0 / data.total)
        if self.randomness is not None:
            keys = self.randomness.uniform(data.agents, t, e, noise.STREAM_BATCH, data.x.shape[1])
        else:
            keys = noise.uniform(self.spec.seed, data.agents, t, e, noise.STREAM_BATCH, data.x.shape[1])
        keys = keys.to(data.x.device)
        padding = torch.arange(data.x.shape[1], device=keys.device).unsqueeze(0) >= counts.unsqueeze(1)
        keys[padding] = 2.0  # real rows (keys < 1) first; an agent with I_p < B also gets zero rows
        rows = keys.argsort(dim=1)[:, :size]
        return rows, None, counts / (counts.clamp(max=size) * data.total)

    def _sum(self, z: Params, rows: torch.Tensor | None, taken: torch.Tensor | None) -> Params:
        """The agents' (clipped) per-sample gradients summed over the rows of :meth:`_batch`, chunk by chunk.

        Agents stacked under ``vmap`` read the same number of rows each, the batch padded to the largest
        agent's (rows not taken get y = 0: no loss, zero gradient). An agent computed alone reads only its
        own rows: a padded row costs a whole forward and backward pass, and on FEMNIST's unequal writers
        (133 samples on average, 284 at most) the padding doubled a Poisson step's work or more.
        """
        data = self.data
        agents, width = data.x.shape[0], data.x.shape[1] if rows is None else rows.shape[1]
        # vmap clipping materialises [rows, numel] per agent
        materialised = self.spec.clip is not None and self.per_sample == "vmap"
        per_sample = numel(z, agent_dim=True) if materialised else 1
        per_agent_rows = max(1, self.budget // per_sample)
        sample_chunk = min(width, per_agent_rows)
        agent_chunk = max(1, per_agent_rows // sample_chunk) if self.vectorize else 1
        out = {k: torch.zeros_like(v) for k, v in z.items()}
        lengths = self._lengths(rows, taken)  # (a chunk of one agent may also end a vectorised loop)
        for a0 in range(0, agents, agent_chunk):
            a1 = min(a0 + agent_chunk, agents)
            params = {k: v[a0:a1] for k, v in z.items()}
            if a1 - a0 > 1:  # one agent: no vmap over agents, whose batched weights are slower
                x, y = self._padded_rows(a0, a1, rows, taken)
                for s0 in range(0, width, sample_chunk):
                    part = self._agents_sum(params, x[:, s0:s0 + sample_chunk], y[:, s0:s0 + sample_chunk])
                    for k in out:  # (a grouped convolution for Conv2d)
                        out[k][a0:a1] += part[k]
                continue
            mine = slice(lengths[a0]) if rows is None else rows[a0, :lengths[a0]]  # a full batch: a view
            x, y = data.x[a0, mine], data.y[a0, mine]
            alone = {k: v[0] for k, v in params.items()}
            for s0 in range(0, x.shape[0], sample_chunk):
                part = self._agent_sum(alone, x[s0:s0 + sample_chunk], y[s0:s0 + sample_chunk])
                for k in out:
                    out[k][a0] += part[k]
        return out

    def _padded_rows(self, a0: int, a1: int, rows: torch.Tensor | None,
                     taken: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Agents a0..a1's rows of the step ([a, B, ...] each), y zeroed where a row is not taken."""
        x, y = self.data.x[a0:a1], self.data.y[a0:a1]
        if rows is None:
            return x, y
        which = torch.arange(a1 - a0, device=rows.device).unsqueeze(1), rows[a0:a1]
        x, y = x[which], y[which]  # not take_along_dim: it would expand rows to x's [a, B, ...] indices
        return x, y if taken is None else y * taken[a0:a1].unsqueeze(-1).to(y.dtype)

    def _lengths(self, rows: torch.Tensor | None, taken: torch.Tensor | None) -> list[int]:
        """How many of its rows of the step each agent reads alone, read off the device once: the taken
        rows of a Poisson sample (which :func:`compacted` lists first), min(B, I_p) of a minibatch (its real
        rows first), its I_p rows of a full batch."""
        if taken is not None:
            return taken.sum(dim=1).tolist()
        counts = self.data.counts if rows is None else self.data.counts.clamp(max=rows.shape[1])
        return counts.long().tolist()


def _expand(per_agent: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [P] tensor shaped to broadcast against [P, ...]."""
    return per_agent.reshape(-1, *([1] * (like.dim() - 1))).to(like.dtype)


def per_sample_path(choice: str, module: nn.Module) -> str:
    """The per-sample gradients of ``module``'s clipping: ``choice``, with ``auto`` resolved to factorized
    for the built-in networks (:func:`dpadmm.models.modules.build_model`'s MLP and CNNs, not a subclass) and
    vmap for any other module.

    Both give the same clipped sums up to rounding; factorized never forms a per-sample weight gradient,
    which makes the MLP's step about 25 times cheaper on 2 cores (``python -m benchmarks.step_cost``). It
    covers a module only if each of its Linear and Conv2d layers is applied once per forward pass, which holds
    for the built-in networks and cannot be checked for another module, which therefore gets vmap.
    """
    if choice != "auto":
        return choice
    return "factorized" if type(module) in FACTORIZED_NETWORKS else "vmap"


def factorizable_layers(module: nn.Module) -> dict[str, nn.Module]:
    """The Linear and Conv2d layers holding every parameter of ``module``, by name; or a ValueError.

    The factorised clipping needs each parameter to be the weight or bias of such a layer,
    applied once per forward pass to inputs whose rows are the samples.
    """
    layers = {name: m for name, m in module.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))}
    covered = {f"{name}.{p}" for name, m in layers.items() for p, _ in m.named_parameters(recurse=False)}
    others = [name for name, _ in module.named_parameters() if name not in covered]
    if others:
        raise ValueError(f"per-sample='factorized' needs every parameter in a Linear or Conv2d layer; "
                         f"{type(module).__name__} has {others}; use per-sample='vmap'")
    for name, layer in layers.items():
        if isinstance(layer, nn.Conv2d) and (layer.groups != 1 or layer.padding_mode != "zeros"
                                             or isinstance(layer.padding, str)):
            raise ValueError(f"per-sample='factorized' takes Conv2d layers with groups=1, zero padding given "
                             f"as numbers; {name} is {layer}; use per-sample='vmap'")
    return layers


def factorized_clipped_sum(module: nn.Module, layers: dict[str, nn.Module], params: Params, x: torch.Tensor,
                           y: torch.Tensor, clip: float, norm: str) -> Params:
    """sum_i min(1, C / ||g_i||) g_i over one agent's samples, without per-sample Linear weight gradients.

    One batched forward and backward pass of the summed loss gives each layer's input a_i
    and output gradient d_i per sample (rows do not interact). A Linear layer's per-sample
    weight gradient is the outer product d_i a_i^T, whose norms factorise,
    ||d_i a_i^T||_1 = ||d_i||_1 ||a_i||_1 and ||d_i a_i^T||_2 = ||d_i||_2 ||a_i||_2, and the
    clipped sum is one product (f * D)^T A; a Conv2d layer's per-sample gradients are small
    and are formed from the unfolded input. The result equals the ``vmap`` path's.
    """
    inputs: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            if name in outputs:
                raise ValueError(f"layer {name} is applied twice in one forward pass; use per-sample='vmap'")
            inputs[name], outputs[name] = args[0].detach(), out
        return hook

    handles = [layer.register_forward_hook(keep(name)) for name, layer in layers.items()]
    try:
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)  # so every layer's output is in the graph
            loss = summed_loss(module, {k: v.detach() for k, v in params.items()}, x, y)
            names = list(outputs)
            grads = dict(zip(names, torch.autograd.grad(loss, [outputs[n] for n in names]), strict=True))
    finally:
        for handle in handles:
            handle.remove()
    per_sample: dict[str, torch.Tensor] = {}  # small per-sample gradients (Conv2d), [B, ...]
    norms = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    power = 1 if norm == "l1" else 2

    def add(value: torch.Tensor) -> None:
        nonlocal norms
        norms = norms + (value.abs().sum(dim=1) if power == 1 else value.square().sum(dim=1))

    for name in names:
        layer, a, d = layers[name], inputs[name], grads[name]
        if isinstance(layer, nn.Linear):
            if a.dim() != 2:
                raise ValueError(f"per-sample='factorized' takes Linear layers on [samples, features]; "
                                 f"{name} "
                                 f"got {tuple(a.shape)}; use per-sample='vmap'")
            a_norm = a.abs().sum(dim=1) if power == 1 else a.square().sum(dim=1)
            d_norm = d.abs().sum(dim=1) if power == 1 else d.square().sum(dim=1)
            norms = norms + a_norm * d_norm
            if layer.bias is not None:
                norms = norms + d_norm
        else:
            cols = nn.functional.unfold(a, layer.kernel_size, dilation=layer.dilation, padding=layer.padding,
                                        stride=layer.stride)  # [B, C k k, L]
            weight = torch.einsum("bol,bcl->boc", d.flatten(2), cols)
            per_sample[f"{name}.weight"] = weight
            add(weight.flatten(1))
            if layer.bias is not None:
                per_sample[f"{name}.bias"] = d.sum(dim=(2, 3))
                add(per_sample[f"{name}.bias"])
    norms = norms if power == 1 else norms.sqrt()
    factors = total_clip_factors(clip, norms)  # padding rows: zero gradient, norm 0, factor 1
    kept = factors > 0  # a dropped sample (non-finite norm): its inputs and gradients, maybe inf, count 0
    sums: Params = {}
    for name in names:
        layer, a, d = layers[name], inputs[name], grads[name]
        if isinstance(layer, nn.Linear):
            scaled = (d * factors.unsqueeze(1)).nan_to_num_(0.0, 0.0, 0.0)
            sums[f"{name}.weight"] = scaled.T @ torch.where(kept.unsqueeze(1), a, 0.0)
            if layer.bias is not None:
                sums[f"{name}.bias"] = scaled.sum(dim=0)
        else:
            for key in (f"{name}.weight", f"{name}.bias"):
                if key in per_sample:
                    summed = torch.tensordot(factors, per_sample[key].nan_to_num(0.0, 0.0, 0.0), dims=1)
                    sums[key] = summed.reshape(params[key].shape)
    return {k: sums[k] for k in params}
