"""dpadmm.data.vertical: column blocks, padding, MNIST 4 against 9, aligned sample ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpadmm.data.vertical import MNIST_4V9_TRAIN, check_aligned, load_mnist_4v9, pad_blocks, split_columns


def test_blocks_are_contiguous_and_padding_adds_zero_columns() -> None:
    x = torch.arange(12.0).reshape(2, 6)
    blocks = split_columns(x, (4, 2))
    assert torch.equal(blocks[0], x[:, :4]) and torch.equal(blocks[1], x[:, 4:])
    padded, mask = pad_blocks(blocks)
    assert padded.shape == (2, 2, 4) and not padded[1, :, 2:].any()
    assert mask.tolist() == [[True] * 4, [True, True, False, False]]
    with pytest.raises(ValueError, match="cover 5 columns but the data set has 6"):
        split_columns(x, (3, 2))


def test_mnist_4v9_holds_the_4s_and_9s_in_file_order(mnist_dir: Path) -> None:
    data = load_mnist_4v9(mnist_dir)
    assert data.x_train.shape == (11791, 784) and data.x_test.shape == (1991, 784)  # 5842 + 5949, 982 + 1009
    assert int(data.y_train.sum()) == 5949 and int(data.y_test.sum()) == 1009
    assert len(data.y_train) == MNIST_4V9_TRAIN  # the count `dpadmm privacy` uses without reading the files


def test_misaligned_parties_are_named() -> None:
    check_aligned([["a", "b"], ["a", "b"]])
    with pytest.raises(ValueError, match="party 1's sample 1 is 'c', party 0's is 'b'"):
        check_aligned([["a", "b"], ["a", "c"]])
    with pytest.raises(ValueError, match="party 1 holds 1 samples, party 0 holds 2"):
        check_aligned([["a", "b"], ["a"]])
