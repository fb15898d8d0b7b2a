"""The checks every loader of :mod:`dpadmm.data` applies to what it reads, in one place.

A data file is read far from where its values are used: a NaN pixel surfaces as a model of NaNs with
test accuracy 0, a label outside the classes as a wrong class or an index error deep inside an update,
a cut-off download as a traceback from ``gzip``. So every loader refuses such a file where it reads it,
with one line that names the file, the line or record where that applies, the value and what is
allowed (a :class:`DataError`). The loaders share these functions rather than each keeping its own
copy, so every format is held to the same rules and words:

- :func:`read_bytes` and :func:`open_text` read a file, plain or gzip-compressed (recognised by its
  first bytes, as MNIST's IDX reader always did), and turn a cut-off or damaged stream, an empty file
  and bytes that are not UTF-8 text into a :class:`DataError`;
- :func:`load_npz` reads the named arrays of a NumPy ``.npz`` (a zip file) in the same way;
- :func:`require_keys`, :func:`require_width` and :func:`require_array` check the layout: the keys,
  arrays or columns a format needs, the number of fields of a record, an array's dimensions and type;
- :func:`require_finite`, :func:`require_labels` and :func:`require_nonempty` check the values.

The value checks are vectorised: they look at the whole array at once and, only when it fails, find
the first offending record, so that a good file costs little more than reading it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import zipfile
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from dpadmm.files import replacing

__all__ = [
    "DataError",
    "Where",
    "load_npz",
    "open_text",
    "read_bytes",
    "require_array",
    "require_finite",
    "require_keys",
    "require_labels",
    "require_nonempty",
    "require_width",
    "row",
    "write_npz",
]

_GZIP_MAGIC = b"\x1f\x8b"
# EOFError: the stream ends before its end marker (a cut-off file); BadGzipFile (an OSError): a bad header
# or check sum; zlib.error: damaged compressed data. Other OSErrors (permissions, a failing disk) are not
# the data's fault and pass through unchanged.
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)
# What reading a damaged .npz raises: zipfile's own error (no zip, a bad CRC), zlib's, a cut-off member,
# and numpy's ValueError for content that is not an .npy array (or needs pickle).
_NPZ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, ValueError)

Where = Callable[[tuple[int, ...]], str]
"""Names the record that holds the element at a numpy index, e.g. ``(17, 3)`` -> ``"line 18, column 3"``."""


class DataError(ValueError):
    """Data that no run can use: ``str(error)`` is one line ``<source> [<where>]: <problem>``.

    ``source`` is what holds the data as the user named it (a path, or a config key and a path),
    ``where`` the line or record inside it ("line 17", "row 3 (id 11)"; empty when the whole file is
    at fault) and ``problem`` the value found and what is allowed. A ``ValueError``, so that every
    caller that reports bad input (the command line, a Flower client) reports this one too.
    """

    def __init__(self, source: str | os.PathLike, problem: str, where: str = "") -> None:
        self.source = os.fspath(source)
        self.where = where
        self.problem = problem
        super().__init__(f"{self.source}{' ' + where if where else ''}: {problem}")


def row(index: tuple[int, ...]) -> str:
    """The default :data:`Where`: ``row i`` of an array, and its column when it has two dimensions."""
    return f"row {index[0]}" + (f", column {index[1]}" if len(index) > 1 else "")


def _require_bytes(source: str | os.PathLike, size: int) -> None:
    if size == 0:
        raise DataError(source, "the file is empty (0 bytes); allowed: a file that holds the data")


def read_bytes(path: str | os.PathLike) -> bytes:
    """The content of ``path``, decompressed when it starts with the gzip magic bytes 1f 8b.

    Raises :class:`DataError` for an empty file or content, and for a gzip stream that is cut off or
    damaged; ``FileNotFoundError`` and other ``OSError``s of the file system pass through.
    """
    path = Path(path)
    data = path.read_bytes()
    _require_bytes(path, len(data))
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except _GZIP_ERRORS as err:
            raise _damaged(path, err) from err
        _require_bytes(path, len(data))
    return data


@contextlib.contextmanager
def open_text(path: str | os.PathLike) -> Iterator[TextIO]:
    """``with open_text(path) as fh:`` a UTF-8 text stream of ``path``, plain or gzip-compressed.

    The stream is read as the caller goes (a large file is never held twice), and whatever goes wrong
    with the bytes while the caller reads is raised from the ``with`` statement as a
    :class:`DataError` naming the file: an empty file, a gzip stream that is cut off or damaged, and
    bytes that are not UTF-8 text, with the line that holds the first of them. Lines end as in
    :func:`open`'s text mode (``\\r\\n`` and ``\\r`` read as ``\\n``).
    """
    path = Path(path)
    with open(path, "rb") as raw:
        head = raw.read(2)
        _require_bytes(path, len(head))
        raw.seek(0)
        binary: Any = gzip.GzipFile(fileobj=raw, mode="rb") if head == _GZIP_MAGIC else raw
        try:
            with io.TextIOWrapper(binary, encoding="utf-8") as text:
                yield text
        except _GZIP_ERRORS as err:
            raise _damaged(path, err) from err
        except UnicodeDecodeError as err:
            raise _not_text(path, err) from err


def _damaged(path: Path, err: BaseException) -> DataError:
    reason = "it ends early" if isinstance(err, EOFError) else str(err) or type(err).__name__
    return DataError(path, f"cannot decompress the gzip data ({reason}): the file is cut off or damaged; "
                           "allowed: a complete gzip file, or the file uncompressed")


def _not_text(path: Path, err: UnicodeDecodeError) -> DataError:
    """Where the first byte that is not UTF-8 is: the stream's own error counts from a buffer's start."""
    data = read_bytes(path)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as whole:
        line = data.count(b"\n", 0, whole.start) + 1
        column = whole.start - data.rfind(b"\n", 0, whole.start)
        return DataError(path, f"byte 0x{data[whole.start]:02x} at column {column} is not UTF-8 text; "
                               "allowed: a UTF-8 (or ASCII) text file", f"line {line}")
    return DataError(path, f"not UTF-8 text ({err}); allowed: a UTF-8 (or ASCII) text file")


def load_npz(path: str | os.PathLike, names: Sequence[str], layout: str, source: str = ""
             ) -> dict[str, np.ndarray]:
    """The arrays ``names`` of the NumPy ``.npz`` at ``path`` (read without pickle).

    ``layout`` says what the file must hold ("x [n, J] and y [n]"), ``source`` how errors name the file
    (default: its path). Raises ``FileNotFoundError`` for a missing file and :class:`DataError` for an
    empty file, one that is not an ``.npz`` (a single ``.npy`` included) or is cut off or damaged, a
    missing array and an array that only pickle could read.
    """
    path = Path(path).expanduser()
    source = source or str(path)
    if not path.is_file():
        raise FileNotFoundError(f"{source} is not a file; give the .npz with {layout}")
    _require_bytes(source, path.stat().st_size)
    try:
        data = np.load(path, allow_pickle=False)
    except _NPZ_ERRORS as err:
        raise DataError(source, f"not a NumPy .npz file, or a cut-off or damaged one ({err}); allowed: an "
                                f".npz holding {layout}") from err
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise DataError(source, f"a single array (.npy), not an .npz; allowed: an .npz holding {layout}")
    with data:
        require_keys(data.files, names, source, layout, what="array(s)")
        arrays = {}
        for name in names:
            try:
                arrays[name] = data[name]
            except _NPZ_ERRORS as err:  # ValueError also for an object array, which only pickle could read
                raise DataError(source, f"array {name} cannot be read without pickle, or is damaged ({err}); "
                                        f"allowed: numbers or strings, an .npz holding {layout}") from err
    return arrays


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write a compressed ``.npz`` whole or not at all (:func:`dpadmm.files.replacing`): an interrupted write
    never leaves a partial file that a reader would take for a damaged one."""
    with replacing(path) as tmp, open(tmp, "wb") as fh:  # a file object: savez would add ".npz" to a name
        np.savez_compressed(fh, **arrays)


def require_keys(found: Collection[str], needed: Sequence[str], source: str | os.PathLike, layout: str,
                 what: str = "key(s)", where: str = "") -> None:
    """A :class:`DataError` naming the ``needed`` keys (of a JSON object, arrays of an ``.npz``, columns
    of a table) that ``found`` lacks, what was found and the ``layout`` the format needs."""
    missing = [name for name in needed if name not in found]
    if missing:
        listed = ", ".join(map(str, found)) or "none"
        raise DataError(source, f"missing {what} {', '.join(missing)} (found: {listed}); allowed: {layout}",
                        where)


def require_width(width: int, expected: int, source: str | os.PathLike, what: str, layout: str,
                  where: str = "") -> None:
    """A :class:`DataError` unless a record has ``expected`` ``what`` (fields, values, columns)."""
    if width != expected:
        raise DataError(source, f"{width} {what}, expected {expected} ({layout})", where)


def require_array(values: np.ndarray, ndim: int | tuple[int, ...], source: str | os.PathLike, name: str,
                  layout: str, kinds: str = "biuf") -> None:
    """A :class:`DataError` unless ``values`` has ``ndim`` dimensions (one of them, for a tuple) and a
    dtype of ``kinds`` (numpy kind letters; default: booleans, integers and floats)."""
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if values.ndim not in dims or values.dtype.kind not in kinds:
        raise DataError(source, f"{name} is {values.dtype} of shape {values.shape}; allowed: {layout}")


def require_nonempty(count: int, source: str | os.PathLike, what: str) -> None:
    """A :class:`DataError` when a file holds no ``what`` (a file with no sample is one no run can use)."""
    if count == 0:
        raise DataError(source, f"holds no {what}; allowed: at least one")


def require_finite(values: np.ndarray, source: str | os.PathLike, name: str, where: Where = row) -> None:
    """A :class:`DataError` naming the first element of ``values`` that is NaN or infinite.

    The sum of the values is finite exactly when no value is NaN or infinite, unless finite values add
    up beyond the float range; so one pass of ``sum`` clears a good array, and the element-wise test
    runs only on an array that may be bad. Integer arrays are always finite.
    """
    values = np.asarray(values)
    if values.dtype.kind not in "fc" or values.size == 0:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(values.sum()):
            return
    bad = ~np.isfinite(values)
    if bad.any():
        index = _first(bad)
        raise DataError(source, f"{name} is {values[index].item()!r}; allowed: finite numbers", where(index))


def require_labels(y: np.ndarray, num_classes: int | None, source: str | os.PathLike, name: str = "y",
                   where: Where = row) -> np.ndarray:
    """``y`` as a new int64 array, or a :class:`DataError` naming the first label outside the classes.

    Labels are integers ``0..num_classes-1`` (``num_classes`` None: any integer >= 0); floats that are
    whole numbers count as integers (an ``.npz`` or JSON may store 1.0), other values are refused
    rather than cut to an integer, which would read 0.5 or NaN as class 0.
    """
    y = np.asarray(y)
    allowed = ("integers >= 0" if num_classes is None
               else "0 or 1" if num_classes == 2 else f"0..{num_classes - 1} (the {num_classes} classes)")
    if y.dtype.kind not in "biuf":
        raise DataError(source, f"{name} holds {y.dtype} values; allowed: labels {allowed}")
    if y.size == 0:
        return y.astype(np.int64)
    top = np.inf if num_classes is None else num_classes - 1
    if y.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~(np.isfinite(y) & (y >= 0) & (y <= top) & (np.floor(y) == y))
    else:  # integers: two reductions clear a good array
        bad = (y < 0) | (y > top) if y.min() < 0 or y.max() > top else None
    if bad is not None and bad.any():
        index = _first(bad)
        raise DataError(source, f"{name} holds the label {y[index].item()!r}; allowed: {allowed}",
                        where(index))
    return y.astype(np.int64)


def _first(bad: np.ndarray) -> tuple[int, ...]:
    """The index of the first True of ``bad`` in C order: the first offending record of the file."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
