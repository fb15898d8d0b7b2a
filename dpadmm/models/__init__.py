"""The model floor, shared by every family: the papers' multiclass logistic regression on batched
agents (:mod:`~dpadmm.models.logistic`), any ``nn.Module`` (:mod:`~dpadmm.models.modules`) and the
oracles that give a family (clipped) gradients and the scale of their noise
(:mod:`~dpadmm.models.oracles`)."""
