"""The privacy floor, shared by every family: keyed noise streams (:mod:`~dpadmm.privacy.noise`,
with the constants of its transforms in :mod:`~dpadmm.privacy.transforms`) and the ledger that
composes each family's DP events (:mod:`~dpadmm.privacy.ledger`)."""
