"""The constants of the noise transforms, one definition read by both implementations of them.

:mod:`dpadmm.privacy.noise` turns Philox bits into uniform, Laplace and Gaussian values with
float64 operations written out (a logarithm, a square root, sine and cosine by fixed
polynomials) so that every device computes the same bits; :mod:`dpadmm.native` compiles the
same transforms into C. Both read these numbers, so the two cannot drift apart (and the C
build imports no module that calls it).
"""

import math

# ln 2 = LN2_HI + LN2_LO with LN2_HI of 42 significant bits, so e * LN2_HI is exact.
LN2_HI = float.fromhex("0x1.62e42fefa3800p-1")
LN2_LO = float.fromhex("0x1.ef35793c76730p-45")
# log m = 2 atanh f = 2f + f s (2/3 + 2/5 s + ... + 2/19 s**8), f = (m-1)/(m+1), s = f*f <= 0.0295.
LOG_COEFFS = tuple(2.0 / (2 * j + 1) for j in range(1, 10))
# |x| <= pi/4, z = x*x: sin x = x + x z (-1/3! + z/5! - ... + z**7/17!),
#                       cos x = 1 + z (-1/2! + z/4! - ... + z**7/16!).
SIN_COEFFS = tuple((-1) ** j / math.factorial(2 * j + 1) for j in range(1, 9))
COS_COEFFS = tuple((-1) ** j / math.factorial(2 * j) for j in range(1, 9))
HALF_PI = math.pi / 2
SQRT_MAGIC = 1023 << 51  # (bits(x) >> 1) + this halves the exponent: sqrt(x) to within +6.1%
