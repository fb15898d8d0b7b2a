"""How the training samples are shared out among the agents.

The papers (Ryu & Kim) give agent p the p-th contiguous block of the training set in its
standard order. On MNIST's standard order this gives IID-like agents; the embedded default
data set orders its training images round-robin over the classes for the same reason.

Federated learning's hard case is the opposite: agents whose data differ. :class:`Scheme` names the
heterogeneous partitions (label skew by a Dirichlet draw or by shards, quantity skew) and
:func:`partition_indices` draws one, seeded, from the labels alone; :meth:`dpadmm.data.Dataset.partitioned`
reorders a data set so that each agent's samples are one block again, which every family reads as it reads
the papers' blocks.
"""

from __future__ import annotations

import math
import operator
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import datasets
    import numpy as np
    from flwr_datasets.partitioner import Partitioner


def partition_contiguous(num_samples: int, num_agents: int) -> list[slice]:
    """Cut ``range(num_samples)`` into ``num_agents`` contiguous blocks, in order.

    The blocks are equal when ``num_agents`` divides ``num_samples``; otherwise their sizes
    differ by at most one and the earlier blocks are the larger ones (the rule of
    ``numpy.array_split``). Block ``p`` is ``slice(start, stop)`` with step ``None``, so
    ``x[blocks[p]]`` is a view of the p-th agent's rows.

    Raises ``ValueError`` if ``num_agents < 1``, ``num_agents > num_samples`` (an agent
    would get no sample) or ``num_samples < 0``; ``TypeError`` for non-integers.
    """
    num_samples = operator.index(num_samples)
    num_agents = operator.index(num_agents)
    if num_samples < 0:
        raise ValueError(f"num_samples={num_samples} must be >= 0")
    if num_agents < 1:
        raise ValueError(f"num_agents={num_agents} must be >= 1")
    if num_agents > num_samples:
        raise ValueError(
            f"num_agents={num_agents} is larger than num_samples={num_samples}; "
            "every agent needs at least one sample"
        )
    base, extra = divmod(num_samples, num_agents)
    blocks = []
    start = 0
    for p in range(num_agents):
        stop = start + base + (1 if p < extra else 0)
        blocks.append(slice(start, stop))
        start = stop
    return blocks


@dataclass(frozen=True)
class Scheme:
    """How the training samples are dealt out, as written in a run configuration (``partition``).

    - ``contiguous``: the papers' contiguous blocks of the standard order (near-IID on MNIST);
    - ``dirichlet:ALPHA``: label skew; each class is split among the agents in proportions drawn from a
      symmetric Dirichlet(ALPHA) (Yurochkin et al., ICML 2019; Hsu et al., 2019): 0.1 gives most agents one
      or two dominant classes, 1000 is near-IID;
    - ``shards:K``: pathological label skew; the samples sorted by label are cut into K shards per agent
      and each agent gets K of them at random (McMahan et al., AISTATS 2017: K = 2);
    - ``quantity:ALPHA``: quantity skew; the agents' sizes are drawn from a Dirichlet(ALPHA) over the
      agents (Li et al., ICDE 2022, NIID-Bench), their samples IID.

    The partition is public (it is the problem, not a secret of any agent): the same ``(scheme, labels,
    agents, seed)`` gives the same partition on every machine, and a privacy statement covers the samples
    within it (neighbouring data sets change one sample of one agent, the partition's sizes fixed).
    """

    name: str = "contiguous"
    value: float = 0.0

    def __str__(self) -> str:
        return f"{self.name}:{self.value:g}" if self.skewed else self.name

    @property
    def skewed(self) -> bool:
        """Whether the agents' samples are dealt by this scheme rather than the data set's own order."""
        return self.name != "contiguous"


def parse_scheme(text: str) -> Scheme:
    """The :class:`Scheme` written as ``text``; ``ValueError`` names the value and what is allowed."""
    allowed = "contiguous, dirichlet:ALPHA (ALPHA > 0), shards:K (K >= 1) or quantity:ALPHA (ALPHA > 0)"
    name, colon, rest = str(text).strip().partition(":")
    if name == "contiguous" and not colon:
        return Scheme()
    if name in ("dirichlet", "quantity", "shards") and colon:
        try:
            value = float(rest)
        except ValueError:
            value = math.nan
        if name == "shards" and value.is_integer() and value >= 1:
            return Scheme(name, value)
        if name != "shards" and math.isfinite(value) and value > 0:
            return Scheme(name, value)
    raise ValueError(f"partition={text!r} is not allowed; give {allowed}")


def partition_indices(labels: np.ndarray, num_agents: int, scheme: Scheme, seed: int = 0,
                      min_size: int = 10) -> list[np.ndarray]:
    """Each agent's training indices (sorted) under ``scheme``, drawn with ``seed``; every index goes to
    exactly one agent.

    The label-skew schemes are Flower Datasets' ``DirichletPartitioner`` and ``ShardPartitioner`` (the ones
    Flower users run, on ``labels`` as a one-column data set), so a partition here is the partition a Flower
    app with those partitioners and this seed gets. ``min_size`` is the fewest samples an agent may get: the
    Dirichlet draws are repeated until it holds (Flower's rule), and the quantity draw gives every agent
    ``min_size`` before sharing out the rest. ``contiguous`` gives :func:`partition_contiguous`'s blocks.
    """
    import numpy as np

    labels = np.asarray(labels)
    num_agents = operator.index(num_agents)
    if labels.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {labels.shape}")
    if not 1 <= num_agents * max(min_size, 1) <= len(labels):
        raise ValueError(f"num-agents={num_agents} is not allowed for {len(labels)} training samples with at "
                         f"least {min_size} each; it must be in 1..{len(labels) // max(min_size, 1)}")
    if not scheme.skewed:
        return [np.arange(len(labels))[block] for block in partition_contiguous(len(labels), num_agents)]
    if scheme.name == "quantity":
        return _quantity(len(labels), num_agents, scheme.value, seed, min_size)
    from flwr_datasets.partitioner import DirichletPartitioner

    if scheme.name == "dirichlet":
        partitioner = DirichletPartitioner(num_partitions=num_agents, partition_by="label",
                                           alpha=scheme.value, min_partition_size=min_size,
                                           self_balancing=False, shuffle=False, seed=seed)
    else:
        partitioner = _shards(scheme, labels, num_agents, seed)
    try:
        blocks = _flower_blocks(partitioner, labels, num_agents)
    except ValueError as error:  # Flower's Dirichlet partitioner gives up after 10 draws
        raise ValueError(f"partition={scheme} could not give each of {num_agents} agents at least "
                         f"{min_size} of the {len(labels)} training samples ({error}); give a larger "
                         "alpha or fewer agents") from error
    if scheme.name == "shards":  # Flower drops the remainder of the shards; it goes round the agents
        taken = np.zeros(len(labels), dtype=bool)
        for block in blocks:
            taken[block] = True
        rest = np.flatnonzero(~taken)
        blocks = [np.sort(np.concatenate([block, rest[p::num_agents]])) for p, block in enumerate(blocks)]
    return blocks


def equal_partition(labels: np.ndarray, num_agents: int, scheme: Scheme, seed: int = 0) -> np.ndarray:
    """Each agent's indices, sorted, as the rows of a ``[num_agents, b]`` array: ``scheme`` dealing
    ``labels`` (b per agent, every index to exactly one agent) to agents that must all hold the same
    number of samples (the batched layout of decentralised agents, each drawing b rows).

    Flower Datasets' partitioners that keep the sizes fixed: ``InnerDirichletPartitioner`` for
    ``dirichlet:ALPHA`` (each agent's class proportions drawn from a symmetric Dirichlet(ALPHA), its b samples
    drawn one by one from them; Acar et al., ICLR 2021), and ``ShardPartitioner`` for ``shards:K``, whose
    N K shards are then b / K samples each (K must divide b). ``contiguous`` gives the labels' order cut
    into blocks of b; ``quantity:ALPHA`` would change the sizes and is refused.
    """
    import numpy as np

    labels = np.asarray(labels)
    num_agents = operator.index(num_agents)
    if labels.ndim != 1 or num_agents < 1 or len(labels) % num_agents:
        raise ValueError(f"{len(labels)} labels (shape {labels.shape}) cannot be dealt equally to "
                         f"num-agents={num_agents}")
    size = len(labels) // num_agents
    if not scheme.skewed:
        return np.arange(len(labels)).reshape(num_agents, size)
    check_equal_sizes(scheme, size)
    from flwr_datasets.partitioner import InnerDirichletPartitioner

    if scheme.name == "dirichlet":
        # Flower's partitioner reads the classes as 0..C-1
        labels = np.unique(labels, return_inverse=True)[1]
        partitioner = InnerDirichletPartitioner(partition_sizes=[size] * num_agents, partition_by="label",
                                                alpha=float(scheme.value), shuffle=False, seed=seed)
    else:
        partitioner = _shards(scheme, labels, num_agents, seed)
    try:
        return np.stack(_flower_blocks(partitioner, labels, num_agents))
    except ValueError as error:  # an agent whose Dirichlet draw put all its mass on classes used up
        raise ValueError(f"partition={scheme} could not deal {size} samples to each of {num_agents} agents "
                         f"({error}); give a larger alpha") from error


def check_equal_sizes(scheme: Scheme, size: int) -> None:
    """Raise ``ValueError`` (naming the value and what is allowed) unless :func:`equal_partition` can deal
    ``scheme`` to agents of ``size`` samples each: ``quantity:`` changes the sizes, and ``shards:K`` needs
    equal shards of ``size / K``. A configuration calls it before any data loads."""
    if scheme.name == "quantity" or (scheme.name == "shards" and size % int(scheme.value)):
        raise ValueError(f"partition={scheme} is not allowed with {size} samples per agent: every agent "
                         f"holds the same number of samples; give contiguous, dirichlet:ALPHA or shards:K "
                         f"with K dividing {size}")


def _shards(scheme: Scheme, labels: np.ndarray, num_agents: int, seed: int) -> Partitioner:
    """Flower's ``ShardPartitioner`` for ``shards:K``: the labels sorted, K shards per agent."""
    from flwr_datasets.partitioner import ShardPartitioner

    shards = int(scheme.value) * num_agents
    if shards > len(labels):
        raise ValueError(f"partition={scheme} gives {shards} shards for {len(labels)} training samples; "
                         "give fewer shards per agent or fewer agents")
    return ShardPartitioner(num_partitions=num_agents, partition_by="label",
                            num_shards_per_partition=int(scheme.value), shuffle=False, seed=seed)


def _flower_blocks(partitioner: Partitioner, labels: np.ndarray, num_agents: int) -> list[np.ndarray]:
    """The sorted indices of each agent under a Flower Datasets partitioner, run on ``labels`` as a
    one-column data set.

    Each partition is read as one batch (``[:]``): its ``["index"]`` column alone is a lazy column that
    numpy would read row by row (2 of the 3 s a Dirichlet draw of MNIST for 100 agents took). The
    partitioners read the whole label column the same way (``np.array(dataset["label"])``), which the data
    set given to them answers with an array (:func:`_columns_as_arrays`): the same labels, 1 s less for
    MNIST's 60,000.
    """
    import numpy as np

    partitioner.dataset = _columns_as_arrays({"label": labels.tolist(),
                                              "index": np.arange(len(labels)).tolist()})
    with warnings.catch_warnings():  # Flower warns at each Dirichlet redraw (its rule), pyarrow of its API
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return [np.sort(np.asarray(partitioner.load_partition(p)[:]["index"], dtype=np.int64))
                for p in range(num_agents)]


def _columns_as_arrays(columns: dict[str, list]) -> datasets.Dataset:
    """A Hugging Face data set of ``columns`` whose whole columns read as numpy arrays.

    ``datasets`` 4 returns a lazy ``Column`` for ``dataset[name]``, which ``np.array`` turns into an array
    one row at a time (a Python call per row). Only a data set without a row selection (the one a
    partitioner is given) reads the column from its Arrow table at once; a selection (a partition) reads as
    ``datasets`` does.
    """
    import datasets

    class ArrayColumns(datasets.Dataset):
        def __getitem__(self, key):  # type: ignore[no-untyped-def]
            if isinstance(key, str) and self._indices is None:
                return self.data.column(key).to_numpy()
            return super().__getitem__(key)

    return ArrayColumns.from_dict(columns)


def _quantity(num_samples: int, num_agents: int, alpha: float, seed: int, min_size: int) -> list[np.ndarray]:
    """Quantity skew: sizes ``min_size + multinomial(rest, Dirichlet(alpha))``, samples in a seeded random
    order cut into blocks of those sizes."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rest = num_samples - num_agents * min_size
    sizes = min_size + rng.multinomial(rest, rng.dirichlet(np.full(num_agents, alpha)))
    order = rng.permutation(num_samples)
    stops = np.cumsum(sizes)
    return [np.sort(order[stop - size:stop]) for stop, size in zip(stops, sizes, strict=True)]
