"""rlx-conformance's ``RLX_*`` settings, declared once (listed in docs/CLI.md)."""

from __future__ import annotations

from rlx_core.plugin import Setting, declare_setting

OWNER = "rlx-conformance"

CERT_DIR = declare_setting(
    "RLX_CERT_DIR", "path", None,
    "A folder of `rlx conformance B --results` files this CI run wrote; tests reuse them instead of "
    "running the suite again.", owner=OWNER, default_text="unset: tests run the suite themselves")

SETTINGS: list[Setting] = [CERT_DIR]
