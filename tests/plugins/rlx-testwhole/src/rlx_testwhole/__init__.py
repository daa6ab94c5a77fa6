"""Test-only backend proving the dispatch contract serves whole-program code generators."""

__version__ = "0.1.0"
