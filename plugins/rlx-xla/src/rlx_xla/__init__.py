"""rlx-xla: RLX programs lowered to XLA through JAX and run with PJRT."""

__version__ = "0.1.0"
