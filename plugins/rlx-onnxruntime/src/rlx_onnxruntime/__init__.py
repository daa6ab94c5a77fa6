"""RLX backend delegating programs to ONNX Runtime's execution providers."""

__version__ = "0.1.0"
