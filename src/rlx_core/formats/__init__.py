"""File formats RLX reads and writes without third-party dependencies (safetensors)."""
