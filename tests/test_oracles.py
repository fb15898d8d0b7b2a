"""dpadmm.models.oracles: clipped per-sample gradients against autograd, the sensitivity bound, minibatches,
scales.

The privacy of a module run rests on three facts tested here: the oracle's gradient is
(1/I) sum_i clip_C(grad l_i) + (2 beta/P) z exactly (compared with a per-sample
``torch.autograd.grad`` loop that shares no code with ``torch.func``), one replaced sample
moves it by at most 2C/I in the clipping norm, and the noise scale is the ledger's.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from dpadmm.iadmm import local, privacy
from dpadmm.iadmm.config import RunConfig, papers
from dpadmm.iadmm.local import agent_round
from dpadmm.models.logistic import AgentData, clip_factors, probabilities
from dpadmm.models.modules import MLP, LogisticRegression, Params, ScatterCNN, SmallCNN
from dpadmm.models.oracles import poisson_rows
from dpadmm.privacy import noise
from dpadmm.privacy.ledger import clipped_sensitivity

J, K, HIDDEN = 6, 3, 5
COUNTS = (7, 2, 9, 5)
TOTAL = 40


def _data(seed: int = 0, counts: tuple[int, ...] = COUNTS) -> AgentData:
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.rand(c, J, generator=gen, dtype=torch.float64) * 2 for c in counts]
    ys = [torch.randint(0, K, (c,), generator=gen) for c in counts]
    return AgentData.from_blocks(xs, ys, num_classes=K, total=TOTAL, agents=range(len(counts)))


def _params(module: nn.Module, agents: int, seed: int = 1) -> Params:
    """Different random parameters for every agent: dict of [P, ...] float64 tensors."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(agents, *p.shape, generator=gen, dtype=torch.float64)
            for name, p in module.named_parameters()}


def _config(**overrides: object) -> RunConfig:
    values: dict = {"algorithm": "objpm", "epsilon": 0.5, "local_steps": 2, "num_agents": len(COUNTS),
                    "beta": 0.3, "clip_norm": 1.0, "model": "mlp"}
    values.update(overrides)
    return papers(**values)


def _explicit(config: RunConfig, module: nn.Module, z: Params, data: AgentData,
              rows: list[list[int]] | None = None, scale: float | None = None) -> Params:
    """(1/I) (I_p/B_p) sum_i clip(grad l_i(z_p)) + (2 beta/P) z_p, one sample at a time with autograd
    (``scale`` in place of (1/I) (I_p/B_p): a Poisson sample's 1/(qI)).

    The module's own parameters are overwritten with z_p and differentiated by
    ``torch.autograd.grad``, so nothing of ``torch.func`` or the oracle is reused.
    """
    model = copy.deepcopy(module).to(torch.float64)
    names = [name for name, _ in model.named_parameters()]
    out = {name: torch.zeros_like(v) for name, v in z.items()}
    for p in range(data.num_agents):
        count = int(data.counts[p])
        chosen = list(range(count)) if rows is None else [r for r in rows[p] if r < count]
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(z[name][p])
        for i in chosen:
            loss = -(data.y[p, i] * torch.log_softmax(model(data.x[p, i].unsqueeze(0))[0], dim=-1)).sum()
            grads = torch.autograd.grad(loss, list(model.parameters()))
            flat = torch.cat([g.flatten() for g in grads])
            size = flat.norm(p=2) if config.clip_norm_type == "l2" else flat.abs().sum()
            factor = min(1.0, config.clip_norm / float(size))
            for name, g in zip(names, grads, strict=True):
                out[name][p] += factor * g
        factor = count / len(chosen) / data.total if scale is None else scale
        for name in out:
            out[name][p] = out[name][p] * factor + 2 * config.beta / config.num_agents * z[name][p]
    return out


def _clipped_fraction(config: RunConfig, module: nn.Module, z: Params, data: AgentData) -> float:
    """The fraction of real samples whose gradient norm exceeds C (so the test exercises clipping)."""
    model = copy.deepcopy(module).to(torch.float64)
    above, seen = 0, 0
    for p in range(data.num_agents):
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(z[name][p])
        for i in range(int(data.counts[p])):
            loss = -(data.y[p, i] * torch.log_softmax(model(data.x[p, i].unsqueeze(0))[0], dim=-1)).sum()
            flat = torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))])
            size = flat.norm(p=2) if config.clip_norm_type == "l2" else flat.abs().sum()
            above += int(size > config.clip_norm)
            seen += 1
    return above / seen


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_clipped_gradient_equals_a_per_sample_autograd_loop(mechanism: str) -> None:
    """L1 clipping for Laplace noise, L2 for Gaussian; some samples clipped, some not."""
    data = _data()
    module = MLP(J, K, hidden=HIDDEN)
    z = _params(module, data.num_agents)
    clip = 3.0 if mechanism == "laplace" else 1.0
    config = _config(mechanism=mechanism, clip_norm=clip)
    assert 0.1 < _clipped_fraction(config, module, z, data) < 0.9
    g, scale = local.oracle(config, data, module).gradient(z, t=1, e=1)
    expected = _explicit(config, module, z, data)
    assert list(g) == list(expected)
    for name in g:
        torch.testing.assert_close(g[name], expected[name], rtol=1e-10, atol=1e-13)
    assert scale is not None and scale.shape == (data.num_agents,)


def test_without_noise_the_gradient_is_not_clipped() -> None:
    """iadmm (non-private) takes the plain gradient of f_p and returns no noise scale."""
    data = _data()
    module = MLP(J, K, hidden=HIDDEN)
    z = _params(module, data.num_agents)
    config = _config(algorithm="iadmm", clip_norm=1e-3)
    g, scale = local.oracle(config, data, module).gradient(z, t=1, e=1)
    expected = _explicit(_config(clip_norm=1e300), module, z, data)
    assert scale is None
    for name in g:
        torch.testing.assert_close(g[name], expected[name], rtol=1e-10, atol=1e-13)


def _norm(tensors: Params, p: int, kind: str) -> float:
    flat = torch.cat([v[p].flatten() for v in tensors.values()])
    return float(flat.norm(p=2) if kind == "l2" else flat.abs().sum())


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_one_replaced_sample_moves_the_gradient_by_at_most_2c_over_i(mechanism: str) -> None:
    """Agents 1..4 hold agent 0's data with one sample replaced by an adversarial, huge one.

    At the same z, their clipped gradients differ from agent 0's by at most 2C/I in the
    clipping norm (Delta of eq. (9a)); unclipped, the same replacements move it several times more
    (tanh saturates, so a huge input does not give a huge gradient).
    """
    gen = torch.Generator().manual_seed(4)
    base_x = torch.rand(8, J, generator=gen, dtype=torch.float64)
    base_y = torch.randint(0, K, (8,), generator=gen)
    xs, ys = [base_x], [base_y]
    for i, magnitude in enumerate((1e2, 1e4, -1e3, 1e6)):
        x, y = base_x.clone(), base_y.clone()
        x[2 * i] = torch.randn(J, generator=gen, dtype=torch.float64) * magnitude
        y[2 * i] = (y[2 * i] + 1) % K
        xs.append(x)
        ys.append(y)
    data = AgentData.from_blocks(xs, ys, num_classes=K, total=TOTAL, agents=range(5))
    module = MLP(J, K, hidden=HIDDEN)
    one = _params(module, 1, seed=9)
    z = {name: v.expand(5, *v.shape[1:]).clone() for name, v in one.items()}
    config = _config(mechanism=mechanism, num_agents=5, clip_norm=0.5)
    g, _ = local.oracle(config, data, module).gradient(z, t=1, e=1)
    free, _ = local.oracle(_config(algorithm="iadmm", num_agents=5), data, module).gradient(z, t=1, e=1)
    bound = clipped_sensitivity(config.clip_norm, TOTAL, "replace-one")
    kind = config.clip_norm_type
    for p in range(1, 5):
        moved = _norm({k: g[k][p:p + 1] - g[k][0:1] for k in g}, 0, kind)
        assert 0 < moved <= bound * (1 + 1e-12)
        assert _norm({k: free[k][p:p + 1] - free[k][0:1] for k in free}, 0, kind) > 2 * bound


def test_the_loop_over_agents_equals_vmap_and_chunking_changes_nothing() -> None:
    """vectorize=False, and budgets that split agents and samples into chunks, give the same numbers."""
    data = _data()
    module = MLP(J, K, hidden=HIDDEN)
    z = _params(module, data.num_agents)
    config = _config(mechanism="gaussian")
    whole, scale = local.oracle(config, data, module).gradient(z, 2, 1)
    per_sample = sum(v[0].numel() for v in z.values())
    for vectorize, budget in ((False, 2**26), (True, per_sample * 2), (False, per_sample * 3),
                              (True, per_sample * 20)):
        g, other = local.oracle(config, data, module, vectorize=vectorize, budget=budget).gradient(z, 2, 1)
        assert torch.equal(other, scale)
        for name in g:
            torch.testing.assert_close(g[name], whole[name], rtol=1e-12, atol=1e-15)


def test_minibatch_rows_are_distinct_real_rows_and_keyed() -> None:
    """B_p = min(B, I_p) rows per agent, without replacement, from the stream (seed, agent, t, e).

    Agent 1 has I_p = 2 < B = 3: it takes both its rows (and a padding row that adds nothing).
    The same agent alone (a Flower client: P = 1) draws the same rows as in the batch.
    """
    data = _data()
    size = 3
    config = _config(batch_size=size)
    oracle = local.oracle(config, data, MLP(J, K, hidden=HIDDEN))
    rows, taken, factor = oracle._batch(1, 1)
    assert taken is None
    assert rows is not None and rows.shape == (data.num_agents, size)
    for p, count in enumerate(COUNTS):
        chosen = rows[p].tolist()
        assert len(set(chosen)) == size
        if count >= size:
            assert max(chosen) < count
        else:
            assert sorted(chosen[:count]) == list(range(count)) and min(chosen[count:]) >= count
        assert float(factor[p]) == pytest.approx(count / min(size, count) / TOTAL, rel=1e-15)
    again = local.oracle(config, data, MLP(J, K, hidden=HIDDEN))._batch(1, 1)[0]
    assert torch.equal(rows, again)
    alone = local.oracle(config, data.select(slice(2, 3)), MLP(J, K, hidden=HIDDEN))._batch(1, 1)[0]
    assert torch.equal(alone[0], rows[2])
    others = [oracle._batch(t, e)[0] for t, e in ((1, 2), (2, 1), (3, 2))]
    other_seed = local.oracle(_config(batch_size=size, seed=1), data, MLP(J, K, hidden=HIDDEN))
    others.append(other_seed._batch(1, 1)[0])
    for other in others:  # the big agents' rows change between steps and seeds
        assert not torch.equal(other[[0, 2]], rows[[0, 2]])
    expected_keys = noise.uniform(config.seed, data.agents, 1, 1, noise.STREAM_BATCH, data.x.shape[1])
    assert rows[0].tolist() == expected_keys[0, :COUNTS[0]].argsort()[:size].tolist()


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_minibatch_gradient_is_the_rescaled_clipped_sum_over_its_rows(mechanism: str) -> None:
    data = _data()
    module = MLP(J, K, hidden=HIDDEN)
    z = _params(module, data.num_agents)
    config = _config(batch_size=4, mechanism=mechanism)
    oracle = local.oracle(config, data, module)
    rows = oracle._batch(2, 3)[0]
    assert rows is not None
    g, _ = oracle.gradient(z, 2, 3)
    expected = _explicit(config, module, z, data, rows.tolist())
    for name in g:
        torch.testing.assert_close(g[name], expected[name], rtol=1e-10, atol=1e-13)


def test_a_batch_as_large_as_the_biggest_agent_is_the_full_batch() -> None:
    data = _data()
    module = MLP(J, K, hidden=HIDDEN)
    z = _params(module, data.num_agents)
    full, full_scale = local.oracle(_config(), data, module).gradient(z, 1, 1)
    for size in (max(COUNTS), 1000):
        g, scale = local.oracle(_config(batch_size=size), data, module).gradient(z, 1, 1)
        assert torch.equal(scale, full_scale)
        for name in g:
            assert torch.equal(g[name], full[name])


@pytest.mark.parametrize(("mechanism", "size"), [("laplace", 0), ("laplace", 4), ("gaussian", 4)])
def test_noise_scale_is_the_ledgers(mechanism: str, size: int) -> None:
    """Delta / eps-bar per agent with Delta = 2C/I x I_p / B_p (the ledger's words and numbers), and the
    noise a round actually draws has that scale (mean |xi| = b for Laplace, sigma sqrt(2/pi) for Gaussian)."""
    data = _data()
    module = MLP(J, K, hidden=64)
    config = _config(mechanism=mechanism, batch_size=size, epsilon=0.25, clip_norm=2.0, local_steps=10)
    _, scale = local.oracle(config, data, module).gradient(_params(module, data.num_agents), 1, 1)
    ledger = privacy.ledger(config, total_samples=TOTAL)
    delta = clipped_sensitivity(config.clip_norm, TOTAL, "replace-one")
    assert f"2C/I{' x I_p / B_p' if size else ''} = {delta:.6g}" in ledger.sensitivity
    assert f"= {delta / config.epsilon:.6g}" in ledger.noise_scale
    assert ledger.noise_multiplier == pytest.approx(1 / config.epsilon)
    assert ledger.sensitivity.startswith("L2" if mechanism == "gaussian" else "L1")
    assert scale is not None
    for p, count in enumerate(COUNTS):
        batch = min(size, count) if size else count
        assert float(scale[p]) == pytest.approx(delta * count / batch * ledger.noise_multiplier, rel=1e-14)
    z = _params(module, data.num_agents)
    w = {name: v[0] for name, v in z.items()}
    lam = {name: torch.zeros_like(v) for name, v in z.items()}
    result = agent_round(config, data, w, lam, z, t=1, module=module)
    mean_abs = scale * (1.0 if mechanism == "laplace" else (2 / torch.pi) ** 0.5)
    torch.testing.assert_close(result.noise_magnitude, mean_abs, rtol=0.06, atol=0)


def test_modules_with_buffers_are_refused() -> None:
    module = nn.Sequential(nn.Linear(J, 4), nn.BatchNorm1d(4), nn.Linear(4, K))
    message = r"Sequential has buffers \(e\.g\. BatchNorm statistics\).*GroupNorm"
    with pytest.raises(ValueError, match=message):
        local.oracle(_config(), _data(), module)


def test_logistic_oracle_clips_in_l2_for_the_gaussian_mechanism() -> None:
    """The fast path's gradient with mechanism='gaussian': each x_i (h_i - y_i)^T scaled to Frobenius norm
    <= C, by hand; it differs from L1 clipping, and the module path agrees with it."""
    data = _data()
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(data.num_agents, J, K, generator=gen, dtype=torch.float64)
    config = _config(mechanism="gaussian", model="logistic", clip_norm=0.8)
    g, scale = local.oracle(config, data).gradient(z, 1, 1)
    residual = probabilities(data.x, z) - data.y
    expected = torch.zeros_like(z)
    clipped = 0
    for p in range(data.num_agents):
        for i in range(int(data.counts[p])):
            term = torch.outer(data.x[p, i], residual[p, i])
            factor = min(1.0, config.clip_norm / float(term.norm()))
            clipped += factor < 1
            expected[p] += factor * term
    expected = expected / TOTAL + 2 * config.beta / config.num_agents * z
    assert 0 < clipped < sum(COUNTS)
    torch.testing.assert_close(g, expected, rtol=1e-12, atol=1e-14)
    by_factors = clip_factors(data, residual, config.clip_norm, "l2")
    torch.testing.assert_close(
        g, torch.einsum("pij,pi,pik->pjk", data.x, by_factors, residual) / TOTAL + 2 * 0.3 / 4 * z,
        rtol=1e-12, atol=1e-14)
    l1, _ = local.oracle(_config(model="logistic", clip_norm=0.8), data).gradient(z, 1, 1)
    assert not torch.allclose(g, l1)
    assert scale is not None
    torch.testing.assert_close(scale, torch.full((4,), 2 * 0.8 / TOTAL / 0.5, dtype=torch.float64))
    module_oracle = local.oracle(dataclasses.replace(config, model="custom"), data, LogisticRegression(J, K))
    module_g, module_scale = module_oracle.gradient({"weight": z}, 1, 1)
    torch.testing.assert_close(module_g["weight"], g, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(module_scale, scale)


class _TinyConvNet(nn.Module):
    """Conv2d + Linear layers on 6 x 6 single-channel images (J = 36): the factorised path's layer types."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, kernel_size=3, padding=1, stride=2)
        self.fc = nn.Linear(2 * 3 * 3, K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x.reshape(-1, 1, 6, 6))).flatten(1))


def _image_data(seed: int = 3, pixels: int = 36) -> AgentData:
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.rand(c, pixels, generator=gen, dtype=torch.float64) * 2 for c in COUNTS]
    ys = [torch.randint(0, K, (c,), generator=gen) for c in COUNTS]
    return AgentData.from_blocks(xs, ys, num_classes=K, total=TOTAL, agents=range(len(COUNTS)))


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
@pytest.mark.parametrize("net", ["mlp", "conv", "small-cnn", "scatter-cnn"])
def test_factorized_clipping_equals_the_per_sample_autograd_loop(mechanism: str, net: str) -> None:
    """per-sample='factorized' (norms from layer inputs and output gradients) clips exactly as the
    explicit loop does, with some samples clipped and some not, also on a minibatch; the built-in small
    CNN too (strided convolutions, one unpadded, and max-pooling between them), and the scatter CNN, whose
    oracle computes the agents' features once where the loop feeds it the images."""
    data, module = {"mlp": lambda: (_data(), MLP(J, K, hidden=HIDDEN)),
                    "conv": lambda: (_image_data(), _TinyConvNet()),
                    "small-cnn": lambda: (_image_data(pixels=784), SmallCNN(784, K)),
                    "scatter-cnn": lambda: (_image_data(pixels=784), ScatterCNN(784, K))}[net]()
    z = _params(module, data.num_agents)
    # the L1 norms of the scatter CNN's gradients (33k parameters) are larger: a clip that some samples pass
    clip = (3.0 if net != "scatter-cnn" else 10.0) if mechanism == "laplace" else 1.0
    for batch in (0, 4):
        config = _config(mechanism=mechanism, clip_norm=clip, per_sample="factorized", batch_size=batch)
        assert 0.1 < _clipped_fraction(config, module, z, data) < 0.9
        oracle = local.oracle(config, data, module)
        g, _ = oracle.gradient(z, t=2, e=1)
        rows = oracle._batch(2, 1)[0]
        expected = _explicit(config, module, z, data, None if rows is None else rows.tolist())
        for name in expected:
            torch.testing.assert_close(g[name], expected[name], rtol=1e-10, atol=1e-13)


def test_auto_per_sample_gradients_are_factorized_for_the_built_in_networks_only() -> None:
    """per-sample='auto', the default: factorized for build_model's networks (the same sums as the explicit
    loop, above), vmap for any other module, a subclass of a built-in one included."""
    assert RunConfig().per_sample == "auto"

    class Wider(MLP):
        pass

    data, images = _data(), _image_data(pixels=784)
    config = _config(per_sample="auto")
    for module, on, path in ((MLP(J, K, hidden=HIDDEN), data, "factorized"),
                             (SmallCNN(784, K), images, "factorized"),
                             (_TinyConvNet(), _image_data(), "vmap"),
                             (Wider(J, K, hidden=HIDDEN), data, "vmap")):
        assert local.oracle(config, on, module).per_sample == path, type(module).__name__
    module = MLP(J, K, hidden=HIDDEN)
    z = _params(module, data.num_agents)
    auto, _ = local.oracle(config, data, module).gradient(z, t=1, e=1)
    factorized, _ = local.oracle(dataclasses.replace(config, per_sample="factorized"), data, module).gradient(
        z, t=1, e=1)
    assert all(torch.equal(auto[k], factorized[k]) for k in factorized)


def test_a_module_under_the_logistic_fast_paths_name_is_refused() -> None:
    """model='logistic' would skip the network rules (no OutP, clipped sensitivity): say model='custom'."""
    refusal = r"a module \(MLP\) was given but model='logistic'.*set model='custom'"
    with pytest.raises(ValueError, match=refusal):
        local.oracle(_config(model="logistic"), _data(), MLP(J, K, hidden=HIDDEN))


def test_factorized_clipping_refuses_what_it_cannot_factorise() -> None:
    config = _config(per_sample="factorized", model="custom")
    refusal = r"every parameter in a Linear or Conv2d layer; LogisticRegression has \['weight'\]"
    with pytest.raises(ValueError, match=refusal):
        local.oracle(config, _data(), LogisticRegression(J, K))

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(J, J)
            self.out = nn.Linear(J, K)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.fc(self.fc(x)))

    module = Twice()
    with pytest.raises(ValueError, match="layer fc is applied twice in one forward pass"):
        local.oracle(config, _data(), module).gradient(_params(module, len(COUNTS)), t=1, e=1)


# ----- Poisson subsampling (sampling-rate q) -----

def _sampled(**overrides: object) -> RunConfig:
    values = {"sampling_rate": 0.4, "neighbouring": "add-remove", "mechanism": "gaussian", **overrides}
    return _config(**values)


def test_poisson_rows_take_each_sample_with_probability_q_from_the_keyed_stream() -> None:
    """Sample i of agent p is taken iff u_i(seed, p, t, e) < q; an agent alone (a Flower client) takes the
    same; over many steps each sample is taken a fraction q of the time; padding rows never are."""
    data, q = _data(), 0.4
    rows, taken = poisson_rows([0], data, 2, 3, q)
    u = noise.uniform(0, data.agents, 2, 3, noise.STREAM_BATCH, data.x.shape[1])
    for p, count in enumerate(COUNTS):
        expected = [i for i in range(count) if u[p, i] < q]
        assert rows[0, p][taken[0, p]].tolist() == expected
    alone_rows, alone_taken = poisson_rows([0], data.select(slice(2, 3)), 2, 3, q)
    assert alone_rows[0, 0][alone_taken[0, 0]].tolist() == rows[0, 2][taken[0, 2]].tolist()
    both_rows, both_taken = poisson_rows([0, 9], data, 2, 3, q)
    assert torch.equal(both_rows[0][both_taken[0]], rows[0][taken[0]])
    assert not torch.equal(both_rows[1][both_taken[1]], rows[0][taken[0]])  # another seed, another sample
    counts = torch.zeros(data.num_agents, data.x.shape[1], dtype=torch.float64)
    steps = 400
    for t in range(1, steps + 1):
        r, k = poisson_rows([0], data, t, 1, q)
        counts.scatter_add_(1, r[0], k[0].double())
    real = torch.arange(data.x.shape[1]) < data.counts.unsqueeze(1)
    frequency = counts[real] / steps
    assert (frequency - q).abs().max() < 5 * (q * (1 - q) / steps) ** 0.5  # 23 samples, 5 sd each
    assert counts[~real].sum() == 0


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_a_modules_poisson_gradient_is_the_clipped_sum_over_its_sample_over_qi(mechanism: str) -> None:
    data, module = _data(), MLP(J, K, hidden=HIDDEN)
    z = _params(module, data.num_agents)
    config = _sampled(mechanism=mechanism)
    oracle = local.oracle(config, data, module)
    rows, taken, factor = oracle._batch(2, 3)
    assert rows is not None and taken is not None
    assert torch.equal(factor, torch.full_like(factor, 1 / (0.4 * TOTAL)))
    g, scale = oracle.gradient(z, 2, 3)
    chosen = [rows[p][taken[p]].tolist() for p in range(data.num_agents)]
    expected = _explicit(config, module, z, data, chosen, scale=1 / (0.4 * TOTAL))
    for name in g:
        torch.testing.assert_close(g[name], expected[name], rtol=1e-10, atol=1e-13)
    sensitivity = 1.0 / (0.4 * TOTAL)  # C/(qI)
    torch.testing.assert_close(scale, torch.full_like(scale, sensitivity / 0.5), rtol=1e-15, atol=0)


@pytest.mark.parametrize(("net", "per_sample", "batch"), [
    ("mlp", "auto", {}), ("conv", "factorized", {}), ("mlp", "vmap", {}),
    ("mlp", "auto", {"sampling_rate": 1.0, "batch_size": 4, "neighbouring": "replace-one"}),
    ("mlp", "auto", {"sampling_rate": 1.0, "neighbouring": "replace-one"})])
def test_an_agent_computed_alone_reads_its_own_rows_as_its_flower_client_does(
        net: str, per_sample: str, batch: dict[str, object]) -> None:
    """Computed one agent at a time (the factorized path; vmap under vectorize=False), each agent's gradient
    is, bit for bit, the one its ClientApp computes holding only its own samples: the rows padded to the
    largest agent's sample (Poisson), batch (minibatch) or data (full batch) are never read, so they cost
    nothing and cannot change the rounding. Unequal agents (2 to 9 samples), so the padding is real."""
    data, module = (_data(), MLP(J, K, hidden=HIDDEN)) if net == "mlp" else (_image_data(), _TinyConvNet())
    z = _params(module, data.num_agents)
    config = _sampled(per_sample=per_sample, **batch)
    batched, scale = local.oracle(config, data, module, vectorize=False).gradient(z, 2, 3)
    for p in range(data.num_agents):
        own = AgentData.from_blocks([data.x[p, :COUNTS[p]]], [data.y[p, :COUNTS[p]].argmax(-1)],
                                    num_classes=K, total=TOTAL, agents=[p])
        alone, alone_scale = local.oracle(config, own, module).gradient({k: v[p:p + 1] for k, v in z.items()},
                                                                       2, 3)
        assert torch.equal(alone_scale, scale[p:p + 1])
        for name in z:
            assert torch.equal(alone[name][0], batched[name][p]), (p, name)


def test_the_logistic_poisson_gradient_is_the_clipped_sum_over_its_sample_over_qi() -> None:
    """The gathered batch against a loop over the taken samples (outer products, clipped to L2 norm C), for
    one run and for two runs batched, each with its own seed's sample."""
    data, q = _data(), 0.4
    config = _sampled(model="logistic", clip_norm=0.5)
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(2, data.num_agents, J, K, generator=gen, dtype=torch.float64)

    def explicit(run: int, seed: int) -> torch.Tensor:
        rows, taken = poisson_rows([seed], data, 2, 1, q)
        out = 2 * config.beta / config.num_agents * z[run].clone()
        for p in range(data.num_agents):
            for i in rows[0, p][taken[0, p]].tolist():
                x, y = data.x[p, i], data.y[p, i]
                term = torch.outer(x, torch.softmax(x @ z[run, p], dim=0) - y)
                out[p] += min(1.0, 0.5 / float(term.norm())) * term / (q * TOTAL)
        return out

    single = local.oracle(dataclasses.replace(config, seed=4), data)
    g, scale = single.gradient(z[0], 2, 1)
    torch.testing.assert_close(g, explicit(0, 4), rtol=1e-12, atol=1e-14)
    assert scale.shape == (data.num_agents,)
    assert torch.allclose(scale, torch.tensor(0.5 / (q * TOTAL) / 0.5, dtype=torch.float64))
    batched = local.oracle(config, data, seeds=[4, 8])
    both, scales = batched.gradient(z, 2, 1)
    torch.testing.assert_close(both[0], explicit(0, 4), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(both[1], explicit(1, 8), rtol=1e-12, atol=1e-14)
    assert scales.shape == (2, data.num_agents)
    alone, _ = local.oracle(dataclasses.replace(config, seed=4), data.select(slice(1, 2))).gradient(
        z[0, 1:2], 2, 1)
    torch.testing.assert_close(alone[0], g[1], rtol=1e-12, atol=1e-15)  # a Flower client's own step
