"""The names a run configuration is checked against, apart from the modules that implement them.

:class:`dpadmm.iadmm.config.RunConfig` validates its keys against these tuples, and the ``dpadmm`` command
builds its flags from RunConfig. Keeping the names here, without importing torch, lets
``dpadmm --help`` and ``dpadmm privacy`` start in a fraction of a second; the modules named
(:mod:`dpadmm.data`, :mod:`dpadmm.models.modules`, :mod:`dpadmm.privacy.noise`) import them from here.
"""

DATASET_NAMES = ("default", "mnist", "femnist")  # what dpadmm.data.load_dataset knows

# Every data set here is 28 x 28 images; FEMNIST has 62 classes (digits and both cases of letters).
NUM_FEATURES = 28 * 28
NUM_CLASSES = {"default": 10, "mnist": 10, "femnist": 62}

# P when num-agents is 0: the papers' 10 MNIST agents, and one agent per FEMNIST writer (195).
DEFAULT_AGENTS = {"default": 10, "mnist": 10, "femnist": 195}

# what dpadmm.models.modules.build_model knows
MODELS = ("logistic", "cnn", "small-cnn", "scatter-cnn", "mlp", "custom")

# dpadmm.privacy.noise's generators (see its "A faster generator for large models")
GENERATORS = ("philox", "torch")

# Paper 002's binary data sets (Table I), read by dpadmm.data.libsvm.
BINARY_DATASET_NAMES = ("a9a", "a8a", "ijcnn1", "bio_train")
