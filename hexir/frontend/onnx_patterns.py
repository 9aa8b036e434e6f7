"""Subgraphs of an ONNX model that are one Hexir op: gelu spelled with Erf or Tanh (as opset
< 20 exporters write it, PyTorch's and Hexir's own), and rsqrt as Reciprocal(Sqrt(x)).

A pattern is a small expression tree over ONNX ops; `Mul` and `Add` match either operand
order, `X` is the op's input (the same tensor wherever it appears), `C(v)` a scalar constant
close to v. Every tensor inside a match other than its root must have no other consumer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexir.frontend.onnx_context import Node, Unsupported, tensor_array


@dataclass(frozen=True, slots=True)
class C:
    value: float


@dataclass(frozen=True, slots=True)
class P:
    op: str
    args: tuple[P | C | str, ...]


X = "x"
Pattern = P | C | str
_COMMUTATIVE = ("Mul", "Add")


def _gelu_outer(core: P) -> tuple[P, ...]:
    """x·(1 + core)·0.5 with the 0.5 applied in each of the places exporters put it."""
    one_plus = P("Add", (core, C(1.0)))
    return (
        P("Mul", (P("Mul", (X, one_plus)), C(0.5))),
        P("Mul", (P("Mul", (X, C(0.5))), one_plus)),
        P("Mul", (X, P("Mul", (one_plus, C(0.5))))),
        P("Div", (P("Mul", (X, one_plus)), C(2.0))),
    )


_ERF = (
    P("Erf", (P("Div", (X, C(math.sqrt(2.0)))),)),
    P("Erf", (P("Mul", (X, C(math.sqrt(0.5)))),)),
)
_CUBES = (P("Pow", (X, C(3.0))), P("Mul", (P("Mul", (X, X)), X)), P("Mul", (X, P("Mul", (X, X)))))
_K = C(math.sqrt(2.0 / math.pi))
_TANH = tuple(
    P("Tanh", (P("Mul", (P("Add", (X, P("Mul", (cube, C(0.044715))))), _K)),)) for cube in _CUBES
) + (
    P(
        "Tanh",
        (
            P(
                "Mul",
                (P("Mul", (X, P("Add", (C(1.0), P("Mul", (P("Mul", (X, X)), C(0.044715))))))), _K),
            ),
        ),
    ),
)

# (the Hexir op, its attributes, the patterns that spell it)
PATTERNS: tuple[tuple[str, dict[str, object], tuple[P, ...]], ...] = (
    ("gelu", {"approximate": "none"}, tuple(p for core in _ERF for p in _gelu_outer(core))),
    ("gelu", {"approximate": "tanh"}, tuple(p for core in _TANH for p in _gelu_outer(core))),
    (
        "rsqrt",
        {},
        (P("Reciprocal", (P("Sqrt", (X,)),)), P("Div", (C(1.0), P("Sqrt", (X,))))),
    ),
)


@dataclass(frozen=True, slots=True)
class Match:
    """One match: its root node, what it is, its input tensor and the nodes it replaces."""

    kind: str
    attrs: Mapping[str, object]
    x: str
    interior: frozenset[int]


class _Matcher:
    def __init__(self, nodes: list[Node], scalars: Mapping[str, float], uses: Mapping[str, int]):
        self.producer = {out: node for node in nodes for out in node.outputs if out}
        self.scalars = scalars
        self.uses = uses

    def match(self, pat: Pattern, tensor: str, env: dict[str, str], root: bool) -> list[int] | None:
        if isinstance(pat, str):
            if env.setdefault(pat, tensor) != tensor:
                return None
            return []
        if isinstance(pat, C):
            value = self.scalars.get(tensor)
            return (
                [] if value is not None and math.isclose(value, pat.value, rel_tol=1e-4) else None
            )
        node = self.producer.get(tensor)
        if node is None or node.op_type != pat.op or len(node.inputs) != len(pat.args):
            return None
        if not root and self.uses.get(tensor, 0) != 1:
            return None
        orders = [pat.args]
        if pat.op in _COMMUTATIVE:
            orders.append(pat.args[::-1])
        for args in orders:
            trial = dict(env)
            found = self._all(args, node.inputs, trial)
            if found is not None:
                env.update(trial)
                return [node.index, *found]
        return None

    def _all(self, args: tuple[Pattern, ...], inputs: tuple[str, ...], env: dict[str, str]):
        found: list[int] = []
        for arg, tensor in zip(args, inputs, strict=True):
            sub = self.match(arg, tensor, env, root=False)
            if sub is None:
                return None
            found += sub
        return found


def find_matches(
    nodes: list[Node], scalars: Mapping[str, float], uses: Mapping[str, int]
) -> dict[int, Match]:
    """Root node index -> match, for every pattern found; matches do not overlap."""
    matcher = _Matcher(nodes, scalars, uses)
    matches: dict[int, Match] = {}
    taken: set[int] = set()
    for node in reversed(nodes):  # outermost first: a root is the last node of its match
        if node.index in taken or len(node.outputs) != 1:
            continue
        for kind, attrs, patterns in PATTERNS:
            found = _first(matcher, patterns, node.outputs[0])
            if found is not None and not taken & set(found[0]):
                indices, x = found
                matches[node.index] = Match(kind, attrs, x, frozenset(indices) - {node.index})
                taken |= set(indices)
                break
    return matches


def _first(matcher: _Matcher, patterns: tuple[P, ...], tensor: str):
    for pat in patterns:
        env: dict[str, str] = {}
        found = matcher.match(pat, tensor, env, root=True)
        if found is not None:
            return found, env[X]
    return None


def scalar_constants(initializers: Mapping[str, Any], nodes: list[Node]) -> dict[str, float]:
    """The one-element float or int tensors of the model, by name: the C() of patterns."""
    arrays: dict[str, Any] = dict(initializers)
    for node in nodes:
        if node.op_type == "Constant" and "value" in node.attrs:
            arrays[node.outputs[0]] = node.attrs["value"]
    out: dict[str, float] = {}
    for name, tensor in arrays.items():
        dims = list(getattr(tensor, "dims", []))
        if int(np.prod(dims)) == 1:
            try:
                array = tensor_array(tensor, name)
            except Unsupported:  # not a scalar the patterns can use; its converter says why
                continue
            if array.dtype.kind in "fiu":
                out[name] = float(array.reshape(-1)[0])
    return out
