"""From a central data set to the agents' batched data (the papers' partition)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from dpadmm.data import Dataset, load_dataset, parse_scheme
from dpadmm.iadmm.config import RunConfig
from dpadmm.models.logistic import AgentData

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    """The compute device, with a clear error when CUDA is asked for but absent."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' is not available on this machine (torch.cuda.is_available() "
                         "is False); use device='cpu'")
    return torch.device(name)


def agent_data(dataset: Dataset, config: RunConfig, agents: Sequence[int]) -> AgentData:
    """The training blocks of ``agents`` (ids in 0..P-1) under the data set's partition, batched.

    I (``total``) is the whole training set's size: eq. (63) divides by the global count.
    """
    blocks = dataset.partition(config.num_agents)
    for p in agents:
        if not 0 <= p < config.num_agents:
            raise ValueError(f"agent id {p} is not allowed; it must be in 0..{config.num_agents - 1}")
    return AgentData.from_blocks(
        [dataset.x_train[blocks[p]] for p in agents],
        [dataset.y_train[blocks[p]] for p in agents],
        num_classes=dataset.num_classes,
        total=dataset.x_train.shape[0],
        agents=agents,
        dtype=DTYPES[config.dtype],
        device=resolve_device(config.device),
    )


def load_for(config: RunConfig) -> Dataset:
    """The configured data set, loaded once per process (Flower workers host many clients), its training
    rows dealt to the agents by ``config.partition`` (:meth:`dpadmm.data.Dataset.partitioned`).

    Callers must not modify the returned tensors in place.
    """
    if config.dataset == "femnist":  # its agents are the first P writers
        return _load(config.dataset, config.data_dir, config.num_agents)
    if not parse_scheme(config.partition).skewed:
        return _load(config.dataset, config.data_dir, None)
    return _partitioned(config.dataset, config.data_dir, config.num_agents, config.partition,
                        config.partition_seed)


@lru_cache(maxsize=2)
def _load(name: str, data_dir: str, num_agents: int | None) -> Dataset:
    return load_dataset(name, data_dir or None, num_agents)


@lru_cache(maxsize=2)
def _partitioned(name: str, data_dir: str, num_agents: int, scheme: str, seed: int) -> Dataset:
    return _load(name, data_dir, None).partitioned(num_agents, scheme, seed)
