"""trainbench: measured, budgeted PyTorch training steps as pytest benchmarks."""

__version__ = "0.1.0"
