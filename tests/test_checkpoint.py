"""dpadmm.runs.checkpoint: checkpoints are read without running code, and a file that does not read is named
in one line with what to do (tests/test_cli.py shows the line where a user meets it, `dpadmm train`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpadmm.runs import checkpoint


class _Planted:
    """A pickled object whose loading would write a file: what a replaced checkpoint could hold."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return exec, (f"open({str(self.path)!r}, 'w').write('ran')",)


def _damaged(folder: Path) -> dict[str, Path]:
    """One file per way a checkpoint goes wrong, beside a good one."""
    good = folder / "good.pt"
    checkpoint.save(good, {"round": 3, "w": torch.ones(4)})
    raw = good.read_bytes()
    files = {"truncated": raw[: len(raw) // 2], "garbage": b"not a checkpoint", "empty": b""}
    paths = {name: folder / f"{name}.pt" for name in [*files, "code", "no-round"]}
    for name, content in files.items():
        paths[name].write_bytes(content)
    torch.save({"round": 3, "w": _Planted(folder / "ran")}, paths["code"])
    torch.save({"w": torch.ones(4)}, paths["no-round"])
    return paths


def test_a_checkpoint_reads_back_and_a_damaged_one_is_named_in_one_line(tmp_path: Path) -> None:
    paths = _damaged(tmp_path)
    assert checkpoint.read(tmp_path / "good.pt")["round"] == 3
    for name, path in paths.items():
        with pytest.raises(ValueError) as refused:
            checkpoint.read(path)
        said = str(refused.value)
        assert "\n" not in said and str(path) in said and "delete it" in said, (name, said)
        assert "weights_only=False" not in said  # torch's advice to load it unsafely is not passed on
        with pytest.raises(ValueError, match="delete it"):  # the engine's and the strategy's reader
            checkpoint.load(path, {})
    assert not (tmp_path / "ran").exists()  # the planted code never ran

