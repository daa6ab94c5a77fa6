"""A NumPy reference backend (as plugin source) and one-line planted bugs for the conformance tests."""
