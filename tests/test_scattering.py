"""dpadmm.models.scattering: the scattering transform of 28 x 28 images, against its definition."""

from __future__ import annotations

import pytest
import torch

from dpadmm.data import load_dataset
from dpadmm.models import scattering


def _definition(images: torch.Tensor) -> torch.Tensor:
    """S0, S1 and S2 of Bruna and Mallat's definition at full resolution: every convolution on the whole
    36 x 36 grid, the modulus taken there, only the last low-pass sampled every 4 pixels (float64)."""
    psi, phi = scattering.filters(torch.float64)
    n = images.shape[0]
    padded = torch.nn.functional.pad(images.reshape(n, 1, 28, 28), (4, 4, 4, 4), mode="reflect")[:, 0]

    def conv(signal: torch.Tensor, spectrum: torch.Tensor) -> torch.Tensor:
        return torch.fft.ifft2(torch.fft.fft2(signal) * spectrum)

    def low(signal: torch.Tensor) -> torch.Tensor:
        return conv(signal, phi).real[..., ::4, ::4][..., 1:-1, 1:-1]

    u1 = conv(padded[:, None, None], psi).abs()  # [n, J, L, 36, 36]
    u2 = conv(u1[:, 0, :, None], psi[1]).abs()  # [n, L (j1 = 0), L (j2 = 1), 36, 36]
    return torch.cat([low(padded)[:, None], low(u1).reshape(n, 16, 7, 7), low(u2).reshape(n, 64, 7, 7)], 1)


def test_the_filters_are_wavelets_and_a_low_pass() -> None:
    """Every wavelet has mean zero (its spectrum vanishes at frequency 0), the low-pass has mean one, and
    their spectra are real (the filters are conjugate-symmetric)."""
    psi, phi = scattering.filters(torch.float64)
    assert psi.shape == (2, 8, 36, 36) and phi.shape == (36, 36)
    assert psi[..., 0, 0].abs().max() < 1e-12 and abs(phi[0, 0] - 1) < 1e-12
    assert psi.dtype == phi.dtype == torch.float64
    wave = scattering._gabor(1.6, 3 * torch.pi / 8, 3 * torch.pi / 8, 0.5)  # psi_{1,3}'s Gabor part
    assert torch.fft.fft2(wave).imag.abs().max() < 1e-12  # conjugate-symmetric: a real spectrum


def test_the_fast_transform_is_the_definition_up_to_its_aliasing() -> None:
    """On real digits the fast transform (each modulus at its wavelet's resolution) is within 5% of the
    full-resolution definition in every channel, and within 1% for the median channel."""
    images = load_dataset("default").x_test[:64]
    fast, exact = scattering.scattering(images), _definition(images)
    assert fast.shape == (64, 81, 7, 7) and fast.dtype == torch.float64
    error = (fast - exact).norm(dim=(2, 3)) / exact.norm(dim=(2, 3))
    assert error.max() < 0.05 and error.median() < 0.01, (error.max(), error.median())


def test_features_are_per_image_and_normalised_in_groups() -> None:
    """Each image's features depend on it alone (the same alone as in a batch: no statistic across images,
    so no privacy cost), and each of the 27 groups of 3 channels has mean 0 and variance at most 1."""
    images = load_dataset("default").x_test[:80]
    batch = scattering.features(images)
    assert batch.shape == (80, 3969)
    torch.testing.assert_close(scattering.features(images[5:6]), batch[5:6], rtol=0, atol=1e-6)
    groups = batch.reshape(80, 27, -1)
    assert groups.mean(dim=2).abs().max() < 1e-6
    assert groups.var(dim=2, unbiased=False).max() <= 1.0


def test_a_shift_of_one_pixel_moves_the_features_less_than_the_pixels() -> None:
    """The point of the front end: stable to small translations (the low-pass averages over 2^J pixels).
    Measured against the distance to the next test digit (another class), a one-pixel shift moves the
    features at most 0.3 of it and less than 0.7 as far as it moves the pixels, on each of five digits."""
    data = load_dataset("default")
    for i in range(5):
        image, other = data.x_test[i], data.x_test[i + 1]
        pixels = torch.stack([image, torch.roll(image.reshape(28, 28), 1, dims=1).reshape(784), other])
        f = scattering.features(pixels)
        moved, moved_pixels = [(v[0] - v[1]).norm() / (v[0] - v[2]).norm() for v in (f, pixels)]
        assert moved < 0.3 and moved < 0.7 * moved_pixels, (i, moved, moved_pixels)


def test_other_shapes_are_refused_naming_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"takes \[N, 784\] images \(28 x 28\); got \(3, 100\)"):
        scattering.scattering(torch.zeros(3, 100))
