"""Hu et al.'s ADMM sharing over distributed features (paper 001): vertical federated learning, where the
parties hold the same samples and different features, and each sends one number per sample per round."""
