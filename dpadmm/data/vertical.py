"""Vertical (feature-partitioned) data: every party holds the same samples and a contiguous block of columns.

- :func:`split_columns` cuts a feature matrix into blocks of the given widths, in order (001's a9a
  split is 66 and 57 columns);
- :func:`pad_blocks` stacks blocks of different widths as [M, N, d_max] with zero columns, which
  the batched engine multiplies without changing any party's result, and a mask of the real ones;
- :func:`load_mnist_4v9` is MNIST's digits 4 (label 0) and 9 (label 1), 784 pixels: the stand-in for
  001's gisette, which was built from these two digits and cannot be obtained here;
- :func:`check_aligned` checks that the parties list the same sample ids in the same order, which
  vertical learning assumes (the rows of all blocks are the same samples).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from dpadmm.data import Dataset

MNIST_4V9_DIGITS = (4, 9)
MNIST_4V9_TRAIN = 11791  # 5,842 fours and 5,949 nines in MNIST's training file (a public count)
VERTICAL_TRAIN = {"a9a": 32561, "mnist-4v9": MNIST_4V9_TRAIN}  # N of the vertical data sets


def split_columns(x: torch.Tensor, widths: Sequence[int]) -> list[torch.Tensor]:
    """The contiguous column blocks of ``x`` [N, J] with the given widths, which must sum to J."""
    if sum(widths) != x.shape[1]:
        raise ValueError(f"parties={','.join(map(str, widths))!r} cover {sum(widths)} columns but the data "
                         f"set has {x.shape[1]}; give widths that sum to {x.shape[1]}")
    return list(torch.split(x, list(widths), dim=1))


def pad_blocks(blocks: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks [M, N, d_max], zero columns after each block's own; mask [M, d_max] of the real columns)."""
    width = max(b.shape[1] for b in blocks)
    padded = torch.zeros((len(blocks), blocks[0].shape[0], width), dtype=blocks[0].dtype,
                         device=blocks[0].device)
    mask = torch.zeros((len(blocks), width), dtype=torch.bool, device=blocks[0].device)
    for m, block in enumerate(blocks):
        padded[m, :, :block.shape[1]] = block
        mask[m, :block.shape[1]] = True
    return padded, mask


def load_mnist_4v9(data_dir: str | os.PathLike) -> Dataset:
    """MNIST's 4s and 9s from the IDX files in ``data_dir``, in the files' order; label 1 for a 9."""
    from dpadmm.data.mnist import load_mnist

    full = load_mnist(data_dir)
    parts = []
    for x, y in ((full.x_train, full.y_train), (full.x_test, full.y_test)):
        keep = (y == MNIST_4V9_DIGITS[0]) | (y == MNIST_4V9_DIGITS[1])
        parts += [x[keep], (y[keep] == MNIST_4V9_DIGITS[1]).to(torch.int64)]
    return Dataset(name="mnist-4v9", x_train=parts[0], y_train=parts[1], x_test=parts[2], y_test=parts[3],
                   num_classes=2)


def check_aligned(ids: Sequence[Sequence[object]]) -> None:
    """A ValueError naming the first party and position where the parties' sample ids differ."""
    first = list(ids[0])
    for m, other in enumerate(ids[1:], start=1):
        other = list(other)
        if len(other) != len(first):
            raise ValueError(f"party {m} holds {len(other)} samples, party 0 holds {len(first)}: vertical "
                             "learning needs the same samples at every party")
        for i, (a, b) in enumerate(zip(first, other, strict=True)):
            if a != b:
                raise ValueError(f"party {m}'s sample {i} is {b!r}, party 0's is {a!r}: the parties' sample "
                                 "ids must be aligned (the same samples in the same order)")
