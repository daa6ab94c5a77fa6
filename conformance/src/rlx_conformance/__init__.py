"""rlx-conformance: the shared suite that certifies an RLX backend plugin.

    rlx conformance cpu --json cert.json --markdown cert.md
    pytest -p rlx_conformance --rlx-backend cpu

A check is ``passed``, ``failed``, ``error``, ``skipped`` (the backend cannot compile that
variant: *not certified* for it, never passed), ``xfailed`` (listed in the plugin's
``conformance-xfails.txt`` with a reason) or ``xpassed`` (listed but passing: the manifest is
stale, which blocks certification until it is corrected).
"""

__version__ = "0.1.0"
SUITE_VERSION = "1.0"

from .runner import Outcome, run_suite  # noqa: E402

__all__ = ["SUITE_VERSION", "Outcome", "__version__", "run_suite"]
