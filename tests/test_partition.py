"""How the training samples are dealt to the agents: the papers' contiguous blocks and the heterogeneous
partitions (label skew by Dirichlet or shards, quantity skew) on real MNIST, a9a and ijcnn1 labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.data import Dataset, load_dataset
from dpadmm.data.libsvm import load_binary
from dpadmm.data.partition import (
    Scheme,
    equal_partition,
    parse_scheme,
    partition_contiguous,
    partition_indices,
)
from dpadmm.iadmm.config import papers
from dpadmm.iadmm.federation import agent_data, load_for

SCHEMES = ["contiguous", "dirichlet:0.1", "dirichlet:0.5", "dirichlet:1000", "shards:2", "quantity:0.5"]


@pytest.fixture(scope="module")
def mnist_labels(mnist_dir: Path) -> np.ndarray:
    return load_dataset("mnist", mnist_dir).y_train.numpy()


@pytest.fixture(scope="module")
def default() -> Dataset:
    return load_dataset("default")


def classes_per_agent(labels: np.ndarray, blocks: list[np.ndarray]) -> np.ndarray:
    return np.array([len(np.unique(labels[block])) for block in blocks])


@pytest.mark.parametrize("text", SCHEMES)
def test_every_sample_goes_to_one_agent_and_the_seed_fixes_the_draw(mnist_labels: np.ndarray,
                                                                     text: str) -> None:
    scheme = parse_scheme(text)
    assert str(scheme) == text
    blocks = partition_indices(mnist_labels, 100, scheme, seed=3)
    assert len(blocks) == 100
    assert np.array_equal(np.sort(np.concatenate(blocks)), np.arange(len(mnist_labels)))
    assert min(len(block) for block in blocks) >= 10  # the fewest an agent may get
    again = partition_indices(mnist_labels, 100, scheme, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(blocks, again, strict=True))
    if scheme.skewed:  # another seed, another draw
        other = partition_indices(mnist_labels, 100, scheme, seed=4)
        assert not all(np.array_equal(a, b) for a, b in zip(blocks, other, strict=True))


def test_the_schemes_skew_what_they_name(mnist_labels: np.ndarray) -> None:
    """On MNIST's 60,000 labels, 100 agents: label skew grows as alpha falls, shards give two classes,
    quantity skew keeps every class but spreads the sizes."""
    draw = {text: partition_indices(mnist_labels, 100, parse_scheme(text), seed=0) for text in SCHEMES}
    classes = {text: classes_per_agent(mnist_labels, blocks).mean() for text, blocks in draw.items()}
    sizes = {text: np.array([len(block) for block in blocks]) for text, blocks in draw.items()}
    assert classes["contiguous"] > 9.9 and classes["dirichlet:1000"] > 9.9 and classes["quantity:0.5"] > 9
    assert classes["dirichlet:0.1"] < 6 < classes["dirichlet:0.5"] < 9.9
    shards = classes_per_agent(mnist_labels, draw["shards:2"])  # a shard may straddle two digits
    assert np.median(shards) == 2 and shards.max() <= 4
    assert set(sizes["contiguous"]) == set(sizes["shards:2"]) == {600}
    assert sizes["quantity:0.5"].max() > 5 * sizes["quantity:0.5"].min()
    assert sizes["dirichlet:1000"].max() < 1.1 * sizes["dirichlet:1000"].min()


def test_the_label_skew_is_flower_datasets_partition(mnist_labels: np.ndarray) -> None:
    """The Dirichlet partition is the one a Flower app gets from DirichletPartitioner with the same
    parameters on a data set with this label column (its own shuffle only reorders each partition)."""
    import datasets
    from flwr_datasets.partitioner import DirichletPartitioner

    labels = mnist_labels[:20000]
    ours = partition_indices(labels, 20, parse_scheme("dirichlet:0.3"), seed=11)
    theirs = DirichletPartitioner(num_partitions=20, partition_by="label", alpha=0.3, min_partition_size=10,
                                  seed=11)
    theirs.dataset = datasets.Dataset.from_dict({"label": labels.tolist()})
    for p, block in enumerate(ours):
        flower = np.sort(np.asarray(theirs.load_partition(p)["label"]))
        assert np.array_equal(flower, np.sort(labels[block]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["a9a", "ijcnn1"])
def test_binary_labels_are_skewed_too(binary_dir: Path, name: str) -> None:
    """Two classes: Dirichlet(0.1) cannot give 50 agents 10 samples each (Flower's rule refuses it), 0.5
    can, and already spreads the agents' label fractions wide."""
    labels = load_binary(name, binary_dir / name).y_train.numpy()
    positive = labels.mean()
    near = partition_indices(labels, 50, parse_scheme("dirichlet:1000"), seed=0)
    skewed = partition_indices(labels, 50, parse_scheme("dirichlet:0.5"), seed=0)
    spread = [np.std([labels[block].mean() for block in blocks]) for blocks in (near, skewed)]
    assert spread[0] < 0.05 < 0.2 < spread[1]  # the agents' fractions of positive labels
    assert abs(np.mean([labels[block].mean() for block in near]) - positive) < 0.02
    shards = partition_indices(labels, 50, parse_scheme("shards:1"), seed=0)
    assert all(len(np.unique(labels[block])) <= 2 for block in shards)  # one shard, or its remainder


@pytest.mark.parametrize("text", ["dirichlet", "dirichlet:0", "dirichlet:-1", "shards:1.5", "shards:0",
                                  "quantity:nan", "quantity:inf", "iid", "contiguous:1", ""])
def test_a_bad_scheme_is_named_with_what_is_allowed(text: str) -> None:
    allowed = "give contiguous, dirichlet:ALPHA"
    with pytest.raises(ValueError, match=f"partition='{text}' is not allowed; {allowed}"):
        parse_scheme(text)


def test_impossible_partitions_are_refused_with_their_numbers() -> None:
    labels = np.repeat(np.arange(10), 60)
    with pytest.raises(ValueError, match="num-agents=100 is not allowed for 600 training samples with at "
                                         "least 10 each; it must be in 1..60"):
        partition_indices(labels, 100, parse_scheme("quantity:1"))
    with pytest.raises(ValueError, match=r"partition=dirichlet:0.01 could not give each of 50 agents at "
                                         r"least 10 of the 600 training samples .*give a larger alpha"):
        partition_indices(labels, 50, parse_scheme("dirichlet:0.01"))
    with pytest.raises(ValueError, match="partition=shards:20 gives 800 shards for 600 training samples"):
        partition_indices(labels, 40, parse_scheme("shards:20"), min_size=1)


def test_equal_partitions_keep_every_agents_size_and_skew_its_labels(mnist_labels: np.ndarray) -> None:
    """Agents that must hold b samples each (004's batched layout): Flower's InnerDirichletPartitioner and
    ShardPartitioner with equal shards; the same seed, the same partition."""
    labels = mnist_labels[:2000]
    for text in ("contiguous", "dirichlet:0.1", "dirichlet:1000", "shards:2"):
        rows = equal_partition(labels, 20, parse_scheme(text), seed=5)
        assert rows.shape == (20, 100) and np.array_equal(np.sort(rows.ravel()), np.arange(2000)), text
        assert np.array_equal(rows, equal_partition(labels, 20, parse_scheme(text), seed=5)), text
        classes = np.median([len(np.unique(labels[row])) for row in rows])
        assert {"contiguous": classes == 10, "dirichlet:1000": classes == 10, "dirichlet:0.1": classes <= 5,
                "shards:2": classes <= 3}[text], (text, classes)
    assert np.array_equal(equal_partition(labels, 20, Scheme(), seed=5), np.arange(2000).reshape(20, 100))
    assert not np.array_equal(equal_partition(labels, 20, parse_scheme("dirichlet:0.1"), seed=5),
                              equal_partition(labels, 20, parse_scheme("dirichlet:0.1"), seed=6))


def test_the_equal_dirichlet_partition_is_flower_datasets_partition(mnist_labels: np.ndarray) -> None:
    import datasets
    from flwr_datasets.partitioner import InnerDirichletPartitioner

    labels = mnist_labels[:1000]
    theirs = InnerDirichletPartitioner(partition_sizes=[50] * 20, partition_by="label", alpha=0.3, seed=2)
    theirs.dataset = datasets.Dataset.from_dict({"label": labels.tolist()})
    for p, row in enumerate(equal_partition(labels, 20, parse_scheme("dirichlet:0.3"), seed=2)):
        assert np.array_equal(np.sort(labels[row]), np.sort(theirs.load_partition(p)["label"]))


def test_what_equal_partitions_cannot_deal_is_named() -> None:
    labels = np.repeat(np.arange(2), 50)
    with pytest.raises(ValueError, match=r"partition=quantity:1 is not allowed with 10 samples per agent: "
                                         r"every agent holds the same number of samples"):
        equal_partition(labels, 10, parse_scheme("quantity:1"))
    with pytest.raises(ValueError, match="partition=shards:3 is not allowed with 10 samples per agent"):
        equal_partition(labels, 10, parse_scheme("shards:3"))
    with pytest.raises(ValueError, match="100 labels .* cannot be dealt equally to num-agents=7"):
        equal_partition(labels, 7, Scheme())
    with pytest.raises(ValueError, match=r"partition=dirichlet:1e-06 could not deal 100 samples to each of "
                                         r"10 agents .*give a larger alpha"):
        equal_partition(np.random.default_rng(0).integers(0, 10, 1000), 10, parse_scheme("dirichlet:1e-6"))


def test_contiguous_is_the_papers_blocks() -> None:
    blocks = partition_indices(np.zeros(103, dtype=np.int64), 10, Scheme(), min_size=1)
    assert [(b[0], b[-1] + 1) for b in blocks] == [(s.start, s.stop) for s in partition_contiguous(103, 10)]


def test_a_partitioned_data_set_keeps_each_sample_with_its_label(default: Dataset) -> None:
    dealt = default.partitioned(10, "shards:2", seed=1)
    assert default.partitioned(10, "contiguous") is default
    assert dealt.num_train == default.num_train and sum(dealt.agent_sizes) == default.num_train
    assert torch.equal(dealt.x_test, default.x_test) and torch.equal(dealt.y_test, default.y_test)
    blocks = partition_indices(default.y_train.numpy(), 10, parse_scheme("shards:2"), seed=1)
    for block, rows in zip(blocks, dealt.partition(10), strict=True):
        assert torch.equal(dealt.x_train[rows], default.x_train[torch.from_numpy(block)])
        assert torch.equal(dealt.y_train[rows], default.y_train[torch.from_numpy(block)])
        assert len(torch.unique(dealt.y_train[rows])) <= 2
    with pytest.raises(ValueError, match="num-agents=5 does not match data set 'default', whose training "
                                         "samples are dealt to 10 agents"):
        dealt.partition(5)


def test_femnist_keeps_its_writers(femnist_dir: Path) -> None:
    with pytest.raises(ValueError, match="partition='dirichlet:0.5' is not allowed with dataset='femnist', "
                                         "whose agents are its writers"):
        papers(dataset="femnist", partition="dirichlet:0.5")
    writers = load_dataset("femnist", femnist_dir, 5)
    with pytest.raises(ValueError, match="partition=shards:2 is not allowed with data set 'femnist'"):
        writers.partitioned(5, "shards:2")


def test_a_run_config_deals_the_agents_their_partition() -> None:
    """``partition`` and ``partition-seed`` reach the agents' batched data (the engine and the Flower
    clients read it through ``load_for``)."""
    with pytest.raises(ValueError, match="partition='dirichlet:x' is not allowed"):
        papers(partition="dirichlet:x")
    with pytest.raises(ValueError, match=r"partition-seed=-1 is not allowed; it must satisfy 0 <= seed"):
        papers(partition_seed=-1)
    config = papers(num_agents=10, partition="shards:1", partition_seed=2)
    data = agent_data(load_for(config), config, range(10))
    assert load_for(config) is load_for(config)  # once per process
    for p in range(10):
        labels = data.y[p][: int(data.counts[p])].argmax(dim=1)
        assert len(torch.unique(labels)) == 1
