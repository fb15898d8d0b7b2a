"""dpadmm.decentral.problem: an agent's view in simulation, from its own file in deployment, and a server's
view without data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dpadmm.cli import main
from dpadmm.data import Dataset
from dpadmm.data.adult import load_adult
from dpadmm.decentral.config import DecentralConfig
from dpadmm.decentral.problem import (
    agent_view,
    agents_samples,
    build,
    public_agents,
    read_agent_file,
    sample_rows,
    write_agent_files,
)


@pytest.fixture(scope="module")
def adult(binary_dir: Path) -> Dataset:
    return load_adult(binary_dir / "adult")


def test_an_agent_file_gives_the_simulated_agents_view(tmp_path: Path, adult: Dataset) -> None:
    """The deployed agent reading agent-<i>.npz knows exactly what the simulated agent i knows: its samples of
    the seed's draw (unit rows, labels +-1) in its row, zeros elsewhere, the public graph."""
    config = DecentralConfig(agents=4, edges=4, seed=3)
    paths = write_agent_files(adult, 4, 100, 3, tmp_path)
    assert [p.name for p in paths] == [f"agent-{i}.npz" for i in range(4)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in paths]  # renamed into place
    features, labels = agents_samples(adult, 4, 100, 3)
    for i, path in enumerate(paths):
        own, simulated = read_agent_file(config, i, path), agent_view(config, adult, i)
        for got, expected in ((own.features, simulated.features), (own.labels, simulated.labels),
                              (own.adjacency, simulated.adjacency)):
            assert torch.equal(got, expected)
        assert torch.equal(own.features[0, i], features[i]) and own.features[0, i - 1].abs().sum() == 0
        assert set(own.labels[0, i].tolist()) == {-1.0, 1.0}
        assert torch.equal(own.labels[0, i], labels[i].double())
    with pytest.raises(FileExistsError, match="agent-0.npz exists; give an empty --out folder"):
        write_agent_files(adult, 4, 100, 3, tmp_path)


def test_a_label_skewed_partition_deals_the_same_rows_and_the_files_follow_it(tmp_path: Path,
                                                                               adult: Dataset) -> None:
    """``partition`` deals the rows the seed draws (contiguous: the paper's i-th b, unchanged), b per
    agent; every view of the run (the engine's, an agent's in simulation, an agent's file) holds them."""
    plain = sample_rows(adult, 10, 100, 3)
    rows = {text: sample_rows(adult, 10, 100, 3, text)
            for text in ("contiguous", "dirichlet:0.1", "shards:1")}
    assert torch.equal(rows["contiguous"], plain)
    positive = {text: adult.y_train[r].double().mean(dim=1) for text, r in rows.items()}
    for r in rows.values():
        assert r.shape == (10, 100) and torch.equal(r.flatten().sort().values, plain.flatten().sort().values)
    assert positive["contiguous"].std() < 0.1 < 0.2 < positive["dirichlet:0.1"].std()
    assert ((positive["shards:1"] == 0) | (positive["shards:1"] == 1)).sum() >= 8  # one label, or the split
    config = DecentralConfig(agents=10, edges=12, seed=3, partition="dirichlet:0.1")
    paths = write_agent_files(adult, 10, 100, 3, tmp_path, "dirichlet:0.1")
    built = build(config, adult, [3])
    for i in (0, 9):
        own, simulated = read_agent_file(config, i, paths[i]), agent_view(config, adult, i)
        assert torch.equal(own.features, simulated.features) and torch.equal(own.labels, simulated.labels)
        assert torch.equal(simulated.features[0, i], built.agents.features[0, i])
        assert torch.equal(simulated.labels[0, i], 2 * adult.y_train[rows["dirichlet:0.1"][i]].double() - 1)


@pytest.mark.parametrize(("arrays", "message"), [
    ({"x": np.full((99, 14), 0.5), "y": np.zeros(99, dtype=np.int64)},
     "agent 1 holds 99 samples but the run has samples=100"),
    ({"x": np.full((100, 13), 0.5), "y": np.zeros(100, dtype=np.int64)},
     "agent 1's samples have 13 columns; adult has 14"),
    ({"x": np.full((100, 14), 0.5), "y": np.full(100, 2)}, "holds no usable sample"),
    ({"x": np.full((100, 14), 1.5), "y": np.zeros(100, dtype=np.int64)}, "holds no usable sample"),
])
def test_a_bad_agent_file_is_named(tmp_path: Path, arrays: dict, message: str) -> None:
    path = tmp_path / "agent-1.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=message):
        read_agent_file(DecentralConfig(agents=4, edges=4), 1, path)


def test_a_row_outside_the_agents_range_is_a_zero_row_not_a_refusal(tmp_path: Path) -> None:
    """One sample's value never decides whether a deployed agent answers: a row with another label or
    outside [0, 1] counts as a zero row of label 0 (it keeps its b samples, B_inf = 2/b holds)."""
    x, y = np.full((100, 14), 0.5), np.zeros(100, dtype=np.int64)
    x[3, 2], y[7] = 1.5, 2
    path = tmp_path / "agent-1.npz"
    np.savez(path, x=x, y=y)
    view = read_agent_file(DecentralConfig(agents=4, edges=4), 1, path)
    assert view.features[0, 1, 3].abs().sum() == 0 and view.features[0, 1, 7].abs().sum() == 0
    assert view.features[0, 1, 0].abs().sum() > 0


def test_an_agent_outside_the_run_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.npz"
    np.savez(path, x=np.full((100, 14), 0.5), y=np.zeros(100, dtype=np.int64))
    with pytest.raises(ValueError, match="partition-id=4 is not allowed; it must be in 0..3"):
        read_agent_file(DecentralConfig(agents=4, edges=4), 4, path)


def test_the_servers_view_holds_no_samples_and_the_graph(adult: Dataset) -> None:
    config = DecentralConfig(agents=5, edges=6, seed=2)
    public = public_agents(config)
    assert public.features.shape == (1, 5, 0, 14) and public.labels.shape == (1, 5, 0)
    assert torch.equal(public.adjacency, agent_view(config, adult, 0).adjacency)


def test_cli_writes_the_agents_files_and_says_where_they_go(tmp_path: Path, binary_dir: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "files"
    argv = ["deploy", "agents", "--data-dir", str(binary_dir / "adult"), "--agents", "3", "--seed", "7",
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"partition-id=2 data-path='{(out / 'agent-2.npz').resolve()}'" in printed
    assert "decentral.agents=3 decentral.samples=100 decentral.seed=7" in printed
    config = DecentralConfig(graph="complete", agents=3, seed=7)
    assert read_agent_file(config, 2, out / "agent-2.npz").features.shape == (1, 3, 100, 14)
    assert main(argv) == 2
    assert "agent-0.npz exists" in capsys.readouterr().err
