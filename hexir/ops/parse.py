"""`hexir.parse`: text of either dialect back to IR.

The graph dialect's parser checks every op against its definition, so parsing sits here, above
the IR; the printers and the hextir parser are in `hexir.ir`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hexir.ir.graph import ConstantData, Graph
from hexir.ir.tir import PrimFunc


def parse(text: str, constants: Mapping[str, np.ndarray] | None = None) -> Graph | PrimFunc:
    """Parse a `hexir.graph` or a `hextir.func`; `constants` gives the blobs of named constants."""
    from hexir.ir.tir_text import parse_func

    if _first_word(text).startswith("hextir."):
        return parse_func(text)
    return parse_graph(text, constants=constants)


def parse_graph(
    text: str, constants: Mapping[str, np.ndarray | ConstantData] | None = None
) -> Graph:
    """Parse a `hexir.graph`; `constants` gives the data of constants printed as `@name`.

    Every op is checked as it is read (`hexir.ops.make_op`); raises `ParseError` with the
    line, column and a caret for text that does not parse, an unknown op, a bad attribute, a
    result type that disagrees with inference, or a constant whose data is missing.
    """
    from hexir.ops.graph_parser import GraphParser

    return GraphParser(text, constants or {}).parse()


def _first_word(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("//"):
            return stripped.split()[0]
    return ""
