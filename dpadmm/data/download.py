"""Fetch a data set's files from its public sources into the cache, each checked by its content's SHA-256.

:func:`fetch` (``dpadmm data fetch NAME | all``) is the one download path of every data set the project
reads: MNIST, FEMNIST, a9a, a8a, ijcnn1, bio_train and UCI Adult (:data:`dpadmm.data.sources.SOURCES` says
where each comes from and under which licence). The loaders call :func:`data_folder` when no ``data-dir`` is
given, so the first use of a data set fetches it; a given folder is read as it is or refused, never
replaced by the cache.

Where things come from and go to:

- Sources: each file's public URLs (:mod:`dpadmm.data.sources`), tried in order. The environment variable
  ``DPADMM_DATA_MIRRORS`` (comma-separated base URLs, ``file://`` included) replaces them, and the
  ``mirrors`` argument replaces both; a mirror is laid out as a data folder, ``<base><name>/<path>``
  (``<base>a9a/a9a.gz``), which a copy of a filled cache is.
- Cache: ``$DPADMM_CACHE/<name>`` when ``DPADMM_CACHE`` is set, else ``~/.cache/dpadmm/<name>``; each file
  gzip-compressed under its path, so the cache folder is a ``data-dir`` like any other.

Why the download is done the way it is:

- The checksum is that of the *decompressed* content: the sources serve plain text, bzip2 or gzip, and the
  compressed bytes differ between compressors while the data do not.
- Each file goes to a hidden temporary file in the destination folder and is renamed into place with
  ``os.replace`` only after its checksum matched. The rename is atomic within one file system, so an
  interrupted, truncated or corrupt download never leaves a file under the final name, and processes that
  fetch the same file at once (Flower workers on one machine) each write their own temporary file; the last
  rename wins with identical content.
- A network failure (refused, HTTP error, timeout, a body shorter than announced, a file:// path that does
  not exist) moves on to the next source; when all fail, :class:`DownloadError` lists every URL tried and
  why, and says which file to put where. A checksum mismatch is not retried elsewhere: a source serving
  other bytes under the data set's names is something a person should look at, so :class:`ChecksumError`
  names the file, both digests and the URL.
- Files already in the folder are trusted and not checksummed again: those written here were checked before
  they got their final name, and the loaders reject truncated or malformed files with one line naming
  them. Checking again would decompress and hash every file on every load.

Only the standard library (``urllib.request``, ``gzip``, ``bz2``) and ``tqdm`` are used.
"""

from __future__ import annotations

import bz2
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

from dpadmm.data.mnist import MnistFilesMissing, find_mnist_files
from dpadmm.data.sources import SOURCES, DataSource, RemoteFile

__all__ = [
    "CACHE_ENV",
    "MIRRORS_ENV",
    "ChecksumError",
    "DownloadError",
    "cache_dir",
    "data_folder",
    "data_mirrors",
    "dataset_cache_dir",
    "fetch",
    "missing_files",
    "mnist_folder",
]

logger = logging.getLogger(__name__)

MIRRORS_ENV = "DPADMM_DATA_MIRRORS"
CACHE_ENV = "DPADMM_CACHE"

# Seconds a connection attempt or one read may block before the source counts as failed.
DEFAULT_TIMEOUT_S = 30.0

_CHUNK = 1 << 20
_USER_AGENT = "dpadmm (python urllib)"


class DownloadError(FileNotFoundError):
    """A data set's file could not be fetched from any source; the message lists each URL and its failure,
    and which file to put where.

    A ``FileNotFoundError`` because the file is still not there: callers that report missing data (the
    ``dpadmm`` command line) report this too.
    """


class ChecksumError(DownloadError):
    """A fetched file is not the expected one (its content's SHA-256 differs, or it does not decompress)."""

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


def dataset_cache_dir(name: str) -> Path:
    """Where :func:`fetch` puts data set ``name`` by default: ``<cache_dir()>/<name>``."""
    return cache_dir() / _source(name).name


def data_mirrors(mirrors: Sequence[str] | None = None) -> list[str] | None:
    """The mirror base URLs to use instead of the public sources: ``mirrors``, else ``$DPADMM_DATA_MIRRORS``;
    None (the public sources) when neither is given.

    The variable is a comma-separated list; blanks around entries and empty entries are dropped, and an
    empty or unset variable means the public sources. Each base gets a trailing ``/``. Raises ``ValueError``
    when ``mirrors`` is given but holds no URL (no source at all cannot be what was meant).
    """
    if mirrors is None:
        configured = os.environ.get(MIRRORS_ENV, "").strip()
        if not configured:
            return None
        mirrors = configured.split(",")
    cleaned = [m.strip() for m in mirrors if m.strip()]
    if not cleaned:
        raise ValueError(f"no mirror given (mirrors={list(mirrors)!r}); give at least one base URL")
    return [m if m.endswith("/") else m + "/" for m in cleaned]


def missing_files(name: str, folder: str | os.PathLike) -> list[RemoteFile]:
    """The files of data set ``name`` that ``folder`` lacks (a file counts as there plain or as ``.gz``)."""
    base = Path(folder).expanduser()
    return [f for f in _source(name).files
            if not (base / f.path).is_file() and not (base / f.path.removesuffix(".gz")).is_file()]


def fetch(name: str, folder: str | os.PathLike | None = None, mirrors: Sequence[str] | None = None,
          progress: bool = True, *, timeout: float = DEFAULT_TIMEOUT_S) -> Path:
    """Make ``folder`` (default :func:`dataset_cache_dir`) hold every file of data set ``name``; return it.

    Files already there are kept as they are and not checked again (see the module docstring for why).
    Each missing one is fetched from the first source (:func:`data_mirrors`, else the public URLs) that
    delivers it, checked against its SHA-256 and only then renamed into place, gzip-compressed.
    ``progress`` shows a bar over the files and one per file on stderr; without it nothing is printed (the
    steps are logged at INFO level). ``timeout`` bounds, in seconds, each connection attempt and each read.

    Raises ``ValueError`` for an unknown name or an empty mirror list, :class:`DownloadError` when no source
    delivers a file (listing each URL and its failure), :class:`ChecksumError` when a delivered file is not
    the expected one.
    """
    source = _source(name)
    target = Path(folder).expanduser() if folder is not None else dataset_cache_dir(name)
    missing = missing_files(name, target)
    bases = data_mirrors(mirrors)
    with tqdm(total=len(missing), desc=name, unit="file", disable=not progress or len(missing) < 2) as bar:
        for file in missing:
            urls = [f"{b}{source.name}/{file.path}" for b in bases] if bases is not None else list(file.urls)
            _download_one(source, file, target, urls, progress, timeout)
            bar.update(1)
    return target


def data_folder(name: str, data_dir: str | os.PathLike | None, progress: bool = True) -> Path:
    """The folder a loader reads data set ``name`` from: ``data_dir`` when one is given (as it is: a folder
    that lacks files is the loader's error to report, not a reason to download), else the cache, fetched
    on first use (:func:`fetch`)."""
    if data_dir is not None and os.fspath(data_dir) != "":
        return Path(data_dir).expanduser()
    return fetch(name, progress=progress)


def mnist_folder(data_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """The folder ``load_dataset("mnist", data_dir)`` reads: ``data_dir`` when given, else the cache.

    - ``data_dir`` given and holding the four files (raw or ``.gz``): returned as is, no network.
    - ``data_dir`` ``None`` or ``""``: :func:`fetch` fills the cache folder (a no-op once it is complete)
      and that folder is returned.
    - ``data_dir`` an existing folder that lacks some files: refused (:class:`MnistFilesMissing`, naming
      them, the cache and how to fill it). Reading the cache instead would train on other files than the
      ones the run's config.json names; the user's folder is never written to (it may be shared).
    - ``data_dir`` not existing, or not a folder: the ``FileNotFoundError`` / ``NotADirectoryError`` of
      :func:`~dpadmm.data.mnist.find_mnist_files`; a mistyped path is not a reason to download.
    """
    if data_dir is not None and os.fspath(data_dir) != "":
        try:
            find_mnist_files(data_dir)
        except MnistFilesMissing as e:
            raise MnistFilesMissing(f"data-dir: {e}; give a folder that holds them, or no data-dir to use "
                                    f"the cache ({dataset_cache_dir('mnist')}, filled by `dpadmm data fetch "
                                    f"mnist`; {CACHE_ENV} moves it)", e.data_dir, e.missing) from None
        return Path(data_dir).expanduser()
    return fetch("mnist", progress=progress)


def _source(name: str) -> DataSource:
    if name not in SOURCES:
        raise ValueError(f"data set {name!r} is not known; choose one of {', '.join(SOURCES)}")
    return SOURCES[name]


def _temporary(folder: Path, name: str) -> Path:
    """A fresh hidden file in ``folder``. Not tempfile.mkstemp: its files are private (0600) and would stay
    so after the rename; O_EXCL with mode 0666 gives a new file with the usual umask permissions."""
    path = folder / f".{name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.part"
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666))
    return path


def _download_one(source: DataSource, file: RemoteFile, folder: Path, urls: list[str], progress: bool,
                  timeout: float) -> None:
    """Fetch ``file`` into ``folder`` from the first of ``urls`` that delivers it, checked, as ``.gz``."""
    destination = folder / file.path
    destination.parent.mkdir(parents=True, exist_ok=True)
    label = Path(file.path).name
    failures: list[str] = []
    for url in urls:
        raw, packed = _temporary(destination.parent, label), _temporary(destination.parent, label + ".gz")
        try:
            try:
                with open(raw, "wb") as out:
                    _fetch(url, out, label, progress, timeout)
            except (OSError, http.client.HTTPException, ValueError) as e:
                # URLError/HTTPError/TimeoutError are OSErrors; ValueError: a malformed URL.
                failures.append(f"{url}: {_reason(e)}")
                logger.info("%s: %s failed: %s", source.name, url, _reason(e))
                continue
            final = raw if url.endswith(".gz") else packed
            _verify(raw, None if url.endswith(".gz") else packed, file, url)
            os.replace(final, destination)
            logger.info("%s: %s -> %s", source.name, url, destination)
            return
        finally:
            for path in (raw, packed):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    raise DownloadError(_unreachable(source, file, folder, failures))


def _unreachable(source: DataSource, file: RemoteFile, folder: Path, failures: list[str]) -> str:
    """What to do when no source delivered ``file``: each URL and why, then which file to put where."""
    put = (f"put {file.path.removesuffix('.gz')} (plain or .gz; its content has SHA-256 {file.sha256}) into "
           f"{folder} yourself, or give the command a data-dir that holds the data set, or set {MIRRORS_ENV} "
           f"to a mirror laid out as <base>/{source.name}/{file.path}")
    if not failures:
        return f"{source.name} cannot be downloaded: {source.by_hand}; {put}."
    tried = "\n".join(f"  - {f}" for f in failures)
    return (f"could not download {source.name} file {file.path} into {folder}; tried {len(failures)} "
            f"source(s):\n{tried}\nOffline or behind a firewall: get it from {source.homepage} and {put}.")


def _fetch(url: str, out: BinaryIO, label: str, progress: bool, timeout: float) -> None:
    """Stream ``url`` into the open binary file ``out``; a body shorter than announced is an error."""
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        length_header = response.headers.get("Content-Length")
        total = int(length_header) if length_header and length_header.isdigit() else None
        received = 0
        with tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024, disable=not progress,
                  leave=False) as bar:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    if total is not None and received != total:
        raise OSError(f"connection closed after {received} of {total} bytes")


def _verify(raw: Path, packed: Path | None, file: RemoteFile, url: str) -> None:
    """Raise :class:`ChecksumError` unless the decompressed content of ``raw`` (gzip, bzip2 or plain, by the
    URL's suffix) has ``file.sha256``; with ``packed``, also write that content there gzip-compressed."""
    kind = "gzip" if url.endswith(".gz") else "bzip2" if url.endswith(".bz2") else "plain"
    opener = {"gzip": gzip.open, "bzip2": bz2.open, "plain": open}[kind]
    digest = hashlib.sha256()
    try:
        with opener(raw, "rb") as f, (gzip.GzipFile(packed, "wb", mtime=0) if packed else
                                      contextlib.nullcontext()) as sink:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                if sink is not None:
                    sink.write(chunk)
    except (EOFError, OSError, zlib.error) as e:
        # BadGzipFile is an OSError (so is bz2's "Invalid data stream"); EOFError: the stream ends early
        raise ChecksumError(
            f"{file.path} from {url} is not valid {kind} data ({e}); expected content with SHA-256 "
            f"{file.sha256}. The source serves something else under this name; nothing was saved.",
            file.path, url, file.sha256, None) from e
    actual = digest.hexdigest()
    if actual != file.sha256:
        raise ChecksumError(
            f"{file.path} from {url} failed its checksum: the decompressed content has SHA-256 {actual}, "
            f"expected {file.sha256}. The source serves a different file under this name; nothing was saved.",
            file.path, url, file.sha256, actual)


def _reason(error: BaseException) -> str:
    """A one-line account of a network failure (urllib wraps the interesting part in ``reason``)."""
    reason = getattr(error, "reason", None)
    text = str(error) if reason is None or isinstance(error, urllib.error.HTTPError) else str(reason)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
