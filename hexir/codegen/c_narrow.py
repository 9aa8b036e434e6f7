"""bfloat16 in C and CUDA C: stored as its 16 bits, computed in float.

C has no bfloat16 arithmetic (GCC 12 has none; CPUs without AVX512_BF16 none either), so
before printing, `lower_bfloat16` rewrites a kernel's body so that every bfloat16 value is a
float holding a bfloat16 number:

- a load of a bfloat16 buffer is `cast<f32>` of its bits (the bits shifted into a float);
- an arithmetic op, math call or cast whose result is bfloat16 computes in float32 and rounds
  to bfloat16 once (`cast<f32>(cast<bf16>(x))`: to the nearest, ties to even, as ml_dtypes
  does after each op, so the C computes what the numpy reference computes);
- a store to a bfloat16 buffer stores `cast<bf16>` of the float (its rounded bits), and a copy
  moves the bits themselves.

Afterwards the only bfloat16 expressions are loads (bits) and `cast<bf16>` of a float (bits),
which the printers convert with `hx_f32_bf16` / `hx_bf16_f32` (and their vector forms).
"""

from __future__ import annotations

from hexir.ir.tir import (
    ARITH_OPS,
    Binary,
    BufferLoad,
    BufferStore,
    Call,
    Cast,
    Expr,
    FloatImm,
    IfThenElse,
    Select,
    Stmt,
    Unary,
)
from hexir.ir.visit import map_stmt, walk

BF16, F32 = "bfloat16", "float32"


def lower_bfloat16(body: Stmt) -> Stmt:
    """`body` with its bfloat16 values computed in float32 (see the module docstring)."""
    if not any(_bfloat16(n) for n in walk(body)):
        return body
    return map_stmt(body, stmt_fn=_stmt)


def _bfloat16(node: object) -> bool:
    if isinstance(node, (BufferLoad, BufferStore)):
        return node.buffer.dtype == BF16
    return isinstance(node, (Cast, FloatImm)) and node.dtype == BF16


def _stmt(stmt: Stmt) -> Stmt:
    match stmt:
        case BufferStore(buffer, indices, value):
            indices = tuple(_float(i) for i in indices)
            value = _float(value)
            if buffer.dtype == BF16:
                value = _bits(value)
            return BufferStore(buffer, indices, value)
        case IfThenElse(cond, then, else_):
            return IfThenElse(_float(cond), then, else_)
    return stmt


def _bits(value: Expr) -> Expr:
    """The bfloat16 bits of a float32 `value` (the bits themselves where it was made of them)."""
    if isinstance(value, Cast) and value.dtype == F32 and value.value.dtype == BF16:
        return value.value
    return Cast(BF16, value)


def _round(value: Expr) -> Expr:
    """A float32 `value` rounded to bfloat16, kept as a float32."""
    return Cast(F32, Cast(BF16, value))


def _float(e: Expr) -> Expr:
    """`e` with every bfloat16 value in it a float32 one."""
    match e:
        case BufferLoad(buffer, indices):
            load = BufferLoad(buffer, tuple(_float(i) for i in indices))
            return Cast(F32, load) if buffer.dtype == BF16 else load
        case FloatImm(value, dtype) if dtype == BF16:
            return FloatImm(value, F32)
        case Cast(dtype, value):
            inner = _float(value)
            if dtype == BF16:
                return _round(inner if inner.dtype == F32 else Cast(F32, inner))
            return inner if inner.dtype == dtype else Cast(dtype, inner)
        case Binary(op, a, b):
            new = Binary(op, _float(a), _float(b))
            return _round(new) if e.dtype == BF16 and op in ARITH_OPS else new
        case Unary(op, a):
            return Unary(op, _float(a))
        case Call(name, args):
            new = Call(name, tuple(_float(a) for a in args))
            return _round(new) if e.dtype == BF16 else new
        case Select(cond, then, else_):
            return Select(_float(cond), _float(then), _float(else_))
    return e
