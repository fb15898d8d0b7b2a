"""Tests of dpadmm.data.download against a real HTTP server on 127.0.0.1 (no mocks, never the internet).

The server serves a temporary folder holding copies of the real ``.gz`` files of
../shared/data/mnist in several variants, one subfolder per "mirror", each laid out as a data
folder (``<mirror>/mnist/<file>.gz``):

- ``good/``: the four files as they are;
- ``flipped/``: train-labels with one label changed, recompressed (valid gzip, wrong SHA-256);
- ``swapped/``: t10k-labels served under the name train-labels (a different valid file);
- ``notgzip/``: an HTML page under the name train-labels (what a captive portal serves);
- ``empty/``: nothing, so every request is a 404;
- ``truncated/...``: the files of ``good/`` with half the announced body, then the connection closes.

Every request path is recorded, so the tests can say exactly what was fetched. Each test
points ``DPADMM_CACHE`` at its own tmp_path and ``DPADMM_DATA_MIRRORS`` at the server. The other
data sets are fetched from ``file://`` mirrors made of ../shared/data (a copy, a corrupt copy and a
truncated one), and from plain and bzip2 files as their public sources serve them.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
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
    ChecksumError,
    DownloadError,
    cache_dir,
    data_mirrors,
    dataset_cache_dir,
    fetch,
    mnist_folder,
)
from dpadmm.data.mnist import MNIST_FILES, load_mnist
from dpadmm.data.sources import MNIST_BASES, MNIST_SHA256, SOURCES
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
        (root / sub / "mnist").mkdir(parents=True)
    for name in MNIST_FILES:
        for sub in ("good", "flipped", "swapped", "notgzip"):
            shutil.copyfile(mnist_gz / f"{name}.gz", root / sub / "mnist" / f"{name}.gz")
    labels = bytearray(gzip.decompress((mnist_gz / f"{TRAIN_LABELS}.gz").read_bytes()))
    labels[8] = (labels[8] + 1) % 10  # the first label, 5 -> 6; the header (8 bytes) is untouched
    (root / "flipped" / "mnist" / f"{TRAIN_LABELS}.gz").write_bytes(gzip.compress(bytes(labels)))
    shutil.copyfile(mnist_gz / f"{TEST_LABELS}.gz", root / "swapped" / "mnist" / f"{TRAIN_LABELS}.gz")
    (root / "notgzip" / "mnist" / f"{TRAIN_LABELS}.gz").write_text("<html><body>Please log in</body></html>")

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
    """The server with an empty request log; DPADMM_DATA_MIRRORS points at its ``good/`` folder."""
    server.requests.clear()
    monkeypatch.setenv("DPADMM_DATA_MIRRORS", server.base("good"))
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
    assert sorted(mirror.requests) == sorted(f"/good/mnist/{n}.gz" for n in MNIST_FILES)
    assert _listing(cache) == sorted(f"{n}.gz" for n in MNIST_FILES)  # no temporary file left
    for name in MNIST_FILES:
        assert (cache / f"{name}.gz").read_bytes() == (mnist_gz / f"{name}.gz").read_bytes()
    assert data.num_train == 60000 and data.num_test == 10000
    direct = load_mnist(mnist_gz)
    for part in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(data, part), getattr(direct, part)), part

    mirror.requests.clear()
    assert fetch("mnist") == cache
    assert mnist_folder(None) == cache  # what load_dataset("mnist", None) reads
    assert mirror.requests == []  # the second time, nothing is downloaded


def test_only_missing_files_are_fetched(mirror: Mirror, cache: Path, mnist_gz: Path) -> None:
    _seed(cache, mnist_gz, (TRAIN_LABELS, TEST_IMAGES))
    # A raw (uncompressed) file counts as present, as in find_mnist_files.
    (cache / TEST_LABELS).write_bytes(gzip.decompress((mnist_gz / f"{TEST_LABELS}.gz").read_bytes()))
    assert fetch("mnist", progress=False) == cache
    assert mirror.requests == [f"/good/mnist/{TRAIN_IMAGES}.gz"]
    assert fetch("mnist", progress=False) == cache
    assert mirror.requests == [f"/good/mnist/{TRAIN_IMAGES}.gz"]


def test_explicit_folder_and_progress_bar(
    mirror: Mirror, cache: Path, mnist_gz: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "elsewhere" / "mnist"
    _seed(folder, mnist_gz, (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES))
    assert fetch("mnist", folder, progress=True) == folder
    assert (folder / f"{TEST_LABELS}.gz").is_file() and not cache.exists()
    assert f"{TEST_LABELS}.gz" in capsys.readouterr().err  # the tqdm bar names the file


# --- checksums ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["flipped", "swapped", "notgzip"])
def test_wrong_content_raises_and_saves_nothing(
    mirror: Mirror, cache: Path, mnist_gz: Path, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    _seed(cache, mnist_gz, (TRAIN_IMAGES,))
    # A good mirror after the bad one is not tried: other bytes under the MNIST names need a person.
    monkeypatch.setenv("DPADMM_DATA_MIRRORS", f"{mirror.base(variant)},{mirror.base('good')}")
    with pytest.raises(ChecksumError) as info:
        fetch("mnist", progress=False)
    error = info.value
    url = f"{mirror.base(variant)}mnist/{TRAIN_LABELS}.gz"
    message = str(error)
    assert url in message and MNIST_SHA256[TRAIN_LABELS] in message
    assert error.name == f"{TRAIN_LABELS}.gz" and error.url == url
    assert error.expected == MNIST_SHA256[TRAIN_LABELS]
    if variant == "notgzip":
        assert error.actual is None and "not valid gzip" in message
    else:
        served = gzip.decompress((mirror.root / variant / "mnist" / f"{TRAIN_LABELS}.gz").read_bytes())
        assert error.actual == hashlib.sha256(served).hexdigest() != error.expected
        assert error.actual in message
    assert isinstance(error, DownloadError) and isinstance(error, FileNotFoundError)
    assert mirror.requests == [f"/{variant}/mnist/{TRAIN_LABELS}.gz"]
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
    monkeypatch.setenv("DPADMM_DATA_MIRRORS", f"{mirror.base('empty')},{mirror.base('good')}")
    fetch("mnist", progress=False)
    assert mirror.requests == [f"/empty/mnist/{TEST_LABELS}.gz", f"/good/mnist/{TEST_LABELS}.gz"]
    assert (cache / f"{TEST_LABELS}.gz").read_bytes() == (mnist_gz / f"{TEST_LABELS}.gz").read_bytes()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # progress=False is quiet


def test_a_truncated_body_falls_back_and_leaves_no_file(
    mirror: Mirror, cache: Path, mnist_gz: Path
) -> None:
    _seed(cache, mnist_gz, (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES))
    with pytest.raises(DownloadError, match=r"connection closed after \d+ of \d+ bytes"):
        fetch("mnist", mirrors=[mirror.base("truncated")], progress=False)
    assert not (cache / f"{TEST_LABELS}.gz").exists() and len(_listing(cache)) == 3
    # The mirrors argument wins over DPADMM_DATA_MIRRORS (which names good/ alone).
    fetch("mnist", mirrors=[mirror.base("truncated"), mirror.base("good")], progress=False)
    assert (cache / f"{TEST_LABELS}.gz").read_bytes() == (mnist_gz / f"{TEST_LABELS}.gz").read_bytes()


def test_all_mirrors_failing_lists_each_one(mirror: Mirror, cache: Path, mnist_gz: Path) -> None:
    _seed(cache, mnist_gz, (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES))
    refused = f"http://127.0.0.1:{_closed_port()}/mnist/"
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        hanging = f"http://127.0.0.1:{silent.getsockname()[1]}/mnist"
        with pytest.raises(DownloadError) as info:
            fetch("mnist", mirrors=[mirror.base("empty"), refused, hanging], progress=False, timeout=0.5)
    message = str(info.value)
    assert "tried 3 source(s)" in message and str(cache) in message and "DPADMM_DATA_MIRRORS" in message
    assert f"put {TEST_LABELS} (plain or .gz; its content has SHA-256 {MNIST_SHA256[TEST_LABELS]})" in message
    assert f"{mirror.base('empty')}mnist/{TEST_LABELS}.gz: HTTPError: HTTP Error 404" in message
    assert f"{refused}mnist/{TEST_LABELS}.gz: " in message and "refused" in message.lower()
    assert f"{hanging}/mnist/{TEST_LABELS}.gz: " in message and "timed out" in message
    assert not isinstance(info.value, ChecksumError)
    assert len(_listing(cache)) == 3


# --- load_dataset: which folder --------------------------------------------------------------------


def test_complete_data_dir_needs_no_network(
    cache: Path, mnist_gz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPADMM_DATA_MIRRORS", f"http://127.0.0.1:{_closed_port()}/")
    assert mnist_folder(mnist_gz) == mnist_gz
    assert mnist_folder(str(mnist_gz)) == mnist_gz
    assert not cache.parent.exists()


def test_an_incomplete_data_dir_is_refused_not_replaced_by_the_cache(
    mirror: Mirror, cache: Path, mnist_gz: Path, tmp_path: Path
) -> None:
    """A folder that lacks MNIST files (another data set's, a partial copy) is refused, naming what it lacks
    and how to use the cache: training on the cache's files instead would leave a config.json that names
    a folder the run never read. Nothing is downloaded, the cache is not touched, the folder not written."""
    mine = tmp_path / "mine"
    _seed(mine, mnist_gz, (TEST_LABELS,))
    _seed(cache, mnist_gz, MNIST_FILES)
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("mnist", mine)
    message = str(info.value)
    assert str(mine.resolve()) in message and f"{TRAIN_IMAGES}[.gz]" in message
    assert f"{TEST_LABELS}[.gz]" not in message  # the one file it holds
    assert "no data-dir to use the cache" in message and "dpadmm data fetch mnist" in message
    assert mirror.requests == [] and _listing(mine) == [f"{TEST_LABELS}.gz"]


def test_a_data_dir_that_does_not_exist_is_an_error_not_a_download(mirror: Mirror, cache: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        load_dataset("mnist", cache.parent / "nowhere")
    assert not isinstance(info.value, DownloadError)
    assert mirror.requests == [] and not cache.exists()


# --- settings -------------------------------------------------------------------------------------


def test_mirror_and_cache_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DPADMM_DATA_MIRRORS", raising=False)
    assert data_mirrors() is None  # the public sources
    assert MNIST_BASES == ("https://ossci-datasets.s3.amazonaws.com/mnist/",
                           "https://storage.googleapis.com/cvdf-datasets/mnist/")
    assert all(f.urls == tuple(base + f.path for base in MNIST_BASES) for f in SOURCES["mnist"].files)
    monkeypatch.setenv("DPADMM_DATA_MIRRORS", "  ")
    assert data_mirrors() is None
    monkeypatch.setenv("DPADMM_DATA_MIRRORS", " http://a.example/data , ,file:///b/x/ ")
    assert data_mirrors() == ["http://a.example/data/", "file:///b/x/"]
    assert data_mirrors(["http://c.example"]) == ["http://c.example/"]
    with pytest.raises(ValueError, match="no mirror given"):
        data_mirrors([" "])
    with pytest.raises(ValueError, match="data set 'gisette' is not known; choose one of mnist, femnist"):
        fetch("gisette")

    monkeypatch.delenv("DPADMM_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "dpadmm"
    assert dataset_cache_dir("mnist") == tmp_path / ".cache" / "dpadmm" / "mnist"
    monkeypatch.setenv("DPADMM_CACHE", str(tmp_path / "c"))
    assert dataset_cache_dir("a9a") == tmp_path / "c" / "a9a"


# --- every data set: file:// mirrors made of ../shared/data, and the public sources' packings ---------


@pytest.fixture
def shared_mirror(binary_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """DPADMM_DATA_MIRRORS at ../shared/data itself, a file:// mirror laid out as the cache is."""
    base = binary_dir.as_uri() + "/"
    monkeypatch.setenv("DPADMM_DATA_MIRRORS", base)
    return base


@pytest.mark.parametrize("name", ["a9a", "a8a", "adult",  # the large ones (9 s each) in the full suite
                                  pytest.param("ijcnn1", marks=pytest.mark.slow),
                                  pytest.param("femnist", marks=pytest.mark.slow)])
def test_each_data_set_is_fetched_checked_and_read_as_from_the_shared_folder(
        name: str, shared_mirror: str, binary_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        ) -> None:
    """Without data-dir, the first load fetches the data set into the cache; the loader then reads from there
    what it reads from ../shared/data."""
    from dpadmm.data.adult import load_adult
    from dpadmm.data.libsvm import load_binary

    monkeypatch.setenv("DPADMM_CACHE", str(tmp_path / "cache"))
    if name == "femnist":  # the fetched sample is one of the shared folder's two
        fetched = load_dataset("femnist", "", 20)
        direct = load_dataset("femnist", binary_dir / "femnist" / "leaf-sample-a", 20)
    elif name == "adult":
        fetched, direct = load_adult(""), load_adult(binary_dir / "adult")
    else:
        fetched, direct = load_binary(name, ""), load_binary(name, binary_dir / name)
    for part in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(fetched, part), getattr(direct, part)), part
    folder = tmp_path / "cache" / name
    for file in SOURCES[name].files:
        copy, original = folder / file.path, binary_dir / name / file.path
        assert gzip.decompress(copy.read_bytes()) == gzip.decompress(original.read_bytes())
    assert not [p for p in folder.rglob(".*")]  # no temporary file left


@pytest.mark.parametrize("fault", ["flipped", "truncated"])
def test_a_corrupt_or_truncated_mirror_is_refused_and_nothing_is_saved(
        fault: str, binary_dir: Path, tmp_path: Path) -> None:
    """A mirror whose file was damaged in storage (a byte flipped) or cut short by a copy that stopped: the
    content does not decompress to what its SHA-256 says, and no file gets the final name."""
    mirror = tmp_path / "mirror"
    shutil.copytree(binary_dir / "a9a", mirror / "a9a")
    {"truncated": truncated, "flipped": flipped}[fault](mirror / "a9a" / "a9a.t.gz")
    with pytest.raises(ChecksumError, match=r"a9a\.t\.gz from file://.* (is not valid gzip data|failed its "
                                            r"checksum).*nothing was saved") as info:
        fetch("a9a", tmp_path / "cache", mirrors=[mirror.as_uri()], progress=False)
    assert info.value.expected == SOURCES["a9a"].files[1].sha256
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["a9a.gz"]  # the good file, only


@pytest.mark.parametrize("packing", ["plain", "bz2"])
def test_plain_and_bzip2_sources_are_checked_and_kept_gzip_compressed(
        packing: str, binary_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The public sources serve a9a as plain text and ijcnn1 as bzip2: the same file, served either way
    from its own URL (a file:// copy), arrives as a .gz of the same content."""
    import bz2
    import dataclasses

    served = tmp_path / "served"
    served.mkdir()
    source = SOURCES["a9a"]
    files = []
    for file in source.files:
        content = gzip.decompress((binary_dir / "a9a" / file.path).read_bytes())
        name = file.path.removesuffix(".gz") + (".bz2" if packing == "bz2" else "")
        (served / name).write_bytes(bz2.compress(content) if packing == "bz2" else content)
        files.append(dataclasses.replace(file, urls=((served / name).as_uri(),)))
    monkeypatch.setitem(SOURCES, "a9a", dataclasses.replace(source, files=tuple(files)))
    monkeypatch.delenv("DPADMM_DATA_MIRRORS", raising=False)
    folder = fetch("a9a", tmp_path / "cache", progress=False)
    for file in source.files:
        kept = gzip.decompress((folder / file.path).read_bytes())
        assert kept == gzip.decompress((binary_dir / "a9a" / file.path).read_bytes())
        assert hashlib.sha256(kept).hexdigest() == file.sha256


def test_a_data_set_without_a_public_download_says_what_to_put_where(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPADMM_DATA_MIRRORS", raising=False)
    with pytest.raises(DownloadError) as info:
        fetch("bio_train", tmp_path / "bio", progress=False)
    message = str(info.value)
    assert "bio_train cannot be downloaded" in message and "registration" in message
    digest = SOURCES["bio_train"].files[0].sha256
    put = f"put bio_train.dat (plain or .gz; its content has SHA-256 {digest}) into {tmp_path / 'bio'}"
    assert put in message
    assert "DPADMM_DATA_MIRRORS" in message


def test_the_command_fetches_all_and_names_each_licence(
        shared_mirror: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from dpadmm.cli import main

    monkeypatch.setenv("DPADMM_CACHE", str(tmp_path / "cache"))
    assert main(["data", "fetch", "all", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == list(SOURCES)
    for line, source in zip(lines, SOURCES.values(), strict=True):
        assert f"{tmp_path / 'cache' / source.name} " in line and f"licence: {source.licence}" in line
    assert main(["data", "fetch", "all", "--dir", str(tmp_path)]) == 2
    assert "--dir is not allowed with all" in capsys.readouterr().err
