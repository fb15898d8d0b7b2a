"""dpadmm: differentially private federated learning via ADMM, on Flower.

The core is pure PyTorch and imports nothing from Flower. It is a house of shared floors and
one sub-package per family of algorithms:

- floors, which know no family: :mod:`dpadmm.privacy` (keyed noise streams, the ledger of DP
  events), :mod:`dpadmm.models` (models, per-sample clipped gradients), :mod:`dpadmm.data`
  (readers and partitioners), :mod:`dpadmm.runs` (run folders, metrics, checkpoints),
  :mod:`dpadmm.native` (fused C kernels);
- families, each with its configuration, its equations (one function each, citing paper and
  equation) and its batched engine: :mod:`dpadmm.iadmm` (Ryu & Kim's DP-IADMM, papers 003
  and 000);
- entry points: :mod:`dpadmm.cli` (``dpadmm``), :mod:`dpadmm.deploy`, :mod:`dpadmm.wire`
  (Flower message layout).

Every equation is one function of tensors with a leading agent dimension (size 1 for one
Flower client, P for the batched engine), so the Flower app and the engine run the same
mathematics.
"""

__version__ = "0.2.0"
