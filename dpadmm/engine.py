"""The batched engine: every agent of Algorithm 1 at once on one device.

It runs the identical mathematics as the Flower app (the same functions of
``dpadmm.local`` and ``dpadmm.consensus``, the same keyed noise) without the framework's
per-message overhead, for research sweeps. Only the loop over rounds lives here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpadmm import privacy, schedules
from dpadmm.config import RunConfig
from dpadmm.consensus import consensus_violation, dual_update, global_update
from dpadmm.data import Dataset
from dpadmm.federation import agent_data, load_for
from dpadmm.local import agent_round
from dpadmm.models import AgentData
from dpadmm.privacy import Ledger
from dpadmm.results import RunWriter, central_metrics


@dataclass
class EngineState:
    """The state of Algorithm 1 after a round: all agents' variables, stacked."""

    w: torch.Tensor  # [J, K] the global model of the last round
    z: torch.Tensor  # [P, J, K] the last released z_p
    z_chain: torch.Tensor  # [P, J, K] the last local iterate z_p^{t,E+1}
    lam: torch.Tensor  # [P, J, K] lambda_p


@dataclass(frozen=True)
class EngineResult:
    """The evaluated rounds, the final state and where the run was written (None if not)."""

    records: list[dict[str, Any]]
    state: EngineState
    directory: Path | None
    config: RunConfig  # as run: epsilon calibrated when target-epsilon was set
    ledger: Ledger | None  # None for non-private runs


def run(
    config: RunConfig,
    *,
    dataset: Dataset | None = None,
    write: bool = True,
    progress: bool = True,
) -> EngineResult:
    """Train with every agent batched; record (and write) one metrics dict per evaluated round.

    Each dict has ``round``, ``test-error``, ``train-loss``, ``consensus-violation``
    (sum_p |w - z_p| / P), ``noise-magnitude`` (mean |noise| over agents, steps and
    coordinates), ``rho`` and ``seconds`` (wall time of the round's computation).
    """
    config = privacy.calibrate(config)
    dataset = load_for(config) if dataset is None else dataset
    ledger = privacy.ledger(config, total_samples=dataset.num_train) if config.private else None
    data = agent_data(dataset, config, range(config.num_agents))
    zeros = torch.zeros((config.num_agents, *data.shape), dtype=data.x.dtype, device=data.x.device)
    state = EngineState(w=zeros[0].clone(), z=zeros.clone(), z_chain=zeros.clone(), lam=zeros.clone())
    writer = RunWriter(config, engine="batched") if write else None
    if writer and ledger:
        writer.write_ledger(ledger)
    records: list[dict[str, Any]] = []
    bar = _progress(config.rounds, progress)
    try:
        for t in range(1, config.rounds + 1):
            started = time.perf_counter()
            magnitude = step(config, data, state, t)
            if data.x.is_cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            if t % config.eval_every == 0 or t == config.rounds:
                record = {
                    "round": t,
                    **central_metrics(state.w, dataset, config.beta),
                    "consensus-violation": consensus_violation(state.w, state.z),
                    "noise-magnitude": magnitude,
                    "rho": schedules.rho_at(config, t),
                    "seconds": seconds,
                }
                records.append(record)
                if writer:
                    writer.record(record, state.w)
                if bar is not None:
                    bar.set_postfix({"test-error": f"{record['test-error']:.4f}"})
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        if writer:
            writer.close()
    return EngineResult(records=records, state=state, directory=writer.directory if writer else None,
                        config=config, ledger=ledger)


def step(config: RunConfig, data: AgentData, state: EngineState, t: int) -> float:
    """Round t of Algorithm 1 (or of OutP) in place; returns the mean noise magnitude."""
    rho_t = schedules.rho_at(config, t)
    if config.algorithm == "outp":
        result = agent_round(config, data, state.w, state.lam, state.z_chain, t)
        state.w = global_update(result.z_sent, state.lam, rho_t)
    else:
        state.w = global_update(state.z, state.lam, rho_t)
        result = agent_round(config, data, state.w, state.lam, state.z_chain, t)
    state.lam = dual_update(state.lam, state.w, result.z_sent, rho_t)
    state.z, state.z_chain = result.z_sent, result.z_last
    return float(result.noise_magnitude.mean())


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="round", desc="dpadmm")
