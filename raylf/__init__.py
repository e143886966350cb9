"""raylf: personalized federated learning experiments on Ray."""

__version__ = "0.1.0"
