"""Any ``torch.nn.Module`` as the model of DP-IADMM: parameters as a dict of tensors.

The papers' model is multiclass logistic regression (``dpadmm.models.logistic``, the fast path).
Here w, z_p and lambda_p are instead the parameter tensors of a module, a dict
``name -> tensor`` (``Params``), and the module is only a *structure*: it is evaluated
with ``torch.func.functional_call`` on whatever parameters the algorithm holds, so one
module serves every agent, every local iterate and the batched engine.

The agent's objective keeps the form of eq. (63) of 003 with the model's logits in place
of x z:

    f_p(z) = (1/I) sum_{i in p} l_i(z) + (beta/P) ||z||^2,
    l_i(z) = -sum_k y_ik ln softmax(model(z; x_i))_k,

so that with :class:`LogisticRegression` it is exactly the papers' f_p.
The gradient and its per-sample clipping live in :mod:`dpadmm.models.oracles`.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from dpadmm.catalog import MODELS
from dpadmm.models import scattering

Params = dict[str, torch.Tensor]

# MODELS (dpadmm.catalog) names build_model's networks; "custom" is a module given through the Python API
# (the engine's ``module=``, the Flower helpers').


class LogisticRegression(nn.Module):
    """x z with z of shape [J, K] and no bias: eq. (63) of 003 as a module.

    The weight is stored [J, K] (not ``nn.Linear``'s [K, J]) so that its flat layout, and
    therefore its keyed noise, is the same as the fast path's.
    """

    def __init__(self, num_features: int, num_classes: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_features, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.weight


def _require_images(network: str, num_features: int) -> None:
    """A CNN here reads 28 x 28 images (MNIST's and FEMNIST's); another feature count is named."""
    if num_features != 28 * 28:
        raise ValueError(f"{network} takes 28 x 28 images (784 features); got {num_features} features")


class LeafCNN(nn.Module):
    """The LEAF FEMNIST CNN (Caldas et al., 2018): conv 5x5 32, pool, conv 5x5 64, pool, dense 2048, K.

    Inputs are flattened 28 x 28 images ([N, 784]), as the data sets here hold them.
    """

    def __init__(self, num_features: int = 784, num_classes: int = 62):
        super().__init__()
        _require_images("the LEAF CNN", num_features)
        self.conv1 = nn.Conv2d(1, 32, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5, padding=2)
        self.fc1 = nn.Linear(7 * 7 * 64, 2048)
        self.fc2 = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 1, 28, 28)
        x = nn.functional.max_pool2d(nn.functional.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(nn.functional.relu(self.conv2(x)), 2)
        return self.fc2(nn.functional.relu(self.fc1(x.flatten(1))))


class SmallCNN(nn.Module):
    """A CNN sized for DP-SGD: 26,010 parameters for 10 classes (27,726 for FEMNIST's 62).

    Tramer and Boneh's end-to-end MNIST CNN ("Differentially Private Learning Needs Better Features (or Much
    More Data)", ICLR 2021, after Papernot et al., "Tempered Sigmoid Activations for Deep Learning with
    Differential Privacy", AAAI 2021): conv 8x8 16 stride 2 padding 2, tanh, max-pool 2 stride 1, conv 4x4 32
    stride 2, tanh, max-pool 2 stride 1, dense 32, tanh, K. Why beside the LEAF CNN: noise of a fixed
    per-coordinate scale grows with the square root of the parameter count while the clipped signal does
    not, so at a given budget a model 250 times smaller than the LEAF CNN's 6.5 million parameters keeps a far
    larger share of its signal, and tanh's bounded activations keep clipped gradients informative. Inputs
    are flattened 28 x 28 images ([N, 784]).
    """

    def __init__(self, num_features: int = 784, num_classes: int = 10):
        super().__init__()
        _require_images("the small CNN", num_features)
        self.conv1 = nn.Conv2d(1, 16, kernel_size=8, stride=2, padding=2)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=4, stride=2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 1, 28, 28)
        x = nn.functional.max_pool2d(torch.tanh(self.conv1(x)), 2, stride=1)  # [N, 16, 12, 12]
        x = nn.functional.max_pool2d(torch.tanh(self.conv2(x)), 2, stride=1)  # [N, 32, 4, 4]
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


class ScatterCNN(nn.Module):
    """Tramer and Boneh's ScatterNet + CNN for 28 x 28 images: 34,782 trained parameters for 62 classes
    (33,066 for 10) on the scattering transform's 81 x 7 x 7 features (:mod:`dpadmm.models.scattering`).

    "Differentially Private Learning Needs Better Features (or Much More Data)", ICLR 2021, their MNIST
    model on ScatterNet features: conv 3x3 16 stride 2 padding 1, tanh, conv 3x3 32 padding 1, tanh, dense
    32, tanh, K. Why: the fixed front end does what an end-to-end CNN's first layers must learn (oriented
    edges and their local energy, stable to small shifts), so the noisy gradients train only what needs the
    data. It takes flattened images ([N, 784]) as every model here does and computes the features itself;
    a caller that trains on fixed data computes them once instead (:func:`prepared`) and hands the module
    [N, 3969] rows, which it takes as features.
    """

    def __init__(self, num_features: int = 784, num_classes: int = 10):
        super().__init__()
        _require_images("the scatter CNN", num_features)
        self.conv1 = nn.Conv2d(scattering.CHANNELS, 16, kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, num_classes)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """The features of images ``x`` [..., 784]: [..., 3969]; features are returned as they are (see
        :func:`prepared`)."""
        if x.shape[-1] == scattering.NUM_FEATURES:
            return x
        if x.shape[-1] != 28 * 28:
            raise ValueError(f"the scatter CNN takes rows of 784 pixels (28 x 28) or of their "
                             f"{scattering.NUM_FEATURES} scattering features; got rows of {x.shape[-1]}")
        return scattering.features(x.reshape(-1, 28 * 28)).reshape(*x.shape[:-1], scattering.NUM_FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.prepare(x).reshape(-1, scattering.CHANNELS, scattering.OUT_SIDE, scattering.OUT_SIDE)
        x = torch.tanh(self.conv1(x))  # [N, 16, 4, 4]
        x = torch.tanh(self.conv2(x))  # [N, 32, 4, 4]
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


class MLP(nn.Module):
    """A small fully connected network (one hidden layer of 64 units): a cheap non-convex model."""

    def __init__(self, num_features: int, num_classes: int, hidden: int = 64):
        super().__init__()
        self.fc1 = nn.Linear(num_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


def build_model(name: str, num_features: int, num_classes: int) -> nn.Module:
    """The module called ``name`` (one of :data:`MODELS`) for the data set's shape."""
    if name == "logistic":
        return LogisticRegression(num_features, num_classes)
    if name == "cnn":
        return LeafCNN(num_features, num_classes)
    if name == "small-cnn":
        return SmallCNN(num_features, num_classes)
    if name == "scatter-cnn":
        return ScatterCNN(num_features, num_classes)
    if name == "mlp":
        return MLP(num_features, num_classes)
    if name == "custom":
        raise ValueError("model='custom' names a module given through the Python API "
                         "(dpadmm.iadmm.engine.run(config, module=...), clients.dpiadmm.train_reply(..., "
                         "module=...)); the dpadmm app and CLI build logistic, cnn, small-cnn or mlp")
    raise ValueError(f"model={name!r} is not allowed; choose one of {', '.join(MODELS)}")


def initial_parameters(module: nn.Module, seed: int, *, dtype: torch.dtype = torch.float64,
                       device: torch.device | str = "cpu") -> Params:
    """w^1 = z_p^0: zeros for :class:`LogisticRegression`, else the module's own initialisation.

    Algorithm 1 starts from w = z_p = 0, which suits the convex logistic regression; a
    network started at zero has zero gradients in every hidden layer (each unit's input
    and output weights vanish together), so it starts from its seeded default
    initialisation instead: every submodule's ``reset_parameters`` on a copy, under a
    private generator state seeded with ``seed`` (the caller's module and RNG are left
    untouched; parameters a module sets elsewhere keep the values they have).
    """
    module = copy.deepcopy(module)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for child in module.modules():
            if child is not module and hasattr(child, "reset_parameters"):
                child.reset_parameters()
    params = {name: p.detach().clone() for name, p in module.named_parameters()}
    if isinstance(module, LogisticRegression):
        params = {name: torch.zeros_like(p) for name, p in params.items()}
    return {name: p.to(device=device, dtype=dtype) for name, p in params.items()}


_PREPARED: OrderedDict[tuple[Any, ...], torch.Tensor] = OrderedDict()
_PREPARED_KEPT = 4  # data sets' worth: an engine run's agents, test set and training set, and one more


def prepared(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` as the module's trained layers read it: ``module.prepare(x)`` for a module with a fixed
    front end (a ``prepare`` method, as :class:`ScatterCNN`'s), else ``x`` itself.

    A front end is a fixed function of each row, so a caller that passes the same rows many times (an
    agent's data at every local step, a test set at every evaluation) computes it once here. The last few
    results are kept by the module's class and the rows' contents (a digest of their bytes, their shape,
    dtype and device): the same data passed again as another tensor object (``x.to(dtype)`` makes a new
    one) is found too, and no tensor changed in place can be answered with stale features.
    """
    prepare = getattr(module, "prepare", None)
    if prepare is None:
        return x
    contents = x.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()  # any dtype
    key = (type(module), tuple(x.shape), x.dtype, str(x.device),
           hashlib.blake2b(contents, digest_size=16).hexdigest())
    if key in _PREPARED:
        _PREPARED.move_to_end(key)
        return _PREPARED[key]
    with torch.no_grad():
        out = prepare(x.detach())
    _PREPARED[key] = out
    while len(_PREPARED) > _PREPARED_KEPT:
        _PREPARED.popitem(last=False)
    return out


def logits_of(module: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor,
              chunk: int = 2048) -> torch.Tensor:
    """The module's output on the rows of x with ``params`` in place of its own parameters
    (``chunk`` rows at a time, so a whole data set fits in memory; a fixed front end once:
    :func:`prepared`)."""
    x = prepared(module, x)
    return torch.cat([functional_call(module, dict(params), (part,)) for part in x.split(chunk)])


def numel(params: Mapping[str, torch.Tensor], agent_dim: bool = False) -> int:
    """Number of scalar parameters (per agent when the tensors carry a leading agent dimension)."""
    return sum(p[0].numel() if agent_dim else p.numel() for p in params.values())


def fixed_sum(values: torch.Tensor) -> float:
    """The sum of a reported metric's terms, the same whatever the thread count: numpy's pairwise sum in
    float64 on one thread. torch splits a long reduction into one part per thread, so a loss or a
    consensus violation summed by torch changes in its last digits with the threads a run was given,
    even where the iterates do not (DP-IADMM's, whose products are the native kernels' fixed order)."""
    return float(values.detach().to("cpu", torch.float64).numpy().sum())


def tree_map(fn: Callable[..., Any], *trees: Any) -> Any:
    """fn applied per parameter: on the tensors of dicts with the same keys, or on plain tensors.

    This is how each equation of the algorithm, written once for a tensor, applies per tensor
    to a module's parameters (the logistic-regression fast path passes single tensors).
    """
    if isinstance(trees[0], Mapping):
        return {k: fn(*(tree[k] for tree in trees)) for k in trees[0]}
    return fn(*trees)
