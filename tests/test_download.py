"""Tests of dpadmm.data.download against a real HTTP server on 127.0.0.1 (no mocks, never the internet).

The server serves a temporary folder holding copies of the real ``.gz`` files of
../shared/data/mnist in several variants, one subfolder per "mirror":

- ``good/``: the four files as they are;
- ``flipped/``: train-labels with one label changed, recompressed (valid gzip, wrong MD5);
- ``swapped/``: t10k-labels served under the name train-labels (a different valid file);
- ``notgzip/``: an HTML page under the name train-labels (what a captive portal serves);
- ``empty/``: nothing, so every request is a 404;
- ``truncated/...``: the files of ``good/`` with half the announced body, then the connection closes.

Every request path is recorded, so the tests can say exactly what was fetched. Each test
points ``DPADMM_CACHE`` at its own tmp_path and ``DPADMM_MNIST_MIRRORS`` at the server.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import logging
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from dpadmm.data import load_dataset
from dpadmm.data.checks import DataError
from dpadmm.data.download import (
    DEFAULT_MIRRORS,
    MNIST_MD5,
    MnistChecksumError,
    MnistDownloadError,
    cache_dir,
    ensure_mnist,
    mnist_cache_dir,
    mnist_folder,
    mnist_mirrors,
)
from dpadmm.data.mnist import MNIST_FILES, load_mnist
from tests.corrupt import flipped, truncated

TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS = MNIST_FILES


class _RecordingServer(ThreadingHTTPServer):
    requests: list[str]


class _Handler(SimpleHTTPRequestHandler):
    """Serves the mirror folder; records each path; ``/truncated/<file>`` sends half of ``good/<file>``."""

    server: _RecordingServer

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        if self.path.startswith("/truncated/"):
            body = (Path(self.directory) / "good" / self.path.removeprefix("/truncated/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Mirror:
    """The loopback server: ``base(sub)`` is the URL of one mirror folder, ``requests`` the paths read."""

    root: Path
    url: str
    requests: list[str] = field(default_factory=list)

    def base(self, sub: str) -> str:
        return f"{self.url}{sub}/"


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def mnist_gz(mnist_dir: Path) -> Path:
    """The folder with the four real ``.gz`` files (skip when one is absent)."""
    absent = [n for n in MNIST_FILES if not (mnist_dir / f"{n}.gz").is_file()]
    if absent:
        pytest.skip(f"real MNIST files {', '.join(absent)} (.gz) not found in {mnist_dir}")
    return mnist_dir


@pytest.fixture(scope="module")
def server(mnist_gz: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mirror]:
    root = tmp_path_factory.mktemp("mirror")
    for sub in ("good", "flipped", "swapped", "notgzip", "empty"):
        (root / sub).mkdir()
    for name in MNIST_FILES:
        for sub in ("good", "flipped", "swapped", "notgzip"):
            shutil.copyfile(mnist_gz / f"{name}.gz", root / sub / f"{name}.gz")
    labels = bytearray(gzip.decompress((mnist_gz / f"{TRAIN_LABELS}.gz").read_bytes()))
    labels[8] = (labels[8] + 1) % 10  # the first label, 5 -> 6; the header (8 bytes) is untouched
    (root / "flipped" / f"{TRAIN_LABELS}.gz").write_bytes(gzip.compress(bytes(labels)))
    shutil.copyfile(mnist_gz / f"{TEST_LABELS}.gz", root / "swapped" / f"{TRAIN_LABELS}.gz")
    (root / "notgzip" / f"{TRAIN_LABELS}.gz").write_text("<html><body>Please log in</body></html>")

    httpd = _RecordingServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
    httpd.requests = []
    thread = threading.Thread(target=httpd.serve_forever, name="loopback-mirror", daemon=True)
    thread.start()
    try:
        yield Mirror(root, f"http://127.0.0.1:{httpd.server_address[1]}/", httpd.requests)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture
def mirror(server: Mirror, monkeypatch: pytest.MonkeyPatch) -> Mirror:
    """The server with an empty request log; DPADMM_MNIST_MIRRORS points at its ``good/`` folder."""
    server.requests.clear()
    monkeypatch.setenv("DPADMM_MNIST_MIRRORS", server.base("good"))
    for variable in ("no_proxy", "NO_PROXY"):  # urllib would send loopback requests to an http_proxy
        monkeypatch.setenv(variable, "127.0.0.1,localhost")
    return server


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """DPADMM_CACHE is a fresh folder; returns the MNIST cache folder in it (not yet created)."""
    monkeypatch.setenv("DPADMM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "mnist"


def _seed(cache: Path, mnist_gz: Path, names: tuple[str, ...]) -> None:
    """Put copies of the real files ``names`` (as .gz) into the cache, as a previous run would have."""
    cache.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copyfile(mnist_gz / f"{name}.gz", cache / f"{name}.gz")


def _listing(folder: Path) -> list[str]:
    """Every entry of the folder, hidden temporary files included."""
    return sorted(p.name for p in folder.iterdir())


# --- download, cache, no re-download ---------------------------------------------------------------


def test_download_then_load_equals_the_shared_files(mirror: Mirror, cache: Path, mnist_gz: Path) -> None:
    data = load_dataset("mnist", "")
    assert sorted(mirror.requests) == sorted(f"/good/{n}.gz" for n in MNIST_FILES)
    assert _listing(cache) == sorted(f"{n}.gz" for n in MNIST_FILES)  # no temporary file left
    for name in MNIST_FILES:
        assert (cache / f"{name}.gz").read_bytes() == (mnist_gz / f"{name}.gz").read_bytes()
    assert data.num_train == 60000 and data.num_test == 10000
    direct = load_mnist(mnist_gz)
    for part in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(data, part), getattr(direct, part)), part

    mirror.requests.clear()
    assert ensure_mnist() == cache
    assert mnist_folder(None) == cache  # what load_dataset("mnist", None) reads
    assert mirror.requests == []  # the second time, nothing is downloaded


def test_only_missing_files_are_fetched(mirror: Mirror, cache: Path, mnist_gz: Path) -> None:
    _seed(cache, mnist_gz, (TRAIN_LABELS, TEST_IMAGES))
    # A raw (uncompressed) file counts as present, as in find_mnist_files.
    (cache / TEST_LABELS).write_bytes(gzip.decompress((mnist_gz / f"{TEST_LABELS}.gz").read_bytes()))
    assert ensure_mnist(progress=False) == cache
    assert mirror.requests == [f"/good/{TRAIN_IMAGES}.gz"]
    assert ensure_mnist(progress=False) == cache
    assert mirror.requests == [f"/good/{TRAIN_IMAGES}.gz"]


def test_explicit_folder_and_progress_bar(
    mirror: Mirror, cache: Path, mnist_gz: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "elsewhere" / "mnist"
    _seed(folder, mnist_gz, (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES))
    assert ensure_mnist(folder, progress=True) == folder
    assert (folder / f"{TEST_LABELS}.gz").is_file() and not cache.exists()
    assert f"{TEST_LABELS}.gz" in capsys.readouterr().err  # the tqdm bar names the file


# --- checksums ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["flipped", "swapped", "notgzip"])
def test_wrong_content_raises_and_saves_nothing(
    mirror: Mirror, cache: Path, mnist_gz: Path, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    _seed(cache, mnist_gz, (TRAIN_IMAGES,))
    # A good mirror after the bad one is not tried: other bytes under the MNIST names need a person.
    monkeypatch.setenv("DPADMM_MNIST_MIRRORS", f"{mirror.base(variant)},{mirror.base('good')}")
    with pytest.raises(MnistChecksumError) as info:
        ensure_mnist(progress=False)
    error = info.value
    url = f"{mirror.base(variant)}{TRAIN_LABELS}.gz"
    message = str(error)
    assert url in message and MNIST_MD5[TRAIN_LABELS] in message
    assert error.name == TRAIN_LABELS and error.url == url and error.expected == MNIST_MD5[TRAIN_LABELS]
    if variant == "notgzip":
        assert error.actual is None and "not valid gzip" in message
    else:
        served = gzip.decompress((mirror.root / variant / f"{TRAIN_LABELS}.gz").read_bytes())
        assert error.actual == hashlib.md5(served).hexdigest() != error.expected
        assert error.actual in message
    assert isinstance(error, MnistDownloadError) and isinstance(error, FileNotFoundError)
    assert mirror.requests == [f"/{variant}/{TRAIN_LABELS}.gz"]
    assert _listing(cache) == [f"{TRAIN_IMAGES}.gz"]  # nothing under the final name, no temporary file


@pytest.mark.parametrize("fault", ["truncated", "flipped"])
def test_a_cached_file_damaged_later_is_refused_naming_it_not_fetched_again(
    mirror: Mirror, cache: Path, mnist_gz: Path, fault: str
) -> None:
    """A cached file is not checksummed again on every load; one damaged after its download (a full disk,
    a copy that stopped) is refused by the loader with one line naming it, and nothing is downloaded."""
    _seed(cache, mnist_gz, MNIST_FILES)
    path = {"truncated": truncated, "flipped": flipped}[fault](cache / f"{TEST_LABELS}.gz")
    with pytest.raises(DataError, match=re.escape(f"{path}: cannot decompress the gzip data")) as info:
        load_dataset("mnist", "")
    assert "\n" not in str(info.value)
    assert mirror.requests == []


# --- mirrors: fallback and failure ----------------------------------------------------------------


def test_a_404_falls_back_to_the_next_mirror(
    mirror: Mirror, cache: Path, mnist_gz: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _seed(cache, mnist_gz, (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES))
    monkeypatch.setenv("DPADMM_MNIST_MIRRORS", f"{mirror.base('empty')},{mirror.base('good')}")
    ensure_mnist(progress=False)
    assert mirror.requests == [f"/empty/{TEST_LABELS}.gz", f"/good/{TEST_LABELS}.gz"]
    assert (cache / f"{TEST_LABELS}.gz").read_bytes() == (mnist_gz / f"{TEST_LABELS}.gz").read_bytes()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # progress=False is quiet


def test_a_truncated_body_falls_back_and_leaves_no_file(
    mirror: Mirror, cache: Path, mnist_gz: Path
) -> None:
    _seed(cache, mnist_gz, (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES))
    with pytest.raises(MnistDownloadError, match=r"connection closed after \d+ of \d+ bytes"):
        ensure_mnist(mirrors=[mirror.base("truncated")], progress=False)
    assert not (cache / f"{TEST_LABELS}.gz").exists() and len(_listing(cache)) == 3
    # The mirrors argument wins over DPADMM_MNIST_MIRRORS (which names good/ alone).
    ensure_mnist(mirrors=[mirror.base("truncated"), mirror.base("good")], progress=False)
    assert (cache / f"{TEST_LABELS}.gz").read_bytes() == (mnist_gz / f"{TEST_LABELS}.gz").read_bytes()


def test_all_mirrors_failing_lists_each_one(mirror: Mirror, cache: Path, mnist_gz: Path) -> None:
    _seed(cache, mnist_gz, (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES))
    refused = f"http://127.0.0.1:{_closed_port()}/mnist/"
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        hanging = f"http://127.0.0.1:{silent.getsockname()[1]}/mnist"
        with pytest.raises(MnistDownloadError) as info:
            ensure_mnist(mirrors=[mirror.base("empty"), refused, hanging], progress=False, timeout=0.5)
    message = str(info.value)
    assert "tried 3 mirror(s)" in message and str(cache) in message and "DPADMM_MNIST_MIRRORS" in message
    assert f"{mirror.base('empty')}{TEST_LABELS}.gz: HTTPError: HTTP Error 404" in message
    assert f"{refused}{TEST_LABELS}.gz: " in message and "refused" in message.lower()
    assert f"{hanging}/{TEST_LABELS}.gz: " in message and "timed out" in message
    assert not isinstance(info.value, MnistChecksumError)
    assert len(_listing(cache)) == 3


# --- load_dataset: which folder --------------------------------------------------------------------


def test_complete_data_dir_needs_no_network(
    cache: Path, mnist_gz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPADMM_MNIST_MIRRORS", f"http://127.0.0.1:{_closed_port()}/")
    assert mnist_folder(mnist_gz) == mnist_gz
    assert mnist_folder(str(mnist_gz)) == mnist_gz
    assert not cache.parent.exists()


def test_incomplete_data_dir_warns_and_uses_the_cache(
    mirror: Mirror, cache: Path, mnist_gz: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mine = tmp_path / "mine"
    _seed(mine, mnist_gz, (TEST_LABELS,))
    _seed(cache, mnist_gz, (TRAIN_IMAGES, TRAIN_LABELS))
    with caplog.at_level(logging.WARNING, logger="dpadmm.data.download"):
        data = load_dataset("mnist", mine)
    assert data.num_test == 10000
    assert mirror.requests == [f"/good/{TEST_IMAGES}.gz", f"/good/{TEST_LABELS}.gz"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(mine.resolve()) in warnings[0] and str(cache) in warnings[0]
    assert TRAIN_IMAGES in warnings[0] and "DPADMM_CACHE" in warnings[0]
    assert _listing(mine) == [f"{TEST_LABELS}.gz"]  # the user's folder is not written to


def test_a_data_dir_that_does_not_exist_is_an_error_not_a_download(mirror: Mirror, cache: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        load_dataset("mnist", cache.parent / "nowhere")
    assert not isinstance(info.value, MnistDownloadError)
    assert mirror.requests == [] and not cache.exists()


# --- settings -------------------------------------------------------------------------------------


def test_mirror_and_cache_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DPADMM_MNIST_MIRRORS", raising=False)
    assert mnist_mirrors() == list(DEFAULT_MIRRORS) == [
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ]
    monkeypatch.setenv("DPADMM_MNIST_MIRRORS", "  ")
    assert mnist_mirrors() == list(DEFAULT_MIRRORS)
    monkeypatch.setenv("DPADMM_MNIST_MIRRORS", " http://a.example/mnist , ,http://b.example/x/ ")
    assert mnist_mirrors() == ["http://a.example/mnist/", "http://b.example/x/"]
    assert mnist_mirrors(["http://c.example"]) == ["http://c.example/"]
    with pytest.raises(ValueError, match="no MNIST mirror"):
        mnist_mirrors([" "])

    monkeypatch.delenv("DPADMM_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "dpadmm"
    assert mnist_cache_dir() == tmp_path / ".cache" / "dpadmm" / "mnist"
    monkeypatch.setenv("DPADMM_CACHE", str(tmp_path / "c"))
    assert mnist_cache_dir() == tmp_path / "c" / "mnist"
