"""The run floor, shared by every family: run folders a person can open (:mod:`~dpadmm.runs.results`)
and atomic checkpoints (:mod:`~dpadmm.runs.checkpoint`)."""
