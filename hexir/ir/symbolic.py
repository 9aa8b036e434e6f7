"""Symbolic dimensions: a tensor's extent that is a named size (a prompt's length) rather than
a number, or a linear expression of such sizes (the cache after one more token).

    seq = Sym.named("seq")
    TensorType((1, seq, 768))          # prints tensor<1x{seq}x768xf32>
    seq + 1, 2 * seq, seq * 768        # Sym; a Sym with no symbols left is an int
    parse_dim("past + 1")              # Sym; parse_dim("64") is 64
    Sym.named("seq").evaluate({"seq": 17})   # 17
    quotient((1, seq, 32), (2, 16))    # seq: the element counts' quotient (a reshape's -1)

A dimension is an `int` or a `Sym`: integer coefficients of symbols plus an offset. Every
symbol names a size of at least 1, so `seq >= 1` and `seq + 1 > 1` hold, and a comparison
that the symbols' values could decide either way raises `SymbolicError`. So does what a
linear expression cannot hold (seq * seq, seq // 3, int(seq)): shape inference of an op that
needs a number where a symbol stands fails with that error, which `hexir.ops.make_op` reports
as the op's TypeInferenceError. Sums arise where ops need them (concat along a symbolic axis,
reshape folding it into a product with numbers); a product of symbols is never a dimension,
but `quotient` cancels equal factors of two products (a reshape between 1x{seq}x{past} and
{seq}x{past}).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Union

__all__ = [
    "Dim", "Sym", "SymbolicError", "bind_sizes", "format_dim", "parse_dim", "quotient",
    "shape_at", "SYMBOL_RE",
]  # fmt: skip

SYMBOL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TERM_RE = re.compile(
    r"\s*([+-])?\s*(?:(\d+)\s*\*\s*([A-Za-z_]\w*)|([A-Za-z_]\w*)(?:\s*\*\s*(\d+))?|(\d+))"
)


class SymbolicError(Exception):
    """A symbolic dimension where the operation needs a number, or an expression the linear
    form cannot hold; the message names the dimension."""


@dataclass(frozen=True, slots=True)
class Sym:
    """sum(coefficient * symbol) + offset, with at least one symbol; `terms` are sorted by
    symbol name, coefficients nonzero. Build with `Sym.named` and arithmetic."""

    terms: tuple[tuple[str, int], ...]
    offset: int = 0

    @staticmethod
    def named(name: str) -> Sym:
        if not SYMBOL_RE.fullmatch(name):
            raise SymbolicError(f"bad symbol name {name!r}; symbols match {SYMBOL_RE.pattern}")
        return Sym(((name, 1),))

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.terms)

    @property
    def minimum(self) -> int | None:
        """The least value over sizes >= 1, or None where a negative coefficient leaves it
        unbounded below."""
        if any(c < 0 for _, c in self.terms):
            return None
        return sum(c for _, c in self.terms) + self.offset

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        missing = sorted(self.symbols - set(sizes))
        if missing:
            raise SymbolicError(f"no size for {', '.join(missing)} (in {{{self}}})")
        return sum(c * int(sizes[n]) for n, c in self.terms) + self.offset

    # --- arithmetic: linear only ------------------------------------------------------------

    def __add__(self, other: Dim) -> Dim:
        if isinstance(other, Sym):
            return _linear({**dict(self.terms)}, self.offset, other.terms, other.offset)
        return _linear(dict(self.terms), self.offset, (), _number(other, self, "+"))

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return _make({n: -c for n, c in self.terms}, -self.offset)

    def __sub__(self, other: Dim) -> Dim:
        return self + (-other)

    def __rsub__(self, other: Dim) -> Dim:
        return (-self) + other

    def __mul__(self, other: Dim) -> Dim:
        if isinstance(other, Sym):
            raise SymbolicError(f"{{{self}}} * {{{other}}} is not linear in its symbols")
        k = _number(other, self, "*")
        return _make({n: c * k for n, c in self.terms}, self.offset * k)

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        k = _number(other, self, "//")
        if k == 0 or any(c % k for _, c in self.terms) or self.offset % k:
            raise SymbolicError(f"{{{self}}} // {other} is not exact for every size")
        return _make({n: c // k for n, c in self.terms}, self.offset // k)

    def __mod__(self, other: Dim) -> int:
        k = _number(other, self, "%")
        if k and not any(c % k for _, c in self.terms):
            return self.offset % k
        raise SymbolicError(f"{{{self}}} % {other} depends on the symbols' sizes")

    def __truediv__(self, other: object) -> object:
        raise SymbolicError(f"{{{self}}} / {other}: a symbolic dimension needs a number here")

    __rtruediv__ = __rfloordiv__ = __rmod__ = __pow__ = __truediv__

    # --- comparisons: decided for every size >= 1, else an error ------------------------------

    def _decide(self, other: Dim, op: str, holds: bool | None) -> bool:
        if holds is None:
            raise SymbolicError(f"whether {{{self}}} {op} {_shown(other)} depends on the sizes")
        return holds

    def _range(self, other: Dim) -> tuple[int | None, int | None]:
        """The least and the greatest value of self - other over sizes >= 1 (None: no bound)."""
        diff = self - other
        if not isinstance(diff, Sym):
            return diff, diff
        high = (-diff).minimum  # type: ignore[union-attr]
        return diff.minimum, None if high is None else -high

    def __lt__(self, other: Dim) -> bool:
        low, high = self._range(other)
        return self._decide(
            other, "<", _either(high is not None and high < 0, low is not None and low >= 0)
        )

    def __le__(self, other: Dim) -> bool:
        low, high = self._range(other)
        return self._decide(
            other, "<=", _either(high is not None and high <= 0, low is not None and low > 0)
        )

    def __gt__(self, other: Dim) -> bool:
        low, high = self._range(other)
        return self._decide(
            other, ">", _either(low is not None and low > 0, high is not None and high <= 0)
        )

    def __ge__(self, other: Dim) -> bool:
        low, high = self._range(other)
        return self._decide(
            other, ">=", _either(low is not None and low >= 0, high is not None and high < 0)
        )

    # --- where a number is needed -------------------------------------------------------------

    def __index__(self) -> int:
        raise SymbolicError(f"the dimension {{{self}}} is symbolic where a number is needed")

    __int__ = __index__

    def __float__(self) -> float:
        raise SymbolicError(f"the dimension {{{self}}} is symbolic where a number is needed")

    def __str__(self) -> str:
        parts: list[str] = []
        for name, c in self.terms:
            term = name if abs(c) == 1 else f"{abs(c)}*{name}"
            parts.append(term if not parts and c > 0 else f"{'-' if c < 0 else '+'} {term}")
        if parts[0].startswith("- "):
            parts[0] = "-" + parts[0][2:]
        if self.offset:
            parts.append(f"{'-' if self.offset < 0 else '+'} {abs(self.offset)}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"Sym({str(self)!r})"


Dim = Union[int, Sym]


def _number(value: object, sym: Sym, op: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise SymbolicError(f"{{{sym}}} {op} {value!r}: only integers combine with a dimension")
    return value.__index__()  # type: ignore[union-attr]


def _linear(
    terms: dict[str, int], offset: int, more: tuple[tuple[str, int], ...], more_offset: int
) -> Dim:
    for name, c in more:
        terms[name] = terms.get(name, 0) + c
    return _make(terms, offset + more_offset)


def _make(terms: dict[str, int], offset: int) -> Dim:
    kept = tuple(sorted((n, c) for n, c in terms.items() if c))
    return Sym(kept, offset) if kept else offset


def _either(true: bool, false: bool) -> bool | None:
    """True, False, or None where neither is proved."""
    return True if true else False if false else None


def _shown(d: object) -> str:
    return f"{{{d}}}" if isinstance(d, Sym) else str(d)


def format_dim(d: Dim) -> str:
    """A dimension in the text forms: `64`, `{seq}`, `{past + 1}`."""
    return f"{{{d}}}" if isinstance(d, Sym) else str(d)


def parse_dim(text: str) -> Dim:
    """`64`, `seq`, `{seq}`, `past + 1`, `2*seq - 1`: an int or a Sym. SymbolicError names
    what does not parse."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    if body.strip().isdigit():
        return int(body)
    total: Dim = 0
    pos = 0
    first = True
    while pos < len(body) and body[pos:].strip():
        m = _TERM_RE.match(body, pos)
        if m is None or (m.group(1) is None and not first):
            raise SymbolicError(f"bad dimension {text!r}; expected like 64, seq or past + 1")
        sign = -1 if m.group(1) == "-" else 1
        if m.group(3):
            term: Dim = int(m.group(2)) * Sym.named(m.group(3))
        elif m.group(4):
            term = Sym.named(m.group(4)) * int(m.group(5) or 1)
        else:
            term = int(m.group(6))
        total = total + sign * term
        pos, first = m.end(), False
    if first:
        raise SymbolicError(f"bad dimension {text!r}; expected like 64, seq or past + 1")
    return total


def as_dim(value: object) -> Dim:
    """A dimension from an int (numpy's too), a Sym, or a string `parse_dim` reads."""
    if type(value) is int:  # the usual case, first: every TensorType's every dimension
        return value
    if isinstance(value, Sym):
        return value
    if isinstance(value, str):
        return parse_dim(value)
    return int(value)  # type: ignore[call-overload]


def shape_at(dims: Sequence[Dim], sizes: Mapping[str, int]) -> tuple[int, ...]:
    """A shape of symbolic dimensions at the given sizes of their symbols."""
    return tuple(d.evaluate(sizes) if isinstance(d, Sym) else d for d in dims)


def bind_sizes(
    declared: Sequence[tuple[str, tuple[Dim, ...]]],
    shapes: Sequence[tuple[int, ...]],
    known: Mapping[str, int] | None = None,
) -> tuple[dict[str, int], list[str]]:
    """(each symbol's size, what does not fit) from the shapes given for declared (name,
    shape) pairs, after the `known` sizes: a dimension that is a symbol alone binds it, then
    every dimension must equal what its symbols give, and every symbol is at least 1."""
    sizes: dict[str, int] = dict(known or {})
    problems: list[str] = []
    for (_, dims), shape in zip(declared, shapes, strict=True):
        if len(shape) == len(dims):
            for d, n in zip(dims, shape, strict=True):
                if isinstance(d, Sym) and len(d.terms) == 1 and d.terms[0][1] == 1:
                    sizes.setdefault(d.terms[0][0], int(n) - d.offset)
    for name, size in sizes.items():
        if size < 1:
            problems.append(f"{{{name}}} would be {size}: a symbol is a size of at least 1")
    for (label, dims), shape in zip(declared, shapes, strict=True):
        if len(shape) != len(dims):
            problems.append(f"{label} has rank {len(dims)}, given shape {shape}")
            continue
        want = [
            d.evaluate(sizes) if isinstance(d, Sym) and d.symbols <= set(sizes) else d for d in dims
        ]
        if any(isinstance(w, int) and w != n for w, n in zip(want, shape, strict=True)):
            bound = ", ".join(f"{n} = {s}" for n, s in sorted(sizes.items())) or "no symbol bound"
            problems.append(
                f"{label} is {'x'.join(map(format_dim, dims))}, given shape {shape} ({bound})"
            )
        elif any(isinstance(w, Sym) for w in want):
            free = [format_dim(d) for d, w in zip(dims, want, strict=True) if isinstance(w, Sym)]
            problems.append(f"{label}: no input fixes {', '.join(free)} on its own")
    return sizes, list(dict.fromkeys(problems))


def quotient(numerator: tuple[Dim, ...], denominator: tuple[Dim, ...]) -> Dim:
    """prod(numerator) / prod(denominator) as a dimension, where it is one for every size: a
    number, or one linear factor of the numerator times a number (what a reshape's -1 stands
    for: `quotient((1, seq, 32), (2, 16)) == seq`). Each dimension counts as a number times
    a factor with coprime integer terms (`2*seq + 2` is 2 times `seq + 1`), and only equal
    factors cancel; SymbolicError where the result is no such dimension."""
    top, top_factors = _factored(numerator)
    bottom, bottom_factors = _factored(denominator)
    for factor in bottom_factors:
        if factor not in top_factors:
            raise SymbolicError(
                f"{_product(numerator)} / {_product(denominator)} keeps {{{factor}}} in its "
                "denominator"
            )
        top_factors.remove(factor)
    if bottom == 0 or top % bottom or len(top_factors) > 1:
        raise SymbolicError(
            f"{_product(numerator)} / {_product(denominator)} is not a linear dimension"
        )
    return (top // bottom) * (top_factors[0] if top_factors else 1)


def _factored(dims: tuple[Dim, ...]) -> tuple[int, list[Sym]]:
    """The product of `dims` as a number and a list of factors (Syms whose coefficients and
    offset have no common divisor and whose first coefficient is positive)."""
    number, factors = 1, []
    for d in dims:
        if not isinstance(d, Sym):
            number *= d
            continue
        g = math.gcd(d.offset, *(c for _, c in d.terms))
        g = -g if d.terms[0][1] < 0 else g
        number *= g
        factors.append(d // g)
    return number, factors


def _product(dims: tuple[Dim, ...]) -> str:
    if len(dims) == 1:
        return _shown(dims[0])
    return f"({' * '.join(format_dim(d) for d in dims)})" if dims else "1"
