"""What an op's inference function works with: its operand types and attribute readers.

Each reader takes the attribute as given (ints, lists, numpy scalars, None), checks it,
records its normalized form (docs/ops.md) and returns it. A problem is raised as `Reject`;
`hexir.ops.make_op` turns it into a `TypeInferenceError` that names and prints the op.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from typing import NoReturn

import numpy as np

from hexir.ir.dtype import check_dtype, is_float, is_int
from hexir.ir.graph import TensorType
from hexir.ir.symbolic import Dim, Sym, format_dim
from hexir.ir.tir import AnnotationValue

# Names of values, graphs and constants: what the text form can spell after `%` or `@`.
NAME_RE = re.compile(r"[A-Za-z0-9_.$-]+")
PLACEMENT_RE = re.compile(r"[a-z][a-z0-9_]*(:\d+)?")

_REQUIRED = object()


class Reject(Exception):
    """An op that does not fit; the message says why, without the op's name."""


def dims(t: TensorType) -> str:
    """`64x784` (`1x{seq}x768`) for a shape, `a scalar` for rank 0."""
    return "x".join(map(format_dim, t.shape)) if t.shape else "a scalar"


def _int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise Reject(f"{what} must be an int, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise Reject(f"{what} must be an int, got {value!r}") from None


def _int_tuple(value: object, what: str) -> tuple[int, ...]:
    if hasattr(value, "tolist"):  # numpy arrays
        value = value.tolist()
    if not isinstance(value, list | tuple | range):
        raise Reject(f"{what} must be a tuple of ints, got {value!r}")
    return tuple(_int(v, what) for v in value)


def normalize_axis(axis: int, ndim: int, what: str = "axis") -> int:
    if not -ndim <= axis < ndim:
        raise Reject(f"{what} {axis} is out of range for rank {ndim}")
    return axis + ndim if axis < 0 else axis


class Check:
    """One op being built: operand types and raw attributes in, normalized attributes out."""

    def __init__(
        self,
        operand_names: Sequence[str],
        types: Sequence[TensorType],
        attrs: Mapping[str, object],
        declared: TensorType | None,
    ):
        self.names = tuple(operand_names)
        self.types = tuple(types)
        self.raw = dict(attrs)
        self.declared = declared
        self.out: dict[str, AnnotationValue] = {}

    # --- operands -----------------------------------------------------------------------

    def ranks(self, *ranks: int) -> tuple[TensorType, ...]:
        for name, t, rank in zip(self.names, self.types, ranks, strict=True):
            if len(t.shape) != rank:
                raise Reject(f"{name} must have rank {rank}, got {dims(t)} (rank {len(t.shape)})")
        return self.types

    def same_dtype(self, *indices: int) -> str:
        picked = indices or tuple(range(len(self.types)))
        first = self.types[picked[0]].dtype
        for i in picked[1:]:
            if self.types[i].dtype != first:
                listed = ", ".join(f"{self.names[j]} is {self.types[j].dtype}" for j in picked)
                raise Reject(f"operand dtypes differ: {listed}")
        return first

    def dtype_in(self, allowed: str, *indices: int) -> None:
        """`allowed`: "float" (float16/32/64), "int" (integers), "numeric" (all but bool) or
        "any"."""
        for i in indices or range(len(self.types)):
            dtype = self.types[i].dtype
            if allowed == "float" and not is_float(dtype):
                raise Reject(f"{self.names[i]} must be a float tensor, got {dtype}")
            if allowed == "int" and not is_int(dtype):
                raise Reject(f"{self.names[i]} must be an integer tensor, got {dtype}")
            if allowed == "numeric" and dtype == "bool":
                raise Reject(f"{self.names[i]} must be a numeric tensor, got bool")

    def broadcast(self, *indices: int) -> tuple[int, ...]:
        """numpy broadcasting of the operands' shapes."""
        picked = indices or tuple(range(len(self.types)))
        shapes = [self.types[i].shape for i in picked]
        ndim = max(len(s) for s in shapes)
        result = []
        for k in range(ndim):
            extents = {s[k - ndim + len(s)] for s in shapes if k - ndim + len(s) >= 0}
            extents.discard(1)
            if len(extents) > 1:
                listed = ", ".join(f"{self.names[i]} is {dims(self.types[i])}" for i in picked)
                raise Reject(f"shapes do not broadcast: {listed}")
            result.append(extents.pop() if extents else 1)
        return tuple(result)

    # --- attributes ---------------------------------------------------------------------

    def _get(self, key: str, default: object) -> object:
        value = self.raw.get(key)
        if value is None:
            if default is _REQUIRED:
                raise Reject(f"missing attribute '{key}'")
            return default
        return value

    def integer(self, key: str, default: object = _REQUIRED, minimum: int | None = None) -> int:
        value = _int(self._get(key, default), f"attribute '{key}'")
        if minimum is not None and value < minimum:
            raise Reject(f"attribute '{key}' must be at least {minimum}, got {value}")
        self.out[key] = value
        return value

    def axis(self, key: str, ndim: int, default: object = _REQUIRED) -> int:
        value = normalize_axis(_int(self._get(key, default), key), ndim, key)
        self.out[key] = value
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool | np.bool_):
            raise Reject(f"attribute '{key}' must be a bool, got {value!r}")
        self.out[key] = bool(value)
        return bool(value)

    def real(self, key: str, default: float) -> float:
        value = self._get(key, default)
        if isinstance(value, bool | str) or not hasattr(value, "__float__"):
            raise Reject(f"attribute '{key}' must be a float, got {value!r}")
        result = float(value)
        self.out[key] = result
        return result

    def choice(self, key: str, options: Sequence[str], default: object = _REQUIRED) -> str:
        value = self._get(key, default)
        if value not in options:
            listed = " | ".join(f'"{o}"' for o in options)
            raise Reject(f"attribute '{key}' must be {listed}, got {value!r}")
        self.out[key] = str(value)
        return str(value)

    def string(self, key: str, pattern: re.Pattern[str]) -> str:
        value = self._get(key, _REQUIRED)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise Reject(f"attribute '{key}' must be a name like {pattern.pattern}, got {value!r}")
        self.out[key] = value
        return value

    def dtype(self, key: str) -> str:
        value = self._get(key, _REQUIRED)
        try:
            name = check_dtype(value)  # type: ignore[arg-type]
        except (ValueError, TypeError) as e:
            raise Reject(f"attribute '{key}': {e}") from None
        self.out[key] = name
        return name

    def ints(self, key: str, default: object = _REQUIRED, length: int | None = None) -> tuple:
        """A tuple of ints; an int alone stands for `length` copies of itself."""
        value = self._get(key, default)
        if length is not None and not isinstance(value, bool) and hasattr(value, "__index__"):
            value = (value,) * length
        values = _int_tuple(value, f"attribute '{key}'")
        if length is not None and len(values) != length:
            raise Reject(f"attribute '{key}' must have {length} entries, got {values}")
        self.out[key] = values
        return values

    def extents(self, key: str, default: object = _REQUIRED) -> tuple[Dim, ...]:
        """A tuple of dimensions: ints, or symbolic ones (Syms) where the op's sizes are
        symbolic (reshape's shape, broadcast_to's); a dimension alone is a tuple of one."""
        value = self._get(key, default)
        if isinstance(value, Sym) or (not isinstance(value, bool) and hasattr(value, "__index__")):
            value = (value,)
        if hasattr(value, "tolist"):  # numpy arrays
            value = value.tolist()
        if not isinstance(value, list | tuple | range):
            raise Reject(f"attribute '{key}' must be a tuple of dimensions, got {value!r}")
        what = f"attribute '{key}'"
        values = tuple(v if isinstance(v, Sym) else _int(v, what) for v in value)
        self.out[key] = values
        return values

    def extent(self, key: str, default: object = _REQUIRED) -> Dim:
        """One dimension: an int or a Sym (arange's bounds)."""
        value = self._get(key, default)
        result = value if isinstance(value, Sym) else _int(value, f"attribute '{key}'")
        self.out[key] = result
        return result

    def raw_entries(self, key: str, length: int) -> tuple[Dim | None, ...] | None:
        """A tuple of ints, Syms or Nones, unrecorded (slice's start/stop/step); None if
        absent."""
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise Reject(f"attribute '{key}' must be a tuple, got {value!r}")
        if len(value) > length:
            raise Reject(f"attribute '{key}' has {len(value)} entries for rank {length}")
        what = f"attribute '{key}'"
        return tuple(
            None if v is None else v if isinstance(v, Sym) else _int(v, what) for v in value
        )


def fail(message: str) -> NoReturn:
    raise Reject(message)
