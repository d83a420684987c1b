"""Activation functions and their derivatives as Triton device functions, computed in float32.

Codes: 0 identity, 1 GELU (erf), 2 GELU (tanh), 3 SiLU, 4 ReLU.
"""

import triton
import triton.language as tl

ACTIVATION_CODES = {"identity": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3, "relu": 4}


@triton.jit
def activation_and_derivative(z, ACT: tl.constexpr):
    """(act(z), act'(z)) element-wise for a float32 block z."""
    if ACT == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
        return z * cdf, cdf + z * tl.exp(-0.5 * z * z) * 0.3989422804014327
    elif ACT == 2:
        inner = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
        derivative = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * z * z)
        return 0.5 * z * (1.0 + t), derivative
    elif ACT == 3:
        s = tl.sigmoid(z)
        return z * s, s * (1.0 + z * (1.0 - s))
    elif ACT == 4:
        return tl.maximum(z, 0.0), tl.where(z > 0.0, 1.0, 0.0)
    else:
        return z, tl.full(z.shape, 1.0, tl.float32)
