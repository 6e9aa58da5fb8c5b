"""nandoctor: find the first non-finite value in a PyTorch training run and say why."""

__version__ = "0.1.0"
