"""rlx-fpga: INT8 graphs as synthesizable Verilog, verified bit-exact in simulation (Icarus Verilog)."""

__version__ = "0.1.0"
