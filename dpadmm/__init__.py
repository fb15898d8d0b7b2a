"""dpadmm: differentially private federated learning via inexact ADMM (Ryu & Kim).

The core is pure PyTorch and imports nothing from Flower: every equation is one function
of tensors with a leading agent dimension (size 1 for one Flower client, P for the batched
engine), so the Flower app and the engine run the same mathematics.
"""

from dpadmm.config import RunConfig

__all__ = ["RunConfig"]
__version__ = "0.1.0"
