"""What users pick instead of DP-IADMM: DP-SGD + FedAvg (Opacus) and DP-FedAvg, with their accounting.

Two baselines for the comparison of ``benchmarks/compare_dp.py``, with no Flower import (Flower's
own DP-FedAvg runs as the app ``benchmarks/dpfedavg_app``, whose clients train with
:func:`local_sgd` from here):

- **DP-SGD + FedAvg.** Each agent trains locally with DP-SGD (Abadi et al., 2016) through Opacus:
  per-sample gradients (``GradSampleModule``), each clipped to L2 norm C, Gaussian noise of
  standard deviation sigma C on their sum (``DPOptimizer``), on Poisson-sampled batches
  (``UniformWithReplacementSampler``, rate q). The server averages the agents' models weighted
  by their sample counts. Every agent uses the same q and the same number of steps, so one
  noise multiplier sigma gives every agent the same guarantee.
- **DP-FedProx.** The same, with FedProx's proximal term (Li et al., MLSys 2020): each local step
  also moves by -lr mu (w - w^t), towards the round's global model w^t, which corrects the drift of
  agents whose data differ. The term is added to Opacus's noisy gradient, not to the loss: it is a
  function of the released gradient and the public w^t (post-processing), so it is neither clipped nor
  noised and the privacy is DP-SGD's.
- **DP-FedAvg with client-side fixed clipping** (McMahan et al., 2018; Flower's
  ``DifferentialPrivacyClientSideFixedClipping``): each agent trains without noise, clips its
  model update to L2 norm C, and the server adds Gaussian noise of standard deviation
  z C / n to the uniform average of the n updates.

What each epsilon covers differs, and the comparison can only be read with it in mind:

- DP-SGD (here): **sample-level, per agent, local**. Neighbouring data sets differ in one
  sample of one agent (added or removed); the agent adds the noise itself, so the guarantee
  holds against an untrusted server and every other party that sees its models.
- Flower's client-side fixed clipping: **client-level, central**. Neighbouring data sets
  differ in one agent's whole data set (added or removed), a much larger unit; but the noise is
  added by the server, which sees each agent's clipped update in the clear, so the guarantee
  holds only against those who see the released global models, with a trusted server.
- DP-IADMM (:mod:`dpadmm.iadmm.engine`): **sample-level, per agent, local**, like DP-SGD (each
  agent's release is noised by the agent; see :mod:`dpadmm.iadmm.privacy`).

Accounting is Google's ``dp-accounting``, by default its privacy-loss-distribution (PLD)
accountant, the one :mod:`dpadmm.privacy.ledger` composes DP-IADMM's releases with, so that the three
methods are held to the same accountant; ``accountant="rdp"`` gives the RDP accountant's (larger) value,
which is what Opacus's ``rdp`` accountant and Flower's ``RdpAccountant`` report. Both use the
add-or-remove-one relation, the one under which Poisson subsampling amplifies privacy (and the only
one Flower's fixed-clipping accountant accepts).

Opacus (the ``compare`` extra) is imported only by the DP-SGD functions, so the accounting and the
DP-FedAvg clients' :func:`local_sgd` work without it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import dp_accounting
import numpy as np
import torch
from torch import nn

from dpadmm.data import Dataset
from dpadmm.models.logistic import error_from_logits
from dpadmm.models.modules import Params, build_model, initial_parameters, logits_of, prepared
from dpadmm.privacy import ledger

if TYPE_CHECKING:
    from opacus import GradSampleModule

# Noise multipliers the calibration searches.
MULTIPLIER_RANGE = (0.2, 1e4)
# The comparison's held-out split of the test set: hyper-parameters are chosen on the first half
# ("validation"), errors are reported on the second ("test").
EVALUATION_SPLIT_SEED = 0

# Purposes of the random streams of DP-SGD, so that its sampling and its noise never share a seed.
_SAMPLING, _NOISE = 1, 2


# ----- accounting -----

def _gaussian_event(noise_multiplier: float, sample_rate: float, compositions: int) -> dp_accounting.DpEvent:
    """``compositions`` Gaussian releases of noise multiplier sigma, each on a Poisson sample of rate q
    (q = 1: every release sees all the data, no amplification)."""
    if not noise_multiplier > 0:
        raise ValueError(f"noise multiplier {noise_multiplier!r} is not allowed; it must be > 0")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate {sample_rate!r} is not allowed; it must be in (0, 1]")
    if compositions < 1:
        raise ValueError(f"{compositions} compositions is not allowed; it must be >= 1")
    event: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(noise_multiplier)
    if sample_rate < 1:
        event = dp_accounting.PoissonSampledDpEvent(sample_rate, event)
    return dp_accounting.SelfComposedDpEvent(event, compositions)


def _epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str) -> float:
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r} is not allowed; it must be in (0, 1)")
    tracker = ledger.accountant(accountant)
    tracker.compose(event)
    return float(tracker.get_epsilon(delta))


def dpsgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                  accountant: str = "pld") -> float:
    """epsilon at delta of one agent's DP-SGD: ``steps`` Poisson-sampled Gaussian steps of rate q.

    Sample-level and local: one sample of this agent added or removed, whatever the other agents
    and the server do. With T rounds of K local steps, ``steps`` = T K.
    """
    return _epsilon(_gaussian_event(noise_multiplier, sample_rate, steps), delta, accountant)


def dpfedavg_epsilon(noise_multiplier: float, rounds: int, delta: float, accountant: str = "pld") -> float:
    """epsilon at delta of DP-FedAvg with fixed clipping: ``rounds`` Gaussian releases of multiplier z.

    Client-level and central: one agent's whole data set added or removed; the server, which adds
    the noise, is trusted. Every agent takes part in every round, and no amplification by client
    sampling is claimed: Flower's accountant for fixed clipping accepts only ``no-amplification``
    (its FedAvg samples a fixed number of clients without replacement, not Poisson), so the
    comparison lets every client train every round and the two accounts agree.
    """
    return _epsilon(_gaussian_event(noise_multiplier, 1.0, rounds), delta, accountant)


def calibrate_noise_multiplier(target_epsilon: float, delta: float, *, sample_rate: float,
                               compositions: int, accountant: str = "pld") -> float:
    """The smallest noise multiplier (to ``dp_accounting.calibrate_dp_mechanism``'s tolerance) whose
    ``compositions`` Gaussian releases on Poisson samples of rate ``sample_rate`` are
    (``target_epsilon``, ``delta``)-DP.

    DP-SGD: ``sample_rate`` = q, ``compositions`` = T K. DP-FedAvg: 1.0 and T. Raises ValueError
    when the target needs a multiplier outside :data:`MULTIPLIER_RANGE`.
    """
    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ValueError(f"target epsilon {target_epsilon!r} is not allowed; it must be > 0 and finite")
    low, high = MULTIPLIER_RANGE
    for bound in (low, high):
        eps = _epsilon(_gaussian_event(bound, sample_rate, compositions), delta, accountant)
        if (bound == low and eps < target_epsilon) or (bound == high and eps > target_epsilon):
            raise ValueError(f"target epsilon {target_epsilon:g} needs a noise multiplier outside "
                             f"[{low:g}, {high:g}]: multiplier {bound:g} gives {eps:.4g} for {compositions} "
                             f"releases at sample rate {sample_rate:g}, delta {delta:g}")
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: ledger.accountant(accountant, ledger.CALIBRATION_INTERVAL),
        lambda m: _gaussian_event(m, sample_rate, compositions),
        target_epsilon, delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(low, high), tol=1e-4,
    ))


# ----- seeds, data and evaluation -----

def stream_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for the stream (seed, keys...): the same keys give the same draws in any
    process and any order of agents, different keys independent ones."""
    words = np.random.SeedSequence(entropy=seed, spawn_key=keys).generate_state(2, dtype=np.uint32)
    return int(words[0]) << 31 | int(words[1]) >> 1


def evaluation_split(num_test: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(validation, test) indices: a fixed random halving of the test set.

    Hyper-parameters are tuned on the validation half and errors reported on the test half,
    so that no reported number was used to pick what is reported.
    """
    order = torch.randperm(num_test, generator=torch.Generator().manual_seed(EVALUATION_SPLIT_SEED))
    half = num_test // 2
    return order[:half], order[half:]


def error_rate(module: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of the rows of x whose arg-max class under the model is not the label."""
    first = next(iter(params.values()))
    with torch.no_grad():
        return error_from_logits(logits_of(module, params, x.to(first.dtype)), y)


def agent_blocks(dataset: Dataset, num_agents: int,
                 dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each agent's (x, y) under the data set's partition, the one DP-IADMM's agents hold; one agent (central
    DP-SGD, a trusted curator) holds every sample, whatever the data set's own partition (FEMNIST's
    writers)."""
    x = dataset.x_train.to(dtype)
    blocks = [slice(None)] if num_agents == 1 else dataset.partition(num_agents)
    return [(x[block], dataset.y_train[block]) for block in blocks]


# ----- local training -----

def _set_parameters(module: nn.Module, params: Params) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(params[name])


def local_sgd(module: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor, *, epochs: int,
              batch_size: int, lr: float, seed: int) -> Params:
    """Plain (non-private) minibatch SGD on the mean cross-entropy from ``params``: the local
    training of a DP-FedAvg client, whose privacy comes from clipping and the server's noise.

    ``seed`` keys the shuffling, so a client's update is a function of its inputs.
    """
    generator = torch.Generator().manual_seed(seed)
    current = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    for _ in range(epochs):
        order = torch.randperm(x.shape[0], generator=generator)
        for batch in order.split(batch_size):
            loss = nn.functional.cross_entropy(logits_of(module, current, x[batch]), y[batch])
            grads = torch.autograd.grad(loss, list(current.values()))
            with torch.no_grad():
                for p, g in zip(current.values(), grads, strict=True):
                    p -= lr * g
    return {k: v.detach() for k, v in current.items()}


LR_DECAYS = ("constant", "sqrt")


@dataclass(frozen=True)
class DpSgdConfig:
    """DP-SGD local training (Opacus) with FedAvg aggregation: every hyper-parameter of a run."""

    rounds: int = 20  # T, FedAvg rounds
    local_steps: int = 10  # K, DP-SGD steps of each agent per round
    sample_rate: float = 0.05  # q, Poisson sampling rate of each step (same for every agent)
    lr: float = 1.0  # step size of SGD on the noisy mean gradient
    clip_norm: float = 1.0  # C, L2 bound of each per-sample gradient
    noise_multiplier: float = 1.0  # sigma: noise standard deviation sigma C on the clipped sum
    prox_mu: float = 0.0  # mu of FedProx's proximal term (0: DP-SGD + FedAvg; > 0: DP-FedProx)
    # constant: lr every round (Opacus's and Flower's default); sqrt: lr / sqrt(t) in round t, the decay of
    # DP-IADMM's eta^t = a / sqrt(t) (003), to tell what the schedule alone is worth
    lr_decay: str = "constant"
    # beta: the server's next global model is zbar^t + beta (zbar^t - zbar^{t-1}), zbar^t the round's FedAvg
    # average (zbar^0 the initial model). 0 is FedAvg; 1 is what DP-IADMM's server does at a constant rho
    # (dpadmm.iadmm.consensus.global_update), to tell what that extrapolation alone is worth
    extrapolation: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rounds", "local_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed; it must be >= 1")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate={self.sample_rate!r} is not allowed; it must be in (0, 1]")
        for name in ("lr", "clip_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed; it must be > 0")
        for name in ("noise_multiplier", "prox_mu", "extrapolation"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed; it must be >= 0")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"lr_decay={self.lr_decay!r} is not allowed; "
                             f"choose one of {', '.join(LR_DECAYS)}")

    def step_size(self, round_: int) -> float:
        """The learning rate of round ``round_`` (1-based)."""
        return self.lr / math.sqrt(round_) if self.lr_decay == "sqrt" else self.lr

    @property
    def steps(self) -> int:
        """T K, the DP-SGD steps each agent takes in a run (the compositions of its account)."""
        return self.rounds * self.local_steps

    def epsilon(self, delta: float, accountant: str = "pld") -> float:
        """The run's epsilon per agent at ``delta`` (sample-level, local); inf without noise."""
        if self.noise_multiplier == 0:
            return math.inf
        return dpsgd_epsilon(self.noise_multiplier, self.sample_rate, self.steps, delta, accountant)

    def calibrated(self, target_epsilon: float, delta: float, accountant: str = "pld") -> DpSgdConfig:
        """This configuration with the noise multiplier that makes the whole run
        (``target_epsilon``, ``delta``)-DP per agent."""
        sigma = calibrate_noise_multiplier(target_epsilon, delta, sample_rate=self.sample_rate,
                                           compositions=self.steps, accountant=accountant)
        return replace(self, noise_multiplier=sigma)


@dataclass(frozen=True)
class DpFedAvgConfig:
    """DP-FedAvg with client-side fixed clipping (Flower's wrapper): every hyper-parameter of a run.

    The clients train with :func:`local_sgd`; Flower's ``fixedclipping_mod`` clips each update to
    L2 norm C, and the server adds noise of standard deviation z C / n to the mean of the n updates.
    """

    rounds: int = 10  # T
    local_epochs: int = 1  # epochs of local SGD per round
    batch_size: int = 32
    lr: float = 0.1
    clip_norm: float = 1.0  # C, L2 bound of each client's model update
    noise_multiplier: float = 1.0  # z
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rounds", "local_epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed; it must be >= 1")
        for name in ("lr", "clip_norm", "noise_multiplier"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} is not allowed; it must be > 0")

    def epsilon(self, delta: float, accountant: str = "pld") -> float:
        """The run's epsilon at ``delta`` (client-level, central)."""
        return dpfedavg_epsilon(self.noise_multiplier, self.rounds, delta, accountant)

    def calibrated(self, target_epsilon: float, delta: float, accountant: str = "pld") -> DpFedAvgConfig:
        """This configuration with the noise multiplier that makes the whole run
        (``target_epsilon``, ``delta``)-DP at the client level."""
        z = calibrate_noise_multiplier(target_epsilon, delta, sample_rate=1.0, compositions=self.rounds,
                                       accountant=accountant)
        return replace(self, noise_multiplier=z)


def dpsgd_local(private: GradSampleModule, module: nn.Module, params: Params, x: torch.Tensor,
                y: torch.Tensor, config: DpSgdConfig, agent: int, round_: int) -> Params:
    """One agent's round of DP-SGD from ``params``: K steps on Poisson samples, through Opacus (with
    ``config.prox_mu`` > 0, each step also moves by -lr mu (w - params): DP-FedProx), at the round's
    learning rate ``config.step_size(round_)``.

    ``private`` wraps ``module`` (built once: wrapping is the expensive part). The gradient is
    the noisy sum of the clipped per-sample gradients divided by the expected batch size q I_p,
    Opacus's normalisation for Poisson sampling, in which I_p (the agent's sample count) is public.
    The sampling and noise generators are keyed by (seed, agent, round), so the update is
    reproducible and independent of the order in which agents are trained.
    """
    from opacus.optimizers import DPOptimizer
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    _set_parameters(module, params)
    lr = config.step_size(round_)
    sampler = UniformWithReplacementSampler(
        num_samples=x.shape[0], sample_rate=config.sample_rate, steps=config.local_steps,
        generator=torch.Generator().manual_seed(stream_seed(config.seed, agent, round_, _SAMPLING)))
    optimizer = DPOptimizer(
        torch.optim.SGD(private.parameters(), lr=lr),
        noise_multiplier=config.noise_multiplier, max_grad_norm=config.clip_norm,
        expected_batch_size=config.sample_rate * x.shape[0], loss_reduction="mean",
        generator=torch.Generator().manual_seed(stream_seed(config.seed, agent, round_, _NOISE)))
    for batch in sampler:
        optimizer.zero_grad(set_to_none=True)
        # Summed loss: the per-sample gradients are those of each sample's own loss, and the
        # optimizer divides by the expected batch size (an empty batch contributes only noise).
        loss = nn.functional.cross_entropy(private(x[batch]), y[batch], reduction="sum")
        with warnings.catch_warnings():
            # Opacus's full backward hooks warn when the inputs do not require gradients, as data never does.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        before = {name: p.detach().clone() for name, p in module.named_parameters()} if config.prox_mu else {}
        optimizer.step()  # w - lr (noisy gradient)
        with torch.no_grad():
            for name, p in module.named_parameters():
                if name in before:  # - lr mu (w - w^t), the proximal term's gradient at the step's start
                    p.sub_(before[name] - params[name], alpha=lr * config.prox_mu)
    optimizer.zero_grad(set_to_none=True)
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def dpsgd_fedavg(config: DpSgdConfig, dataset: Dataset, num_agents: int, *, model: str = "logistic",
                 dtype: torch.dtype = torch.float32,
                 on_round: Callable[[int, Params], None] | None = None) -> Params:
    """Train with DP-SGD on every agent and FedAvg on the server; return the final global model.

    Starts from :func:`dpadmm.models.modules.initial_parameters` (zeros for logistic regression, as
    DP-IADMM). Each round every agent runs :func:`dpsgd_local` from the global model, and the new
    global model is the average zbar^t of theirs weighted by I_p / I (FedAvg), or with
    ``config.extrapolation`` beta > 0 the extrapolation zbar^t + beta (zbar^t - zbar^{t-1}): a function of
    the released models only, so the privacy is DP-SGD's. ``on_round(t, params)`` is called after every
    round (evaluation, progress).
    """
    from opacus import GradSampleModule

    module = build_model(model, dataset.num_features, dataset.num_classes).to(dtype)
    private = GradSampleModule(module, loss_reduction="sum")
    # a fixed front end (the scatter CNN's features) computed once per agent, not at every step
    blocks = [(prepared(module, x), y) for x, y in agent_blocks(dataset, num_agents, dtype)]
    total = sum(x.shape[0] for x, _ in blocks)
    params = initial_parameters(module, config.seed, dtype=dtype)
    previous = params  # zbar^{t-1}
    for t in range(1, config.rounds + 1):
        average = {k: torch.zeros_like(v) for k, v in params.items()}
        for p, (x, y) in enumerate(blocks):
            local = dpsgd_local(private, module, params, x, y, config, p, t)
            for k in average:
                average[k] += (x.shape[0] / total) * local[k]
        params = average if not config.extrapolation else {
            k: v + config.extrapolation * (v - previous[k]) for k, v in average.items()}
        previous = average
        if on_round is not None:
            on_round(t, params)
    return params
