"""How the training samples are shared out among the agents.

The papers (Ryu & Kim) give agent p the p-th contiguous block of the training set in its
standard order. On MNIST's standard order this gives IID-like agents; the embedded default
data set orders its training images round-robin over the classes for the same reason.
"""

from __future__ import annotations

import operator


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
