"""Fetch the four MNIST IDX files from public mirrors into a cache folder, checked by MD5.

:func:`ensure_mnist` is the download side of the seam in :mod:`dpadmm.data.mnist`: it asks
:func:`~dpadmm.data.mnist.find_mnist_files` which files a folder lacks and fetches only those,
as ``<name>.gz``, which :func:`~dpadmm.data.mnist.load_mnist` reads directly.
:func:`mnist_folder` is what ``load_dataset("mnist", data_dir)`` uses to choose between a
folder of the user's and the cache.

Where things come from and go to:

- Mirrors: :data:`DEFAULT_MIRRORS` (the two torchvision uses; the original page on
  yann.lecun.com is often unavailable to scripts), tried in order. The environment variable
  ``DPADMM_MNIST_MIRRORS`` (comma-separated base URLs) replaces them, and the ``mirrors``
  argument replaces both; each base URL serves ``<name>.gz``.
- Cache: ``$DPADMM_CACHE/mnist`` when ``DPADMM_CACHE`` is set, else ``~/.cache/dpadmm/mnist``.

Why the download is done the way it is:

- The MD5 is that of the *uncompressed* file (:data:`MNIST_MD5`, as published with the data
  set). The ``.gz`` bytes differ between mirrors (gzip headers carry a time stamp and the
  compressor's settings), the data do not.
- Each file goes to a hidden temporary file in the destination folder and is renamed into
  place with ``os.replace`` only after its checksum matched. The rename is atomic within
  one file system, so an interrupted, truncated or corrupt download never leaves a file
  under the final name, and processes that fetch the same file at once (Flower workers on
  one machine) each write their own temporary file; the last rename wins with identical
  content.
- A network failure (refused, HTTP error, timeout, a body shorter than announced) moves on
  to the next mirror; when all fail, :class:`MnistDownloadError` lists every URL tried and
  why. A checksum mismatch is not retried elsewhere: a mirror serving other bytes under
  the MNIST names is something a person should look at, so :class:`MnistChecksumError`
  names the file, both MD5s and the URL.
- Files already in the folder are trusted and not checksummed again: those written here
  were checked before they got their final name, and a file the user put there is read
  by :func:`~dpadmm.data.mnist.read_idx`, which rejects truncated or malformed files.
  Checking again would decompress and hash 55 MB on every load.

Only the standard library (``urllib.request``) and ``tqdm`` are used; nothing is imported
or fetched unless MNIST is asked for.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import logging
import os
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from dpadmm.data.mnist import MNIST_FILES, MnistFilesMissing, find_mnist_files

__all__ = [
    "CACHE_ENV",
    "DEFAULT_MIRRORS",
    "MIRRORS_ENV",
    "MNIST_MD5",
    "MnistChecksumError",
    "MnistDownloadError",
    "cache_dir",
    "ensure_mnist",
    "mnist_cache_dir",
    "mnist_folder",
    "mnist_mirrors",
]

logger = logging.getLogger(__name__)

# MD5 of the uncompressed files (the same digests torchvision checks).
MNIST_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}

DEFAULT_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

MIRRORS_ENV = "DPADMM_MNIST_MIRRORS"
CACHE_ENV = "DPADMM_CACHE"

# Seconds a connection attempt or one read may block before the mirror counts as failed.
DEFAULT_TIMEOUT_S = 30.0

_CHUNK = 1 << 20
_USER_AGENT = "dpadmm (python urllib)"


class MnistDownloadError(FileNotFoundError):
    """MNIST files could not be fetched from any mirror; the message lists each URL and its failure.

    A ``FileNotFoundError`` because the files are still not there: callers that report
    missing data (the ``dpadmm`` command line) report this too.
    """


class MnistChecksumError(MnistDownloadError):
    """A downloaded file is not the expected MNIST file (its decompressed MD5 differs, or it is not gzip)."""

    def __init__(self, message: str, name: str, url: str, expected: str, actual: str | None) -> None:
        super().__init__(message)
        self.name = name
        self.url = url
        self.expected = expected
        self.actual = actual


def cache_dir() -> Path:
    """The project's cache folder: ``$DPADMM_CACHE`` if set (and not empty), else ``~/.cache/dpadmm``."""
    configured = os.environ.get(CACHE_ENV, "")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "dpadmm"


def mnist_cache_dir() -> Path:
    """Where :func:`ensure_mnist` puts MNIST by default: ``<cache_dir()>/mnist``."""
    return cache_dir() / "mnist"


def mnist_mirrors(mirrors: Sequence[str] | None = None) -> list[str]:
    """The base URLs to try, in order: ``mirrors``, else ``$DPADMM_MNIST_MIRRORS``, else the defaults.

    The variable is a comma-separated list; blanks around entries and empty entries are
    dropped, and an empty or unset variable means the defaults. Each base URL gets a
    trailing ``/`` so that ``base + name + ".gz"`` is the file's URL. Raises ``ValueError``
    when the result is empty (no mirror at all cannot be what was meant).
    """
    if mirrors is None:
        configured = os.environ.get(MIRRORS_ENV, "").strip()
        mirrors = configured.split(",") if configured else DEFAULT_MIRRORS
    cleaned = [m.strip() for m in mirrors if m.strip()]
    if not cleaned:
        raise ValueError(f"no MNIST mirror given (mirrors={list(mirrors)!r}); give at least one base URL")
    return [m if m.endswith("/") else m + "/" for m in cleaned]


def ensure_mnist(
    folder: str | os.PathLike | None = None,
    mirrors: Sequence[str] | None = None,
    progress: bool = True,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Path:
    """Make ``folder`` (default :func:`mnist_cache_dir`) hold the four MNIST files; return it.

    Files already there, raw or ``.gz``, are kept as they are and not checked again (see
    the module docstring for why). Each missing one is downloaded as ``<name>.gz`` from the
    first of :func:`mnist_mirrors` that delivers it, checked against :data:`MNIST_MD5` and
    only then renamed into place. ``progress`` shows a tqdm bar per file on stderr; without
    it nothing is printed (the steps are logged at INFO level). ``timeout`` bounds, in
    seconds, each connection attempt and each read.

    Raises :class:`MnistDownloadError` when no mirror delivers a file (listing each URL and
    its failure), :class:`MnistChecksumError` when a delivered file is not the expected
    one, ``ValueError`` for an empty mirror list.
    """
    target = Path(folder).expanduser() if folder is not None else mnist_cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    try:
        find_mnist_files(target)
        return target
    except MnistFilesMissing as e:
        missing = e.missing
    bases = mnist_mirrors(mirrors)
    for name in missing:
        _download_one(name, target, bases, progress, timeout)
    return target


def mnist_folder(data_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """The folder ``load_dataset("mnist", data_dir)`` reads: ``data_dir`` when it is complete, else the cache.

    - ``data_dir`` given and holding the four files (raw or ``.gz``): returned as is, no
      network.
    - ``data_dir`` ``None`` or ``""``: :func:`ensure_mnist` fills the cache folder (a no-op
      once it is complete) and that folder is returned.
    - ``data_dir`` an existing folder that lacks some files: a warning naming the folder,
      the missing files and the cache folder is logged, then as above. The user's folder is
      never written to (it may be shared or read-only).
    - ``data_dir`` not existing, or not a folder: the ``FileNotFoundError`` /
      ``NotADirectoryError`` of :func:`~dpadmm.data.mnist.find_mnist_files`; a mistyped path
      is not a reason to download.
    """
    if data_dir is not None and os.fspath(data_dir) != "":
        try:
            find_mnist_files(data_dir)
            return Path(data_dir).expanduser()
        except MnistFilesMissing as e:
            logger.warning(
                "%s; using the MNIST cache folder %s instead (files missing there are downloaded; "
                "%s sets the cache)",
                e,
                mnist_cache_dir(),
                CACHE_ENV,
            )
    return ensure_mnist(progress=progress)


def _download_one(name: str, folder: Path, bases: list[str], progress: bool, timeout: float) -> None:
    """Fetch ``<name>.gz`` into ``folder`` from the first base URL that delivers it, checked."""
    failures: list[str] = []
    for base in bases:
        url = f"{base}{name}.gz"
        # Not tempfile.mkstemp: its files are private (0600) and would stay so after the
        # rename; O_EXCL with mode 0666 gives a fresh file with the usual umask permissions.
        tmp = folder / f".{name}.gz.{os.getpid()}-{uuid.uuid4().hex[:12]}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    _fetch(url, out, f"{name}.gz", progress, timeout)
                except (OSError, http.client.HTTPException, ValueError) as e:
                    # URLError/HTTPError/TimeoutError are OSErrors; ValueError: a malformed URL.
                    failures.append(f"{url}: {_reason(e)}")
                    logger.info("MNIST: %s failed: %s", url, _reason(e))
                    continue
            _verify(tmp, name, url)
            os.replace(tmp, folder / f"{name}.gz")
            logger.info("MNIST: %s -> %s", url, folder / f"{name}.gz")
            return
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    tried = "\n".join(f"  - {f}" for f in failures)
    raise MnistDownloadError(
        f"could not download MNIST file {name}.gz into {folder}; tried {len(bases)} mirror(s):\n{tried}\n"
        f"Set {MIRRORS_ENV} (comma-separated base URLs) to other mirrors, or put the four IDX files "
        f"({', '.join(MNIST_FILES)}, raw or .gz) into that folder or a data_dir yourself."
    )


def _fetch(url: str, out: BinaryIO, label: str, progress: bool, timeout: float) -> None:
    """Stream ``url`` into the open binary file ``out``; a body shorter than announced is an error."""
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        length_header = response.headers.get("Content-Length")
        total = int(length_header) if length_header and length_header.isdigit() else None
        received = 0
        with tqdm(
            total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress,
            leave=False,
        ) as bar:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    if total is not None and received != total:
        raise OSError(f"connection closed after {received} of {total} bytes")


def _verify(path: Path, name: str, url: str) -> None:
    """Raise :class:`MnistChecksumError` unless the decompressed content of ``path`` has MNIST_MD5[name]."""
    expected = MNIST_MD5[name]
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except (EOFError, OSError, zlib.error) as e:
        # BadGzipFile is an OSError; EOFError: the stream ends early; zlib.error: corrupt data.
        raise MnistChecksumError(
            f"MNIST file {name}.gz from {url} is not valid gzip data ({e}); expected content with MD5 "
            f"{expected}. The mirror serves something else under this name; nothing was saved.",
            name,
            url,
            expected,
            None,
        ) from e
    actual = digest.hexdigest()
    if actual != expected:
        raise MnistChecksumError(
            f"MNIST file {name}.gz from {url} failed its checksum: the decompressed content has MD5 "
            f"{actual}, expected {expected}. The mirror serves a different file under this name; "
            "nothing was saved.",
            name,
            url,
            expected,
            actual,
        )


def _reason(error: BaseException) -> str:
    """A one-line account of a network failure (urllib wraps the interesting part in ``reason``)."""
    reason = getattr(error, "reason", None)
    text = str(error) if reason is None or isinstance(error, urllib.error.HTTPError) else str(reason)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
