"""rlx-kitc: a test-only backend on the device kit (see plugin.py)."""
