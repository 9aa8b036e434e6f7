"""float16 and bfloat16 expressions computed in float32.

Both are storage types here: numpy (float16) and ml_dtypes (bfloat16) compute each op in
float32 and round its result. `in_float32(e, rounded=True)` rewrites a hextir expression that
way: narrow loads and literals widened, each narrow arithmetic op, math call and cast computed
in float32 and rounded (`cast<f32>(cast<bf16>(x))`). With `rounded=False` nothing is rounded
in between: a sum of narrow floats accumulates in float32 (hexir/ops/compute.py), as the numpy
reference sums them wide. The C printers lower every kernel with the first before printing
(hexir/codegen/c_narrow.py).
"""

from __future__ import annotations

from hexir.ir.dtype import BYTE_FLOATS
from hexir.ir.tir import (
    ARITH_OPS,
    Binary,
    BufferLoad,
    Call,
    Cast,
    Expr,
    FloatImm,
    Select,
    Unary,
)

HALF_FLOATS = ("float16", "bfloat16")
NARROW_FLOATS = HALF_FLOATS + BYTE_FLOATS  # stored narrow, computed in float32
F32 = "float32"


def in_float32(e: Expr, rounded: bool = True) -> Expr:
    """`e` with every float16 or bfloat16 value in it a float32 one: rounded to its dtype after
    each op that makes it (`rounded`), or not at all."""

    def go(e: Expr) -> Expr:
        match e:
            case BufferLoad(buffer, indices):
                load = BufferLoad(buffer, tuple(go(i) for i in indices))
                return Cast(F32, load) if buffer.dtype in NARROW_FLOATS else load
            case FloatImm(value, dtype) if dtype in NARROW_FLOATS:
                return FloatImm(value, F32)
            case Cast(dtype, value):
                inner = go(value)
                if dtype in NARROW_FLOATS:
                    inner = inner if inner.dtype == F32 else Cast(F32, inner)
                    return round_to(inner, dtype) if rounded else inner
                return inner if inner.dtype == dtype else Cast(dtype, inner)
            case Binary(op, a, b):
                new = Binary(op, go(a), go(b))
                narrow = e.dtype in NARROW_FLOATS and op in ARITH_OPS
                return round_to(new, e.dtype) if narrow and rounded else new
            case Unary(op, a):
                return Unary(op, go(a))
            case Call(name, args):
                new = Call(name, tuple(go(a) for a in args))
                return round_to(new, e.dtype) if e.dtype in NARROW_FLOATS and rounded else new
            case Select(cond, then, else_):
                return Select(go(cond), go(then), go(else_))
        return e

    return go(e)


def round_to(value: Expr, dtype: str) -> Expr:
    """A float32 `value` rounded to the narrow `dtype`, kept as a float32."""
    return Cast(F32, Cast(dtype, value))
