"""Corrupted copies of real data files, for the tests of the loaders' checks (dpadmm.data.checks).

Each helper writes into a folder of the test's (tmp_path) and never touches ../shared/data: a slice of a
real file re-compressed, a file cut short, a byte flipped in the middle of its compressed data, a line
with bytes that are not UTF-8. The loaders must refuse each with one line naming the file.
"""

from __future__ import annotations

import gzip
from pathlib import Path


def head(source: Path, lines: int) -> list[bytes]:
    """The first ``lines`` lines of a real (gzip-compressed or plain) text file, each with its newline."""
    with (gzip.open if source.suffix == ".gz" else open)(source, "rb") as fh:
        return [line for line, _ in zip(fh, range(lines), strict=False)]


def write_gz(path: Path, lines: list[bytes]) -> Path:
    """``lines`` gzip-compressed into ``path`` (its folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(b"".join(lines)))
    return path


def truncated(path: Path) -> Path:
    """``path`` cut to half its bytes, in place: a download or copy that stopped early."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def flipped(path: Path) -> Path:
    """``path`` with the byte in its middle inverted, in place: compressed data damaged in storage (past any
    header, so the check sum or the decompressor finds it)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def not_utf8(lines: list[bytes], line: int) -> list[bytes]:
    """``lines`` with the byte 0xff put at the start of line ``line`` (1-based): bytes that are not text."""
    changed = list(lines)
    changed[line - 1] = b"\xff" + changed[line - 1]
    return changed
