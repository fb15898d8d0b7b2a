"""dpadmm.files: a file is replaced whole or left as it was, and a private one is never readable by others."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from dpadmm.files import replacing, write_atomic


def test_a_file_is_replaced_whole_or_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    write_atomic(path, "first\n")
    write_atomic(path, b"second\n")
    assert path.read_text() == "second\n"
    with pytest.raises(RuntimeError, match="killed mid-write"), replacing(path) as tmp:
        tmp.write_text("half of a th")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temporary left behind


def test_a_private_file_is_the_owners_alone_from_its_first_byte(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    with replacing(path, private=True) as tmp:
        assert stat.S_IMODE(tmp.stat().st_mode) == 0o600  # before anything is written
        tmp.write_bytes(b"secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"secret"
    write_atomic(path, b"new secret", private=True)  # replacing a key keeps it private
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"new secret"
