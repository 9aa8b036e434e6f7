"""bfloat16 and float16 in C and CUDA C: stored in 16 bits, computed in float.

C has no bfloat16 arithmetic (GCC 12 has none; CPUs without AVX512_BF16 none either), and
float16's `_Float16` (GCC on x86, F16C's conversions) is a storage type whose arithmetic numpy
defines as float32's rounded after each op. So before printing, `lower_narrow_floats` rewrites
a kernel's body so that every such value is a float holding a bfloat16 (float16) number:

- a load of a bfloat16 (float16) buffer is `cast<f32>` of it;
- an arithmetic op, math call or cast whose result is bfloat16 (float16) computes in float32
  and rounds once (`cast<f32>(cast<bf16>(x))`: to the nearest, ties to even, as ml_dtypes and
  numpy do after each op, so the C computes what the numpy reference computes);
- a store to such a buffer stores `cast<bf16>` of the float (rounded), and a copy moves the
  element itself.

Afterwards the only narrow expressions are loads and `cast<bf16>` / `cast<f16>` of a float.
The C printer converts bfloat16's bits with `hx_f32_bf16` / `hx_bf16_f32` (and their vector
forms), float16 with C casts (F16C's vcvtps2ph / vcvtph2ps); CUDA C with PTX's cvt.
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

NARROW, F32 = ("bfloat16", "float16"), "float32"


def lower_narrow_floats(body: Stmt) -> Stmt:
    """`body` with its bfloat16 and float16 values computed in float32 (see the module
    docstring)."""
    if not any(_narrow(n) for n in walk(body)):
        return body
    return map_stmt(body, stmt_fn=_stmt)


def _narrow(node: object) -> bool:
    if isinstance(node, (BufferLoad, BufferStore)):
        return node.buffer.dtype in NARROW
    return isinstance(node, (Cast, FloatImm)) and node.dtype in NARROW


def _stmt(stmt: Stmt) -> Stmt:
    match stmt:
        case BufferStore(buffer, indices, value):
            indices = tuple(_float(i) for i in indices)
            value = _float(value)
            if buffer.dtype in NARROW:
                value = _stored(value, buffer.dtype)
            return BufferStore(buffer, indices, value)
        case IfThenElse(cond, then, else_):
            return IfThenElse(_float(cond), then, else_)
    return stmt


def _stored(value: Expr, dtype: str) -> Expr:
    """A float32 `value` as the narrow `dtype` (the element itself where it was made of one)."""
    if isinstance(value, Cast) and value.dtype == F32 and value.value.dtype == dtype:
        return value.value
    return Cast(dtype, value)


def _round(value: Expr, dtype: str) -> Expr:
    """A float32 `value` rounded to the narrow `dtype`, kept as a float32."""
    return Cast(F32, Cast(dtype, value))


def _float(e: Expr) -> Expr:
    """`e` with every bfloat16 value in it a float32 one."""
    match e:
        case BufferLoad(buffer, indices):
            load = BufferLoad(buffer, tuple(_float(i) for i in indices))
            return Cast(F32, load) if buffer.dtype in NARROW else load
        case FloatImm(value, dtype) if dtype in NARROW:
            return FloatImm(value, F32)
        case Cast(dtype, value):
            inner = _float(value)
            if dtype in NARROW:
                return _round(inner if inner.dtype == F32 else Cast(F32, inner), dtype)
            return inner if inner.dtype == dtype else Cast(dtype, inner)
        case Binary(op, a, b):
            new = Binary(op, _float(a), _float(b))
            return _round(new, e.dtype) if e.dtype in NARROW and op in ARITH_OPS else new
        case Unary(op, a):
            return Unary(op, _float(a))
        case Call(name, args):
            new = Call(name, tuple(_float(a) for a in args))
            return _round(new, e.dtype) if e.dtype in NARROW else new
        case Select(cond, then, else_):
            return Select(_float(cond), _float(then), _float(else_))
    return e
