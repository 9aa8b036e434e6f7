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

from hexir.ir.narrow import F32, NARROW_FLOATS, in_float32
from hexir.ir.tir import BufferLoad, BufferStore, Cast, Expr, FloatImm, IfThenElse, Stmt
from hexir.ir.visit import map_stmt, walk


def lower_narrow_floats(body: Stmt) -> Stmt:
    """`body` with its bfloat16 and float16 values computed in float32 (see the module
    docstring)."""
    if not any(_narrow(n) for n in walk(body)):
        return body
    return map_stmt(body, stmt_fn=_stmt)


def _narrow(node: object) -> bool:
    if isinstance(node, (BufferLoad, BufferStore)):
        return node.buffer.dtype in NARROW_FLOATS
    return isinstance(node, (Cast, FloatImm)) and node.dtype in NARROW_FLOATS


def _stmt(stmt: Stmt) -> Stmt:
    match stmt:
        case BufferStore(buffer, indices, value):
            indices = tuple(in_float32(i) for i in indices)
            value = in_float32(value)
            if buffer.dtype in NARROW_FLOATS:
                value = _stored(value, buffer.dtype)
            return BufferStore(buffer, indices, value)
        case IfThenElse(cond, then, else_):
            return IfThenElse(in_float32(cond), then, else_)
    return stmt


def _stored(value: Expr, dtype: str) -> Expr:
    """A float32 `value` as the narrow `dtype` (the element itself where it was made of one)."""
    if isinstance(value, Cast) and value.dtype == F32 and value.value.dtype == dtype:
        return value.value
    return Cast(dtype, value)
