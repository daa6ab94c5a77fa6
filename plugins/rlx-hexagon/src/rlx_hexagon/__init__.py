"""rlx-hexagon: RLX graphs as freestanding C shaped for Qualcomm Hexagon HVX (clang --target=hexagon);
code generated and compiled here. No HVX code executes (no HVX device or simulator in the
registries); the same C built for the scalar V67 core runs under Debian's qemu-hexagon in the tests."""

__version__ = "0.1.0"
