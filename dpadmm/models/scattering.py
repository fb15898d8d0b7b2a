"""A fixed front end for 28 x 28 images: the scattering transform, the features Tramer and Boneh train on.

Bruna and Mallat, "Invariant Scattering Convolution Networks" (IEEE TPAMI 35(8), 2013): a
scattering network is a cascade of wavelet convolutions and moduli with no learnt weight,

    S0 x = x * phi_J,   S1 x = |x * psi_{j1,l1}| * phi_J,   S2 x = ||x * psi_{j1,l1}| * psi_{j2,l2}| * phi_J
    (j1 < j2 < J),

with Morlet wavelets psi_{j,l} at scale 2^j and angle l pi / L, and phi_J a Gaussian low-pass of scale
2^J, sampled every 2^J pixels. For J = 2 and L = 8 that is 1 + J L + L^2 J (J - 1) / 2 = 81 channels of
7 x 7 on a 28 x 28 image: 3,969 features. Tramer and Boneh ("Differentially Private Learning Needs Better
Features (or Much More Data)", ICLR 2021) train DP-SGD on them, normalised per sample in 27 groups
of 3 channels (GroupNorm), and are ahead of end-to-end CNNs on MNIST, Fashion-MNIST and CIFAR-10 at every
epsilon up to 3 that they report.

Why it costs no privacy: the transform and the normalisation read one image at a time and no statistic of
the data set, so a neighbouring data set maps to a neighbouring data set; every statement about the
trained parameters holds unchanged, and a device computes the features of its own images itself.

The computation is the standard fast one (Bruna and Mallat's): convolutions as products of
spectra; x * psi_{j1} is sampled every 2^{j1} pixels (exactly: its spectrum is periodised before the
inverse transform) and the modulus, the next wavelet and the low-pass act at that resolution, which aliases
a little of the modulus' high frequencies (a few per cent of a channel's norm against the full-resolution
definition; tests/test_scattering.py measures it). The image is reflected 2^J pixels into a border first,
as the periodic convolutions would otherwise wrap one edge onto the other.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

SIDE = 28  # the images' side: MNIST's and FEMNIST's
SCALES = 2  # J
ANGLES = 8  # L
CHANNELS = 1 + SCALES * ANGLES + ANGLES**2 * SCALES * (SCALES - 1) // 2  # 81
OUT_SIDE = SIDE // 2**SCALES  # 7
NUM_FEATURES = CHANNELS * OUT_SIDE**2  # 3969
GROUPS = 27  # Tramer and Boneh's GroupNorm: 27 groups of 3 channels
NORM_EPS = 1e-5  # GroupNorm's
_PAD = 2**SCALES
_GRID = SIDE + 2 * _PAD  # 36: the padded image, divisible by 2^J
_CHUNK = 64  # images per batch of spectra: the [chunk, L, L, 36, 36] products stay in cache


def _gabor(sigma: float, angle: float, xi: float, slant: float) -> torch.Tensor:
    """exp(-u' R diag(1, slant^2) R' u / (2 sigma^2) + i xi <u, e_angle>) / (2 pi sigma^2 / slant) on the
    periodic grid (the 3 x 3 nearest periods summed: the envelope is below 1e-30 beyond), complex128."""
    r = torch.arange(_GRID, dtype=torch.float64)
    u, v = torch.meshgrid(r, r, indexing="ij")
    c, s = math.cos(angle), math.sin(angle)
    out = torch.zeros(_GRID, _GRID, dtype=torch.complex128)
    for a in (-_GRID, 0, _GRID):
        for b in (-_GRID, 0, _GRID):
            along, across = c * (u + a) + s * (v + b), -s * (u + a) + c * (v + b)
            out += torch.exp(-(along**2 + slant**2 * across**2) / (2 * sigma**2) + 1j * xi * along)
    return out / (2 * math.pi * sigma**2 / slant)


@lru_cache(maxsize=4)
def filters(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(psi, phi): the spectra of the Morlet wavelets psi_{j,l} ([J, L, 36, 36]) and of the low-pass phi_J
    ([36, 36]), real (each filter is conjugate-symmetric in space).

    A Morlet wavelet is a Gabor filter minus the multiple of its envelope that makes its mean zero, with the
    constants of the usual filter bank (Kymatio's: Andreux et al., "Kymatio: Scattering Transforms in
    Python", JMLR 21(60), 2020, whose features Tramer and Boneh used): sigma = 0.8 2^j, xi = 3 pi / (4 2^j),
    an envelope 1 / slant = L / 4 times longer along the wave's crests than across them; phi_J is the
    Gaussian of sigma = 0.8 2^(J-1).
    Built once per dtype and held outside any module: they are constants, not buffers (a buffer would read
    as state that mixes samples to the per-sample clipping)."""
    psi = []
    for j in range(SCALES):
        for angle in range(ANGLES):
            sigma, theta, xi, slant = 0.8 * 2**j, angle * math.pi / ANGLES, 0.75 * math.pi / 2**j, 4 / ANGLES
            wave, envelope = _gabor(sigma, theta, xi, slant), _gabor(sigma, theta, 0.0, slant)
            psi.append(torch.fft.fft2(wave - wave.sum() / envelope.sum() * envelope).real)
    phi = torch.fft.fft2(_gabor(0.8 * 2 ** (SCALES - 1), 0.0, 0.0, 1.0)).real
    return torch.stack(psi).reshape(SCALES, ANGLES, _GRID, _GRID).to(dtype), phi.to(dtype)


def _periodised(spectrum: torch.Tensor, k: int) -> torch.Tensor:
    """The spectrum, at 1/k of its resolution, of the signal sampled every k pixels: the mean of its k x k
    blocks (sums of slices: a strided mean over complex blocks is several times slower)."""
    if k == 1:
        return spectrum
    n = spectrum.shape[-1] // k
    out = spectrum[..., :n, :n].clone()
    for a in range(k):
        for b in range(k):
            if a or b:
                out += spectrum[..., a * n:(a + 1) * n, b * n:(b + 1) * n]
    return out / (k * k)


def _at(spectrum: torch.Tensor, level: int) -> torch.Tensor:
    """A filter's spectrum for a signal sampled every 2^level pixels: periodised, times 4^level, so that the
    convolution at that resolution approximates the full-resolution one at the samples it keeps."""
    return _periodised(spectrum, 2**level) * 4**level


def scattering(images: torch.Tensor) -> torch.Tensor:
    """S x for ``images`` [N, 784] (28 x 28, row-major): [N, 81, 7, 7] in ``images``' dtype.

    Channels in the order S0; S1 by (j1, l1); S2 by (j1, l1, j2, l2). Computed in float32 (float64 input
    included: the features feed a noisy training whose noise dwarfs the difference), 64 images at a time."""
    if images.dim() != 2 or images.shape[1] != SIDE * SIDE:
        raise ValueError(f"the scattering front end takes [N, {SIDE * SIDE}] images ({SIDE} x {SIDE}); got "
                         f"{tuple(images.shape)}")
    psi, phi = filters(torch.float32)
    psi, phi = psi.to(images.device), phi.to(images.device)
    parts = [_scattered(chunk.to(torch.float32), psi, phi) for chunk in images.split(_CHUNK)]
    out = torch.cat(parts) if parts else images.new_zeros(0, CHANNELS, OUT_SIDE, OUT_SIDE)
    return out.to(images.dtype)


def _scattered(images: torch.Tensor, psi: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    n = images.shape[0]
    padded = torch.nn.functional.pad(images.reshape(n, 1, SIDE, SIDE), (_PAD,) * 4, mode="reflect")[:, 0]

    def low(spectrum: torch.Tensor, level: int) -> torch.Tensor:
        """(signal * phi_J) every 2^J pixels from the signal's spectrum at ``level``, the border cut."""
        out = torch.fft.ifft2(_periodised(spectrum * _at(phi, level), 2 ** (SCALES - level))).real
        return out[..., 1:-1, 1:-1]

    x = torch.fft.fft2(padded)
    first, second = [low(x, 0)[:, None]], []
    for j1 in range(SCALES):
        u1 = torch.fft.ifft2(_periodised(x[:, None] * psi[j1], 2**j1)).abs()  # [n, L, 36 / 2^j1, ...]
        f1 = torch.fft.fft2(u1)
        first.append(low(f1, j1))
        for j2 in range(j1 + 1, SCALES):
            u2 = torch.fft.ifft2(_periodised(f1[:, :, None] * _at(psi[j2], j1), 2 ** (j2 - j1))).abs()
            second.append(low(torch.fft.fft2(u2), j2).reshape(n, -1, OUT_SIDE, OUT_SIDE))
    return torch.cat(first + second, dim=1)


def features(images: torch.Tensor) -> torch.Tensor:
    """The front end of the scattering models: S x of ``images`` [N, 784], normalised per image in 27 groups
    of 3 channels to mean 0 and variance 1 (Tramer and Boneh's GroupNorm without affine parameters), flat:
    [N, 3969]."""
    s = scattering(images)
    return torch.nn.functional.group_norm(s, GROUPS, eps=NORM_EPS).reshape(s.shape[0], NUM_FEATURES)
