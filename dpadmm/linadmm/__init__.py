"""The DP-ADMM / DP-AccADMM family: Xu et al.'s differentially private linearised ADMM (paper 002).

Its rooms: :mod:`~dpadmm.linadmm.config` (every run-config key), :mod:`~dpadmm.linadmm.updates`
(the y-, x- and dual steps, the theta recursion, eq. (8)), :mod:`~dpadmm.linadmm.problem` (the
graph-guided fused lasso of eq. (11) and its graph), :mod:`~dpadmm.linadmm.privacy` (Theorem 1 and
the ledger), :mod:`~dpadmm.linadmm.engine` (seeds batched) and :mod:`~dpadmm.linadmm.audit` (the attack
on one noisy gradient). The paper is centralised: one data
holder, full-batch gradients, Gaussian noise on each.
"""
