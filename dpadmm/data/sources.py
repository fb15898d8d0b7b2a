"""Where each data set comes from: its public source, its licence and the SHA-256 of every file's content.

This is the table :mod:`dpadmm.data.download` fetches from (``dpadmm data fetch NAME | all``). Every file is
kept in the cache gzip-compressed under the path it has here, in a folder per data set, so that the cache
is laid out as a data folder a user would give (``--data-dir``): ``<cache>/a9a/a9a.gz``,
``<cache>/femnist/leaf-sample-a/train/...json.gz``. A mirror (``DPADMM_DATA_MIRRORS``) has the same layout.

The checksum is that of the *decompressed* content: the public sources serve plain text (LIBSVM's a9a,
UCI's Adult, the FEMNIST JSON on GitHub), bzip2 (LIBSVM's ijcnn1) or gzip (MNIST), and the bytes of a
compressed file differ between compressors while the content does not. The digests were computed from
copies whose content was checked against the published MNIST MD5s, UCI's Adult MD5 and the sources' files.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RemoteFile:
    """One file of a data set: its ``path`` in the data set's folder (always ``.gz``: how the cache keeps
    it), the SHA-256 of its decompressed content and the public URLs that serve it, tried in order (each
    plain, ``.gz`` or ``.bz2`` by its suffix)."""

    path: str
    sha256: str
    urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class DataSource:
    """A data set as ``dpadmm data fetch`` knows it."""

    name: str
    title: str  # what it is, with its origin
    licence: str
    homepage: str
    files: tuple[RemoteFile, ...]
    by_hand: str = ""  # where there is no public direct download: how a person gets the files


LIBSVM = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/"
UCI_ADULT = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
MNIST_BASES = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
# the 5% LEAF sample that Ryu & Kim's reference code publishes (MIT licence), at a fixed commit
FEMNIST_REPO = ("https://raw.githubusercontent.com/APPFL/DPFL-IADMM-Classification/"
                "fc8e69db7db68bd667b260035be0da98af4025eb/Inputs/")
MNIST_SHA256 = {  # of the decompressed IDX files
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
FEMNIST_TRAIN = {
    0: "4bafa5a244c5141d38a616d8304c53486d910877452269d10ded76b291f5d86f",
    1: "5f8f4d9f3548adc3bc5c9e6d0aba99f479ab3bf9d0eb1678035124a65916e532",
    2: "17e752624aff3a2751ceda836a095b1e8d3b206f29f3ea33e2180ca0322cb24e",
    3: "1104a4231185634a4f68bfec77a6734eb36b58c5c5e4b5a527cf5044d9848e94",
    4: "7eb5c9ee0be62ff651f3a9c06b774c6dee6c3e1632a6a05879fbc64f8bfb3425",
    15: "3f6d352a9d4ebf701b8f71f6da174c1c908a42943e30471db30a3e2cce6ccba4",
    16: "04bb06156c3b4e7a745dbb640d9b9b34726cc1d1857d729b79fb5ce0e165d895",
    17: "7459616f35e5229ebde8c59bbeadccb2f4f76ce79437ab159a9ce77a95db1036",
    18: "83e7a83296222d938cd653520906d3a746b0586c45c734e7b02288ffdba9a57f",
    19: "9d36298392d1baf4cc30b4fe8a71d3731d727783b34349b22e074fb81ce1d55c",
    20: "e429aaeb83c7fdddb47f3dc897c5841df46c4359b707744bcf8cd224b50a8ee3",
    21: "34a7ccb20abb2ac62316b46f5e91160240095efff774a0fda76d4afd3a1b51ed",
    22: "dec04ce106874ca50d5aa19246b2cf5f80af50797962317f55f6fa4d3db29def",
    23: "71a5a43175103c0db41500c5ca1bb7a84aad005ac3071f1091a118fe645ae2ac",
    24: "cf0b497b729dafd87ce6ff2b0c572a09445a65bcec5a9b8aa0d7f8e1debe9450",
    25: "563f08ce47ca1e0ec4fc996d6c91756a3df79c553c96de0673570fddfe3684ee",
    26: "465916f433be95e6d5b1ab21249f8f2c0de1f17d25bc2adbfeb17c9336164904",
    27: "3a7150540eecf8ae6307d3e5165f6703c9e1ab178adadd1c453e69062ca19062",
    28: "1573c6312f839a4ae7b5b017023ff43c5a0f6e4600ea3287c36004709371e71e",
    29: "74d20a7099880e3c8cd73385566956fa8b8c1398de7288b40fcda2e58bd5da3d",
    30: "bb7820ed17c06ea705ea01bb054983327923fd19dccbede670fce8dc44b3ef88",
}
FEMNIST_TEST = {
    0: "82f10e9da8af5315dcbadfa98a480263b8475f390e7c8e1ee0286bf33c80728d",
    1: "7e6dec8384568551fba3923ec4a9f7c9031572c1db669a75650fa95070158d87",
    2: "5c11dacfb537e03e0448ef71ca54e70eef1eefd7c326fbb4c1d25af555340298",
    3: "f23ce6bc162da06936d9dee1806737bd9cc09aad316341dcd3657cc451e5a649",
    4: "2fb54d5578aa50ecb36814aa716304247fcbb492272c9ca86c8f4c27f510ec91",
    15: "d0f372d9cd75800444da96b88907717146305b2ff1263cf06384e6e96187a2e8",
    16: "cfc7943249d2f79db71bb5866ae70b790cc2eebff336028ff57679a01b397878",
    17: "9e61ddc2efaba9739efc4ecc9942e8de4f8ac6d4996a30ba9c4d5a1996a939cb",
    18: "f3fdb4b7ada4e753355245cb4fe38b5b9a4252105bbb6849e76b1cbd37459507",
    19: "6753451bb497bd5635c06fb8d7ff4b0ccfaa1ceced67a133d2d8386c83af850d",
    20: "92f9b9f671c8b421038cf8cd92a6f88eabd1ecdaa120263eca9500eb769406db",
    21: "1be87f78d15b8913d0e99053a0c706294084dbdda0b24c49b7ff1a387fb40838",
    22: "b94d14fdcfdea449a47891a1aef6d4a898d66ede4d753aea52c38fe01c097910",
    23: "3f7a0132c3a72db7d103bd76730d78c6e6570445c69d27f1b222eaab3faf119e",
    24: "92bbf9f75118830ab92bc319537b8166ae41ec81ed3a262566d9c3fd3dcb42a8",
    25: "57be0148e96ba102ec0d498aea737648b48d5197beb781a81f55155dbba7f3ee",
    26: "d69658f428bc97d970b9cad8a45a5c3b6c86d29b6e046bae0c8252702fffdabb",
    27: "0a1ebc6ab8fa3590d660abe42ea3044d117ba5570c80c8e595cafe8163d9fe82",
    28: "3d3a3af380db24a342bf0b17c6643cdb62282082d3583bbcd01571b81daace80",
    29: "5bec7d72f41d6aab6a6e55ead42653b20d05d1b61375e0ca4c5384dc927e7378",
    30: "a76b5b6a13c69b9bafe7aed8f2d248dc6d80fccc806d4f2e56f8d4ea583b122e",
}


def _libsvm(name: str, sha256: str, source: str) -> RemoteFile:
    return RemoteFile(f"{name}.gz", sha256, (LIBSVM + source,))


def _femnist(split: str, shard: int, sha256: str) -> RemoteFile:
    name = f"all_data_{shard}_niid_05_keep_0_{split}_9.json"
    folder = "Femnist_Train_small" if split == "train" else "Femnist_Test_small"
    return RemoteFile(f"leaf-sample-a/{split}/{name}.gz", sha256, (f"{FEMNIST_REPO}{folder}/{name}",))


LIBSVM_LICENCE = ("LIBSVM Data (Chang & Lin), free for research use; a9a and a8a are UCI Adult (CC BY 4.0) "
                  "in LIBSVM's encoding")
SOURCES: dict[str, DataSource] = {
    "mnist": DataSource(
        "mnist", "MNIST handwritten digits (LeCun, Cortes & Burges)",
        "CC BY-SA 3.0 (as torchvision and TensorFlow Datasets state it)", "http://yann.lecun.com/exdb/mnist/",
        tuple(RemoteFile(f"{name}.gz", sha256, tuple(f"{base}{name}.gz" for base in MNIST_BASES))
              for name, sha256 in MNIST_SHA256.items())),
    "femnist": DataSource(
        "femnist", "FEMNIST, LEAF's 5% non-IID sample (Caldas et al.), as Ryu & Kim's reference code has it",
        "MIT (github.com/APPFL/DPFL-IADMM-Classification); LEAF's FEMNIST derives from NIST SD 19",
        "https://github.com/APPFL/DPFL-IADMM-Classification",
        tuple(_femnist("train", int(k), h) for k, h in FEMNIST_TRAIN.items())
        + tuple(_femnist("test", int(k), h) for k, h in FEMNIST_TEST.items())),
    "a9a": DataSource("a9a", "a9a (UCI Adult in LIBSVM's binary encoding)", LIBSVM_LICENCE, LIBSVM, (
        _libsvm("a9a", "f5d5ffd8d865ff41328e7ee043e4b020816914ff6843ff15b98905ddbedce906", "a9a"),
        _libsvm("a9a.t", "1f448a153f0320399a7e40836eb207655b0bde0f21fc941cc472193daa9f5de9", "a9a.t"))),
    "a8a": DataSource("a8a", "a8a (a split of UCI Adult in LIBSVM's binary encoding)", LIBSVM_LICENCE,
                      LIBSVM, (
        _libsvm("a8a", "8379b6372500ac78b4e64e062b0f2f8c6efd142c42fc0dd8d485c3263d56c9d3", "a8a"),
        _libsvm("a8a.t", "fc16c3580048add99056ee4d14105c93f0af63fb8ff6a78f3d66bf5d87c13cd3", "a8a.t"))),
    "ijcnn1": DataSource(
        "ijcnn1", "ijcnn1 (IJCNN 2001 neural network competition, Prokhorov), in LIBSVM's format",
        "LIBSVM Data (Chang & Lin), free for research use", LIBSVM, (
            _libsvm("ijcnn1", "7fe291672c3fefe6a7e3c51529becd23f0e985ba05ffb8d53c9c648c1e91cc19",
                    "ijcnn1.bz2"),
            _libsvm("ijcnn1.t", "e7b0bbd518641980dc322746c6bc59d019d3153934e6258e48f9d8cfae2c4bb8",
                    "ijcnn1.t.bz2"))),
    "bio_train": DataSource(
        "bio_train", "KDD Cup 2004 protein homology (bio_train.dat)",
        "KDD Cup 2004 terms: for research use, cite the KDD Cup 2004", "https://osmot.cs.cornell.edu/kddcup/",
        (RemoteFile("bio_train.dat.gz", "67ac6fbc20906cbefda41ef42e17a0fdb84f3900f9032fee036d13d233d933d2"),),
        by_hand=("the KDD Cup 2004 site (https://osmot.cs.cornell.edu/kddcup/) hands its data out after a "
                 "registration form, so there is no direct download: take bio_train.dat from its data "
                 "archive")),
    "adult": DataSource(
        "adult", "UCI Adult (census income; Becker & Kohavi)", "CC BY 4.0",
        "https://archive.ics.uci.edu/dataset/2/adult",
        tuple(RemoteFile(f"{name}.gz", sha256, (UCI_ADULT + name,)) for name, sha256 in (
            ("adult.data", "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d"),
            ("adult.test", "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05"),
            ("adult.names", "c248284c0b5de30c9e1958d6cdd168a34a654758b620e68f46aefa83fc0a576a"),
        ))),
}
