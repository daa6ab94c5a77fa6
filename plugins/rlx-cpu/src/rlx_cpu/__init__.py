"""rlx-cpu: the RLX CPU backend (NumPy + BLAS), one kernel call per node over a planned arena."""

__version__ = "0.1.0"
