"""The DP-IADMM family: Ryu & Kim's inexact ADMM with objective perturbation (paper 003, with 000).

Its rooms: :mod:`~dpadmm.iadmm.config` (every run-config key), :mod:`~dpadmm.iadmm.schedules`
(rho^t, eta^t, the trust radius, OutP's constants), :mod:`~dpadmm.iadmm.local` and
:mod:`~dpadmm.iadmm.consensus` (the agents' and the server's equations),
:mod:`~dpadmm.iadmm.privacy` (its releases for the shared ledger), :mod:`~dpadmm.iadmm.engine`
(all agents batched), :mod:`~dpadmm.iadmm.federation` (its data per agent),
:mod:`~dpadmm.iadmm.audit` (the attacks of ``dpadmm audit``), and the papers' grid
(:mod:`~dpadmm.iadmm.reproduce`, :mod:`~dpadmm.iadmm.figures`). On the Flower side:
``strategies/dpiadmm.py`` and ``clients/dpiadmm.py``.
"""
