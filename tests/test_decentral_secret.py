"""dpadmm.decentral.secret: Algorithm 3 of 004 (additive secret sharing of the sum, Theorem 2.1): exact
reconstruction, the fixed-point round trip, uniform shares, and the view of N - 2 colluders independent
of the honest agents' values beyond their sum (by enumerating every draw in a small field)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpadmm.decentral import secret
from dpadmm.privacy import secure


def _shares(values: np.ndarray, codec: secret.FixedPoint, rng: np.random.Generator) -> np.ndarray:
    return np.stack([secret.split(codec.encode(values[i]), i, codec.agents, codec.modulus, rng)
                     for i in range(codec.agents)])


def test_the_broadcast_partial_sums_add_up_to_the_encoded_sum() -> None:
    """sum_j s_hat_j = sum_i encoded_i (mod p), checked with Python integers (no int64 on the check side)."""
    codec = secret.FixedPoint(agents=5)
    rng = np.random.default_rng(0)
    values = rng.normal(scale=1e3, size=(5, 7))
    shares = _shares(values, codec, rng)
    assert shares.shape == (5, 5, 7) and shares.dtype == np.int64
    for i in range(5):  # each agent's shares add up to its encoded vector
        assert [sum(int(s) for s in shares[i, :, c]) % codec.modulus for c in range(7)] == \
            codec.encode(values[i]).tolist()
    partials = secret.partial_sums(shares, codec.modulus)
    total = secret.reconstruct(partials, codec.modulus)
    expected = [sum(int(codec.encode(values[i])[c]) for i in range(5)) % codec.modulus for c in range(7)]
    assert total.tolist() == expected
    assert [sum(int(p) for p in partials[:, c]) % codec.modulus for c in range(7)] == expected


def test_round_trip_within_the_fixed_point_resolution() -> None:
    codec = secret.FixedPoint(agents=4, scale=2**20)
    rng = np.random.default_rng(1)
    values = rng.uniform(-5, 5, size=(4, 1000))
    assert np.abs(codec.decode(codec.encode(values)) - values).max() <= 0.5 / codec.scale
    got = secret.secure_sum(values, codec, rng)
    assert np.abs(got - values.sum(axis=0)).max() <= 4 * 0.5 / codec.scale
    # exactly representable values come back exactly, negative ones too
    exact = np.array([[-1.5, 0.25, 3.0], [2.0, -0.125, 0.0], [-0.5, -3.0, 1.0], [1.0, 1.0, -7.75]])
    assert np.array_equal(secret.secure_sum(exact, codec, rng), exact.sum(axis=0))


def test_values_at_the_bound_sum_without_overflow_and_one_step_beyond_is_refused() -> None:
    """p = 2^62, the largest allowed: residues near p add up below 2^63 (int64), and N values at +-bound (the
    limit rounded down to a float) reconstruct to the exact residue, checked with Python integers."""
    codec = secret.FixedPoint(agents=3, scale=2**10, modulus=2**62)
    assert codec.limit == (2**62 - 1) // 2 // 3
    top = int(codec.bound * codec.scale)
    assert top <= codec.limit and codec.limit - top < 128  # 2^59 < limit < 2^60: floats 128 apart
    for sign in (1, -1):
        values = np.full((3, 2), sign * codec.bound)
        assert int(codec.encode(values[0])[0]) == (sign * top) % codec.modulus
        shares = _shares(values, codec, np.random.default_rng(2))
        total = secret.reconstruct(secret.partial_sums(shares, codec.modulus), codec.modulus)
        assert int(total[0]) == (sign * 3 * top) % codec.modulus
        assert codec.decode(total)[0] == pytest.approx(sign * 3.0 * top / codec.scale, rel=1e-15)
    near = np.full((3, 3, 1), 2**62 - 1, dtype=np.int64)  # every share p - 1: the sums pass 2^62 each step
    assert int(secret.partial_sums(near, 2**62)[0, 0]) == (3 * (2**62 - 1)) % 2**62
    small = secret.FixedPoint(agents=3, scale=4, modulus=1001)  # limit 500 // 3 = 166: |value| <= 41.5
    assert small.bound == 41.5
    assert small.decode(small.encode([41.5, -41.5])).tolist() == [41.5, -41.5]
    with pytest.raises(ValueError, match=r"value 41.75 is not allowed; .* \|value\| <= 41.5"):
        small.encode([1.0, 41.75])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"agents": 2}, "agents=2 is not allowed; .* N >= 3"),
    ({"agents": 3, "scale": 0}, "scale=0"),
    ({"agents": 3, "scale": 0.5}, "scale=0.5"),
    ({"agents": 3, "modulus": 2**62 + 1}, "modulus=4611686018427387905 is not allowed; .* <= 2\\*\\*62"),
    ({"agents": 3, "modulus": 6}, "modulus=6 is not allowed"),
])
def test_bad_encodings_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        secret.FixedPoint(**kwargs)


def test_bad_shares_are_refused() -> None:
    codec = secret.FixedPoint(agents=3)
    encoded = codec.encode([1.0, 2.0])
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="value nan is not allowed"):
        codec.encode([np.nan])
    with pytest.raises(ValueError, match="rng of type RandomState is not allowed"):
        secret.split(encoded, 0, 3, codec.modulus, np.random.RandomState(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="owner=3 is not allowed"):
        secret.split(encoded, 3, 3, codec.modulus, rng)
    with pytest.raises(ValueError, match="agents=2 is not allowed"):
        secret.split(encoded, 0, 2, codec.modulus, rng)
    with pytest.raises(ValueError, match="dtype float64 are not allowed"):
        secret.split(np.array([1.0]), 0, 3, codec.modulus, rng)
    with pytest.raises(ValueError, match="residues outside"):
        secret.reconstruct(np.array([[codec.modulus]], dtype=np.int64), codec.modulus)
    with pytest.raises(ValueError, match="one row per agent"):
        secret.secure_sum(np.zeros((4, 2)), codec, rng)


def test_a_deployment_draws_its_shares_from_a_chacha20_stream() -> None:
    """The deployed form: shares from a ChaCha20 stream under a fresh OS key, the same sum; a stream, not a
    numpy generator, is what the advice names; anything else is refused with both."""
    codec = secret.FixedPoint(agents=4)
    values = np.random.default_rng(1).normal(scale=10.0, size=(4, 5))
    total = secret.secure_sum(values, codec, secure.Stream(secure.new_key()))
    np.testing.assert_allclose(total, values.sum(axis=0), atol=4 / codec.scale)
    encoded = np.full(64_000, codec.encode(1.5)[()], dtype=np.int64)
    for row in secret.split(encoded, 0, 3, codec.modulus, secure.Stream(secure.new_key())):
        counts = np.bincount((row // (codec.modulus // 64 + 1)).astype(np.int64), minlength=64)
        assert stats.chisquare(counts).pvalue > 1e-3
    with pytest.raises(ValueError, match="numpy.random.Generator .* or a dpadmm.privacy.secure.Stream"):
        secret.split(encoded, 0, 3, codec.modulus, 7)  # type: ignore[arg-type]


def test_every_share_is_uniform_on_z_p() -> None:
    """Chi-square over 64 equal bins of Z_p (p = 2^61 - 1) for each of the N shares of one fixed value, the
    kept residual included, and exact counts in a small field."""
    codec = secret.FixedPoint(agents=3)
    encoded = np.full(64_000, codec.encode(123.456)[()], dtype=np.int64)
    shares = secret.split(encoded, 1, 3, codec.modulus, np.random.default_rng(7))
    for row in shares:
        counts = np.bincount((row // (codec.modulus // 64 + 1)).astype(np.int64), minlength=64)
        assert counts.size == 64
        assert stats.chisquare(counts).pvalue > 1e-3
    # in Z_7 the residual of a fixed value is uniform too
    small = secret.split(np.full(70_000, 3, dtype=np.int64), 0, 3, 7, np.random.default_rng(8))
    for row in small:
        assert stats.chisquare(np.bincount(row, minlength=7)).pvalue > 1e-3


def test_what_an_agent_sends_does_not_depend_on_its_value() -> None:
    """Same seed, two different secrets: the N - 1 shares agent 2 sends are identical (only its kept residual
    differs), so no coalition without it sees its value in them."""
    codec = secret.FixedPoint(agents=4)
    one = secret.split(codec.encode([1.0, -2.0]), 2, 4, codec.modulus, np.random.default_rng(3))
    two = secret.split(codec.encode([-50.0, 9.5]), 2, 4, codec.modulus, np.random.default_rng(3))
    sent = [0, 1, 3]
    assert np.array_equal(one[sent], two[sent]) and not np.array_equal(one[2], two[2])


def _views(secrets: list[int], modulus: int, coalition: list[int]) -> dict[int, int]:
    """The coalition's view over EVERY draw of every agent's N - 1 uniform shares (each equally likely):
    the shares its members made and received, and all N broadcasts; as a histogram of views."""
    agents = len(secrets)
    digits = agents * (agents - 1)
    every = np.unravel_index(np.arange(modulus**digits), (modulus,) * digits)  # every draw, once each
    draws = np.stack(every).astype(np.int64).reshape(agents, agents - 1, -1)  # agent i's, for each j != i
    shares = []
    for i in range(agents):
        rows = np.zeros((agents, draws.shape[-1]), dtype=np.int64)
        rows[[j for j in range(agents) if j != i]] = draws[i]
        shares.append(secret.residual(rows, np.full(draws.shape[-1], secrets[i], dtype=np.int64), i, modulus))
    everything = np.stack(shares)  # [N (from), N (to), draws]
    partials = secret.partial_sums(everything, modulus)
    seen = [everything[c] for c in coalition] + [everything[:, c] for c in coalition] + [partials]
    view = np.concatenate(seen)  # [values seen, draws]: one number per view, its digits base p
    keys = (view * modulus ** np.arange(view.shape[0], dtype=np.int64)[:, None]).sum(axis=0)
    assert view.shape[0] * np.log2(modulus) < 62  # the keys fit int64
    return dict(zip(*(a.tolist() for a in np.unique(keys, return_counts=True)), strict=True))


@pytest.mark.parametrize(("modulus", "coalition", "world", "other"), [
    (7, [2], [3, 5, 1], [6, 2, 1]),  # N = 3, one colluder: the honest pair (3, 5) vs (6, 2), same sum mod 7
    (3, [2, 3], [0, 1, 2, 2], [2, 2, 2, 2]),  # N = 4, two colluders: (0, 1) vs (2, 2), same sum mod 3
])
def test_n_minus_2_colluders_see_the_same_distribution_for_two_different_secrets(
        modulus: int, coalition: list[int], world: list[int], other: list[int]) -> None:
    """Theorem 2.1, exactly: the whole joint view of N - 2 colluders (their own draws, every share they
    receive, every broadcast) has the same distribution whatever the honest agents hold, given the sum
    (which the protocol reveals by design). With N - 1 colluders it does not: the last value is exposed."""
    assert sum(world) % modulus == sum(other) % modulus and world != other
    assert all(world[c] == other[c] for c in coalition)
    assert _views(world, modulus, coalition) == _views(other, modulus, coalition)
    honest = [i for i in range(len(world)) if i not in coalition]
    larger = coalition + honest[1:]
    assert _views(world, modulus, larger) != _views(other, modulus, larger)
