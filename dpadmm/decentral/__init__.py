"""Xiao, Ye & Devadas's decentralised optimisation with local differential privacy (paper 004): agents on a
communication graph exchange noisy iterates with their neighbours, trust nobody, and randomise their own
aggregation weights so that each release's privacy loss shrinks by a constant."""
