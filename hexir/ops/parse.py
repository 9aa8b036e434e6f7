"""`hexir.parse`: text of either dialect back to IR."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hexir.ir.graph import Graph
from hexir.ir.tir import PrimFunc


def parse(text: str, constants: Mapping[str, np.ndarray] | None = None) -> Graph | PrimFunc:
    """Parse a `hexir.graph` or a `hextir.func`; `constants` gives the blobs of named constants."""
    from hexir.ir.graph_text import parse_graph
    from hexir.ir.tir_text import parse_func

    if _first_word(text).startswith("hextir."):
        return parse_func(text)
    return parse_graph(text, constants=constants)


def _first_word(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("//"):
            return stripped.split()[0]
    return ""
