"""Fresh names for what a rewrite adds: loop vars, buffers, blocks."""

from __future__ import annotations


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`... whichever is free first; the result is added to `taken`."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name
