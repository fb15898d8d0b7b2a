"""dpadmm.models.modules: the models by name, their shapes, seeded initial parameters and the tree helpers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpadmm.models.modules import (
    MLP,
    MODELS,
    LeafCNN,
    LogisticRegression,
    ScatterCNN,
    SmallCNN,
    build_model,
    initial_parameters,
    logits_of,
    numel,
    prepared,
    tree_map,
)
from dpadmm.models.oracles import factorizable_layers


@pytest.mark.parametrize(("name", "kind"), [("logistic", LogisticRegression), ("cnn", LeafCNN),
                                           ("small-cnn", SmallCNN), ("scatter-cnn", ScatterCNN),
                                           ("mlp", MLP)])
def test_build_model_by_name(name: str, kind: type[nn.Module]) -> None:
    """Every name of MODELS (the config's allowed values) builds its module for the data set's shape."""
    assert name in MODELS
    model = build_model(name, 784, 62)
    assert isinstance(model, kind)
    assert model(torch.zeros(3, 784)).shape == (3, 62)


def test_build_model_names_the_bad_value_and_the_allowed_ones() -> None:
    allowed = (r"model='resnet' is not allowed; choose one of logistic, cnn, small-cnn, scatter-cnn, mlp, "
               r"custom")
    with pytest.raises(ValueError, match=allowed):
        build_model("resnet", 784, 10)


def test_build_model_says_a_custom_model_comes_through_the_python_api() -> None:
    """'custom' is allowed in the config (a module passed to the engine) but names nothing to build."""
    assert "custom" in MODELS
    with pytest.raises(ValueError, match=r"model='custom' names a module given through the Python API"):
        build_model("custom", 784, 10)


def test_leaf_cnn_is_the_leaf_femnist_network() -> None:
    """784 inputs (28 x 28), 62 classes, and LEAF's 6,603,710 parameters (conv 32, conv 64, dense 2048)."""
    model = LeafCNN()
    assert sum(p.numel() for p in model.parameters()) == 6_603_710
    assert numel(dict(model.named_parameters())) == 6_603_710
    assert model(torch.rand(2, 784)).shape == (2, 62)


def test_small_cnn_is_tramer_and_bonehs_network() -> None:
    """26,010 parameters for 10 classes (conv 16 8x8 stride 2, conv 32 4x4 stride 2, dense 32), and a
    factorizable one: every parameter in a Linear or Conv2d layer, so per-sample='factorized' takes it."""
    model = SmallCNN()
    assert numel(dict(model.named_parameters())) == 26_010
    assert set(factorizable_layers(model)) == {"conv1", "conv2", "fc1", "fc2"}
    assert model(torch.rand(2, 784)).shape == (2, 10)


def test_scatter_cnn_is_tramer_and_bonehs_scatternet_cnn() -> None:
    """34,782 parameters for 62 classes (conv 16 3x3 stride 2 and conv 32 3x3 on the 81 x 7 x 7 scattering
    features, dense 32), all in Linear and Conv2d layers (factorizable); it takes images or their features."""
    model = ScatterCNN(784, 62)
    params = initial_parameters(model, 0)
    assert numel(params) == 34_782 and numel(initial_parameters(ScatterCNN(), 0)) == 33_066
    assert set(factorizable_layers(model)) == {"conv1", "conv2", "fc1", "fc2"}
    assert not list(model.buffers())  # the filters are constants, not state the per-sample clipping refuses
    images = torch.rand(5, 784, dtype=torch.float64)
    features = model.prepare(images)
    assert features.shape == (5, 3969) and features.dtype == torch.float64
    torch.testing.assert_close(logits_of(model, params, images), logits_of(model, params, features))
    with pytest.raises(ValueError, match=r"784 pixels \(28 x 28\) or of their 3969 scattering features; got "
                                         r"rows of 100$"):
        model(torch.rand(2, 100))


def test_prepared_computes_a_front_end_once_per_contents() -> None:
    """The same rows passed again, as another tensor object, are answered from the cache; rows changed in
    place are not; a module without a front end gets its input back."""
    model = ScatterCNN(784, 10)
    images = torch.rand(4, 784, dtype=torch.float64)
    first = prepared(model, images)
    assert prepared(model, images.clone()) is first
    images[0, 0] += 0.5
    changed = prepared(model, images)
    assert changed is not first and not torch.equal(changed[0], first[0])
    assert torch.equal(changed[1:], first[1:])  # each image's features are its own
    assert prepared(MLP(784, 10), images) is images


@pytest.mark.parametrize("kind", [LeafCNN, SmallCNN, ScatterCNN])
@pytest.mark.parametrize("features", [783, 3 * 32 * 32])
def test_the_cnns_refuse_other_feature_counts(kind: type[nn.Module], features: int) -> None:
    with pytest.raises(ValueError, match=f"784 features\\); got {features} features"):
        kind(features, 62)


def test_logistic_regression_module_is_x_times_z() -> None:
    """The weight is [J, K] (the fast path's layout) and the output x z, without bias."""
    model = LogisticRegression(5, 3)
    assert [name for name, _ in model.named_parameters()] == ["weight"]
    z = torch.randn(5, 3, dtype=torch.float64)
    x = torch.randn(4, 5, dtype=torch.float64)
    torch.testing.assert_close(logits_of(model, {"weight": z}, x), x @ z, rtol=0, atol=0)


def test_initial_parameters_are_deterministic_per_seed_and_differ_across_seeds() -> None:
    model = MLP(20, 4)
    first, again, other = (initial_parameters(model, s) for s in (7, 7, 8))
    assert list(first) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    for name in first:
        assert first[name].dtype == torch.float64
        assert torch.equal(first[name], again[name])
        assert not torch.equal(first[name], other[name])
        assert first[name].abs().sum() > 0  # not the zero start that stalls a network


def test_initial_parameters_of_logistic_regression_are_zero() -> None:
    """Algorithm 1's w = z_p = 0, as the fast path starts."""
    params = initial_parameters(LogisticRegression(6, 4), seed=3, dtype=torch.float32)
    assert list(params) == ["weight"] and params["weight"].shape == (6, 4)
    assert params["weight"].dtype == torch.float32 and not params["weight"].any()


def test_initial_parameters_leave_the_global_rng_and_the_module_untouched() -> None:
    torch.manual_seed(123)
    model = MLP(10, 3)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rng = torch.get_rng_state()
    params = initial_parameters(model, seed=5)
    assert torch.equal(torch.get_rng_state(), rng)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])
        assert not torch.equal(params[name], p.detach().to(torch.float64))  # a fresh initialisation
    # the next global draw is the one it would have been without the call
    expected = torch.rand(3, generator=torch.Generator().set_state(rng))
    assert torch.equal(torch.rand(3), expected)


def test_tree_map_on_dicts_and_tensors() -> None:
    a = {"x": torch.tensor([1.0, 2.0]), "y": torch.tensor([[3.0]])}
    b = {"x": torch.tensor([10.0, 20.0]), "y": torch.tensor([[30.0]])}
    summed = tree_map(torch.add, a, b)
    assert list(summed) == ["x", "y"]
    assert torch.equal(summed["x"], torch.tensor([11.0, 22.0]))
    assert torch.equal(summed["y"], torch.tensor([[33.0]]))
    assert torch.equal(tree_map(lambda u, v: u * v, torch.tensor(3.0), torch.tensor(4.0)), torch.tensor(12.0))
    assert numel(a) == 3
    stacked = {k: v.expand(4, *v.shape) for k, v in a.items()}
    assert numel(stacked, agent_dim=True) == 3


def test_logits_of_in_chunks_equals_one_call() -> None:
    model = MLP(12, 5)
    params = initial_parameters(model, seed=1)
    x = torch.randn(103, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    whole = logits_of(model, params, x, chunk=1000)
    assert whole.shape == (103, 5)
    torch.testing.assert_close(logits_of(model, params, x, chunk=10), whole, rtol=0, atol=1e-15)
    torch.testing.assert_close(logits_of(model, params, x, chunk=1), whole, rtol=0, atol=1e-15)
