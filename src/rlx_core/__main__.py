"""``python -m rlx_core``: the ``rlx`` command line, for when the console script is not on PATH."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
