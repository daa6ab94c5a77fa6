"""RLX backend for Intel's oneAPI stack through the OpenVINO runtime (oneDNN on the CPU)."""

__version__ = "0.1.0"
