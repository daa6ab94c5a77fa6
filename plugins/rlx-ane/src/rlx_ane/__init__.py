"""RLX exporter for Apple's Core ML (the Neural Engine): ML Programs (MIL) built from the LIR."""

__version__ = "0.1.0"
