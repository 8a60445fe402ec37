"""Assertion helpers shared by the test modules."""

from __future__ import annotations

import re

import pytest


def raises_exactly(message: str):
    """``pytest.raises(ValueError)`` whose message must be ``message``, whole and literal."""
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")
