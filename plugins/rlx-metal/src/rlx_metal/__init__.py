"""rlx-metal: Metal Shading Language kernels for RLX (Apple GPU via metalcompute, else MSL on host)."""

__version__ = "0.1.0"
