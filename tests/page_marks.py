"""Whether the WebNN pages can run here (a wgpu adapter), as a skip mark shared by the tests
that drive them."""

from __future__ import annotations

import pytest


def page_ok() -> tuple[bool, str]:
    """(True, "") where the pages' wgpu adapter is available, else (False, why not)."""
    try:
        from backends.pages import StatelessCopy
    except ImportError as exc:
        return False, str(exc)
    return StatelessCopy.available()


PAGE_OK, PAGE_WHY = page_ok()
needs_page = pytest.mark.skipif(not PAGE_OK, reason=PAGE_WHY)
