"""The batched engine: every agent of Algorithm 1 at once on one device.

It runs the identical mathematics as the Flower app (the same functions of
``dpadmm.iadmm.local`` and ``dpadmm.iadmm.consensus``, the same keyed noise) without the framework's
per-message overhead, for research sweeps. Only the loop over rounds lives here.

Logistic regression (the papers' model) runs every agent, and a batch of seeds, as one set
of [S, P, J, K] tensors. Any other model (``model`` in the config, or an ``nn.Module``
given to :func:`run`) keeps its parameters as dicts of [P, ...] tensors and runs the agents
in chunks that fit memory, each chunk under ``vmap`` over the stacked parameters (or, with
``vectorize=False``, as a plain loop over agents).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpadmm.data import Dataset
from dpadmm.iadmm import privacy, schedules
from dpadmm.iadmm.config import RunConfig, papers
from dpadmm.iadmm.consensus import (
    consensus_violation,
    dual_reference,
    dual_update,
    global_update,
    mean_release,
    model_after_round,
)
from dpadmm.iadmm.federation import agent_data, load_for
from dpadmm.iadmm.local import Tree, agent_round
from dpadmm.models.logistic import AgentData
from dpadmm.models.modules import build_model, initial_parameters, numel, tree_map
from dpadmm.privacy.ledger import Ledger
from dpadmm.privacy.randomness import SIMULATION, Secret, statement
from dpadmm.runs import checkpoint
from dpadmm.runs.results import RunWriter, central_metrics, closing, progress_bar

# Elements of a module's per-chunk temporaries (gradients, noise, iterates) in the engine (2**25: 128 MiB
# in float32 each): the number of agents updated at once is this over the model's size.
AGENT_CHUNK_BUDGET = 2**25


@dataclass
class EngineState:
    """The state of Algorithm 1 after a round: all agents' variables, stacked.

    Inside the engine every tensor has a leading run dimension S (one per seed of the
    batch); the results hand each run its own slice, without it.
    """

    w: Tree  # [(S,) J, K] the global model the last round sent (a module's: dict of [...]); the model
    # after it is :meth:`model` (what is evaluated and saved)
    z: Tree  # [(S,) P, J, K] the last released z_p (dict of [P, ...])
    z_chain: Tree  # [(S,) P, J, K] the last local iterate z_p^{t,E+1} (z itself when E = 1)
    lam: Tree  # [(S,) P, J, K] lambda_p (dict of [P, ...])

    def model(self, config: RunConfig, t: int) -> Tree:
        """The model after round t's replies ([(S,) J, K] or a module's dict):
        :func:`dpadmm.iadmm.consensus.model_after_round`."""
        return model_after_round(config.algorithm, self.w, self.z, self.lam, schedules.rho_at(config, t + 1),
                                 config.server_update)

    def run(self, s: int) -> EngineState:
        """Run s of a batched state (a module's state holds one run: itself)."""
        if isinstance(self.w, Mapping):
            return self
        return EngineState(w=self.w[s], z=self.z[s], z_chain=self.z_chain[s], lam=self.lam[s])


@dataclass(frozen=True)
class EngineResult:
    """The evaluated rounds, the final state, the trained model and where the run was written (None if not).

    ``model`` is the model after the last round's replies (the one evaluated and saved for round T);
    ``state.w`` is the model that round sent, part of the ADMM state a run resumes from.
    """

    records: list[dict[str, Any]]
    state: EngineState
    model: Tree
    directory: Path | None
    config: RunConfig  # as run: epsilon calibrated when target-epsilon was set
    ledger: Ledger | None  # None for non-private runs


def run(
    config: RunConfig,
    *,
    dataset: Dataset | None = None,
    write: bool = True,
    progress: bool = True,
    module: nn.Module | None = None,
    vectorize: bool = True,
) -> EngineResult:
    """Train with every agent batched; record (and write) one metrics dict per evaluated round.

    Each dict has ``round``, ``test-error`` and ``train-loss`` of the model after that round's
    replies (:func:`dpadmm.iadmm.consensus.model_after_round`, Flower's convention; ``result.model``
    after round T), ``consensus-violation`` (``sum_p |w - z_p| / P`` with the w the round sent and
    the z_p it released: the residual of its dual update, as 000 reports it), ``noise-magnitude``
    (mean ``|noise|`` over agents, steps and coordinates), ``rho`` and ``seconds`` (wall time of the
    round's computation).
    ``module`` trains that network instead of ``config.model`` (its parameters start from
    :func:`dpadmm.models.modules.initial_parameters` with the config's seed); ``vectorize=False``
    runs a module's agents in a plain loop instead of under ``vmap`` (same numbers).
    """
    return run_seeds(config, [config.seed], dataset=dataset, write=write, progress=progress,
                     module=module, vectorize=vectorize)[0]


def run_seeds(
    config: RunConfig,
    seeds: Sequence[int],
    *,
    dataset: Dataset | None = None,
    write: bool = True,
    progress: bool = True,
    directories: Sequence[str | Path] | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_seconds: float = 60.0,
    module: nn.Module | None = None,
    vectorize: bool = True,
) -> list[EngineResult]:
    """:func:`run` for several seeds of one configuration at once, one result per seed.

    The seeds are an extra batch dimension: every step computes all S runs together and
    reads each agent's data once for all of them (see :func:`dpadmm.models.logistic.shared_bmm`).
    Run s equals ``run(replace(config, seed=seeds[s]))`` up to floating-point rounding.

    ``directories`` names each seed's folder (default: ``config.out`` or the default
    folder of that seed's configuration, never overwriting another run). With
    ``checkpoint`` the state is saved there (atomically, at an evaluated round at most
    every ``checkpoint_seconds``); a later call with the same arguments resumes from it,
    keeps the folders' metrics up to that round and ends as the uninterrupted run would.

    A module model (``config.model`` other than logistic, or ``module``) runs its seeds one
    after the other (``module`` and ``vectorize`` as in :func:`run`).
    """
    config = privacy.calibrate(config)
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds={seeds} is not allowed; give one or more distinct seeds")
    configs = [dataclasses.replace(config, seed=s) for s in seeds]  # validates each seed
    if len(seeds) == 1:  # a module's run draws from config.seed: the one seed given is the run's
        config = configs[0]
    if directories is not None and len(directories) != len(seeds):
        raise ValueError(f"got {len(directories)} directories for {len(seeds)} seeds")
    if checkpoint is not None and (not write or directories is None):
        raise ValueError("checkpoint needs write=True and explicit directories "
                         "(a resumed run appends to them)")
    dataset = load_for(config) if dataset is None else dataset
    if module is None and config.model != "logistic":
        module = build_model(config.model, dataset.num_features, dataset.num_classes)
    if module is not None and len(seeds) > 1:
        return [run_seeds(c, [c.seed], dataset=dataset, write=write, progress=progress,
                          directories=None if directories is None else [directories[i]],
                          checkpoint=None if checkpoint is None else Path(f"{checkpoint}.seed-{c.seed}"),
                          checkpoint_seconds=checkpoint_seconds, module=module, vectorize=vectorize)[0]
                for i, c in enumerate(configs)]
    ledger = privacy.ledger(config, total_samples=dataset.num_train) if config.private else None
    if ledger:  # the engine simulates: every draw is keyed by the seed
        ledger = dataclasses.replace(ledger, randomness=statement([SIMULATION]))
    data = agent_data(dataset, config, range(config.num_agents))
    state = _initial_state(config, data, len(seeds), module)
    first = 1
    saved = _load_checkpoint(checkpoint, config, seeds, state)
    if saved:
        first = saved + 1
    writers: list[RunWriter] = []
    if write:
        for i, c in enumerate(configs):
            own = directories is not None  # the caller's folders (checkpointed runs), else fresh ones
            writers.append(RunWriter(c.to_mapping(), engine="batched",
                                     directory=directories[i] if own else c.out or c.default_out(),
                                     fresh=not own, save_weights=c.save_weights, resume_round=saved))
            if ledger:
                writers[-1].write_ledger(ledger)
                writers[-1].spent = functools.partial(privacy.ledger, config, total_samples=dataset.num_train)
    records: list[list[dict[str, Any]]] = [list(w.kept) for w in writers] or [[] for _ in seeds]
    bar = progress_bar(config.rounds, progress, initial=first - 1)
    last_save = time.monotonic()
    try:
        with closing(writers):
            for t in range(first, config.rounds + 1):
                started = time.perf_counter()
                magnitude = step(config, data, state, t, seeds, module=module, vectorize=vectorize)
                for writer in writers:  # round t released: a stop from here on states what it spent
                    writer.completed = t
                if data.x.is_cuda:
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - started
                if t % config.eval_every == 0 or t == config.rounds:
                    models = state.model(config, t)
                    for s in range(len(seeds)):
                        run_state, model = state.run(s), _run_of(models, s)
                        record = {
                            "round": t,
                            **central_metrics(model, dataset, config.beta, module),
                            "consensus-violation": consensus_violation(run_state.w, run_state.z),
                            "noise-magnitude": float(magnitude[s]),
                            "rho": schedules.rho_at(config, t),
                            "seconds": seconds,
                        }
                        records[s].append(record)
                        if writers:
                            writers[s].record(record, model)
                    if checkpoint is not None and (t == config.rounds
                                                   or time.monotonic() - last_save >= checkpoint_seconds):
                        _save_checkpoint(checkpoint, config, seeds, state, t)
                        last_save = time.monotonic()
                    if bar is not None:
                        mean_error = sum(r[-1]["test-error"] for r in records) / len(seeds)
                        bar.set_postfix({"test-error": f"{mean_error:.4f}"})
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    models = state.model(config, config.rounds)
    return [
        EngineResult(records=records[i], state=state.run(i), model=_run_of(models, i), config=c,
                     ledger=ledger, directory=writers[i].directory if writers else None)
        for i, c in enumerate(configs)
    ]


def step(config: RunConfig, data: AgentData, state: EngineState, t: int,
         seeds: Sequence[int] | None = None, active: torch.Tensor | None = None, *,
         module: nn.Module | None = None, vectorize: bool = True,
         randomness: Secret | None = None) -> torch.Tensor:
    """Round t of Algorithm 1 (or of OutP) in place, for every run of ``seeds``.

    The state has a leading run dimension (one per seed); ``seeds=None`` means the one
    run of ``config.seed``. ``active`` ([S, P] bool) marks the agents whose round counts:
    the others keep their z_p, last iterate and lambda_p, as a Flower agent that was not
    sampled or did not reply, while w still averages all P (eq. (4a)). By default it is the
    sample of :func:`dpadmm.iadmm.schedules.participants` (everyone when fraction-train is 1).
    With ``module`` the state is that module's parameters (one run) and the agents are
    updated chunk by chunk (:func:`_module_step`).
    Returns each run's mean noise magnitude over its active agents, an [S] tensor on the state's
    device: nothing in a round waits for the device (the caller reads it at evaluated rounds).
    ``randomness`` replaces the keyed draws with deployment randomness (one run; e.g. to recompute a
    deployment from its nodes' keys); participation stays keyed by the seed, which is public.
    """
    seeds = [config.seed] if seeds is None else seeds
    if active is None and config.fraction_train < 1:
        active = torch.zeros((len(seeds), config.num_agents), dtype=torch.bool)
        for s, seed in enumerate(seeds):
            active[s, schedules.participants(config, t, seed)] = True
    rho_t = schedules.rho_at(config, t)
    if module is not None:
        return _module_step(config, data, state, t, rho_t, None if active is None else active[0], module,
                            vectorize, randomness).reshape(1)
    if config.algorithm == "outp":
        result = agent_round(config, data, state.w, state.lam, state.z_chain, t, seeds, randomness=randomness)
        z, z_chain = _where(active, result.z_sent, state.z), _where(active, result.z_last, state.z_chain)
        state.w = global_update(z, state.lam, rho_t, config.server_update)
    else:
        state.w = global_update(state.z, state.lam, rho_t, config.server_update)
        result = agent_round(config, data, state.w, state.lam, state.z_chain, t, seeds, randomness=randomness)
        z, z_chain = _where(active, result.z_sent, state.z), _where(active, result.z_last, state.z_chain)
    reference = dual_reference(config.server_update, state.w, z)
    state.lam = _where(active, dual_update(state.lam, reference, z, rho_t), state.lam)
    state.z, state.z_chain = z, z_chain
    if active is None:
        return result.noise_magnitude.mean(dim=-1)
    mask = active.to(result.noise_magnitude)
    return (result.noise_magnitude * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


def _module_step(config: RunConfig, data: AgentData, state: EngineState, t: int, rho_t: float,
                 active: torch.Tensor | None, module: nn.Module, vectorize: bool,
                 randomness: Secret | None = None) -> torch.Tensor:
    """Round t for a module's parameters: w (line 5), then each chunk of active agents' local round
    and duals (lines 15-23), written into the state in place; the mean noise magnitude.

    An agent's round reads only its own state and w, so chunks of agents can be updated in
    place one after the other; chunks bound the temporaries (gradients, noise, E iterates)
    to about ``AGENT_CHUNK_BUDGET`` elements each.
    """
    state.w = global_update(state.z, state.lam, rho_t, config.server_update)
    agents = None if active is None else active.nonzero().flatten().to(data.x.device)
    count = config.num_agents if agents is None else agents.numel()
    chunk = max(1, AGENT_CHUNK_BUDGET // numel(state.w))
    magnitudes = []
    for c0 in range(0, count, chunk):
        # Everyone: a slice (views of the data); a sample of agents: an index tensor (copies).
        index = slice(c0, c0 + chunk) if agents is None else agents[c0:c0 + chunk]
        lam = {k: v[index] for k, v in state.lam.items()}
        z_chain = {k: v[index] for k, v in state.z_chain.items()}
        result = agent_round(config, data.select(index), state.w, lam, z_chain, t, module=module,
                             vectorize=vectorize, randomness=randomness)
        new_lam = dual_update(lam, state.w, result.z_sent, rho_t) if config.server_update == "admm" else lam
        for k in state.w:
            state.z[k][index] = result.z_sent[k]
            state.z_chain[k][index] = result.z_last[k]
            state.lam[k][index] = new_lam[k]
        magnitudes.append(result.noise_magnitude)
    if config.server_update == "mean":  # against the mean of every agent's release: after the last chunk
        reference = mean_release(state.z)
        index = slice(None) if agents is None else agents
        new_lam = dual_update({k: v[index] for k, v in state.lam.items()}, reference,
                              {k: v[index] for k, v in state.z.items()}, rho_t)
        for k in state.w:
            state.lam[k][index] = new_lam[k]
    return torch.cat(magnitudes).mean() if magnitudes else torch.zeros(())


def _initial_state(config: RunConfig, data: AgentData, runs: int, module: nn.Module | None) -> EngineState:
    """w = z_p = lambda_p = 0 for logistic regression ([S, P, J, K]); for a module w = z_p = its initial
    parameters (``dpadmm.models.modules.initial_parameters``) and lambda_p = 0, one run."""
    dtype, device = data.x.dtype, data.x.device
    if module is None:
        zeros = torch.zeros((runs, config.num_agents, *data.shape), dtype=dtype, device=device)
        return EngineState(w=zeros[:, 0].clone(), z=zeros.clone(), z_chain=zeros.clone(), lam=zeros.clone())
    w = initial_parameters(module, config.seed, dtype=dtype, device=device)
    z = {k: v.expand(config.num_agents, *v.shape).clone() for k, v in w.items()}
    z_chain = z if config.steps == 1 else {k: v.clone() for k, v in z.items()}
    return EngineState(w=w, z=z, z_chain=z_chain, lam={k: torch.zeros_like(v) for k, v in z.items()})


def _run_of(tree: Tree, s: int) -> Tree:
    """Run s of a batched tensor ([S, ...] -> [...]); a module's dict holds one run: itself."""
    return tree if isinstance(tree, Mapping) else tree[s]


def _where(active: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """new for the active agents ([S, P] mask), old for the rest; new itself when all are active."""
    if active is None:
        return new
    return torch.where(active.to(new.device)[..., None, None], new, old)


def _save_checkpoint(path: str | Path, config: RunConfig, seeds: list[int], state: EngineState,
                     t: int) -> None:
    """Write the state after round t atomically (a crash mid-write keeps the previous checkpoint)."""
    checkpoint.save(path, {"round": t, "config": config.to_mapping(), "seeds": seeds,
                           **{k: getattr(state, k) for k in ("w", "z", "z_chain", "lam")}})


def _load_checkpoint(path: str | Path | None, config: RunConfig, seeds: list[int],
                     state: EngineState) -> int | None:
    """Restore the state from a checkpoint of the same configuration and seeds; its round, or None."""
    saved = checkpoint.load(path, {"config": config.to_mapping(), "seeds": seeds},
                            defaults={"config": papers().to_mapping()})  # the defaults until keys were added
    if saved is None:
        return None
    for key in ("w", "z", "z_chain", "lam"):
        setattr(state, key, tree_map(lambda v, like: v.to(device=like.device, dtype=like.dtype), saved[key],
                                     getattr(state, key)))
    if isinstance(state.z, Mapping) and config.steps == 1:
        state.z_chain = state.z  # aliased, as when the run started
    return int(saved["round"])
