"""rlx-mlx: RLX programs run through Apple's MLX (``mlx.core``)."""

__version__ = "0.1.0"
