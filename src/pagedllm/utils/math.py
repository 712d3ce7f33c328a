"""Integer helpers."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(a // -b)


def round_up(x: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= x."""
    return cdiv(x, multiple) * multiple
