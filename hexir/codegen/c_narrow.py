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
forms), float16 with C casts (F16C's vcvtps2ph / vcvtph2ps); CUDA C with PTX's cvt. The 8-bit
floats (float8_e4m3fn, ...) follow the same rule, converted one element at a time by the C
functions `float8_helpers` writes (exact: ml_dtypes' codes, ties to even, no saturation), and
so does float4_e2m1fn (`float4_helpers`: a table of its 8 magnitudes, and a ladder of
midpoints; it saturates, as ml_dtypes does).

The sub-byte ints (int4, uint4, int2, uint2) are held one per byte, their value in an int8_t
or uint8_t; a conversion into one is a C function of `sub_byte_helpers`, as ml_dtypes
converts: an integer wraps to the low bits (two's complement), a float goes toward zero and
is 0 where that is out of range (NaN and infinities too).
"""

from __future__ import annotations

from hexir.ir.dtype import DTYPES, SUB_BYTE_INTS, int_range, is_float, is_unsigned, short_name
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


# The 8-bit floats by short name: (exponent bits, mantissa bits, bias, the largest finite
# value, the code of NaN (with the sign bit for the sign-carrying ones), the code an overflow
# gives: e5m2's infinity, the others' NaN, as ml_dtypes converts), and whether zero is
# unsigned (the fnuz formats keep no negative zero: 0x80 is their NaN).
FLOAT8 = {
    "f8e4m3fn": (4, 3, 7, 448.0, 0x7F, 0x7F, False),
    "f8e4m3fnuz": (4, 3, 8, 240.0, 0x80, 0x80, True),
    "f8e5m2": (5, 2, 15, 57344.0, 0x7E, 0x7C, False),
    "f8e5m2fnuz": (5, 2, 16, 57344.0, 0x80, 0x80, True),
}


def float8_helpers() -> dict[str, str]:
    """`<f8>_f32` (bits to a float, exact) and `f32_<f8>` (a float to the nearest code, ties
    to even, an overflow to infinity or NaN as ml_dtypes gives, never saturating) for each
    8-bit float, in the conversions' template form ({q}: the qualifier)."""
    out = {}
    for s, (e_bits, m_bits, bias, top, nan, over, unsigned_zero) in FLOAT8.items():
        signed = "" if unsigned_zero else " | sign"
        if s == "f8e5m2":  # all-ones exponent: infinity or NaN
            special = "if (e == 31) return m ? NAN : (b >> 7 ? -INFINITY : INFINITY);"
        elif unsigned_zero:
            special = "if (b == 0x80) return NAN;"
        else:
            special = "if ((b & 0x7F) == 0x7F) return NAN;"
        out[f"{s}_f32"] = (
            f"{{q}} float hx_{s}_f32({{u8}} b) {{{{\n"
            f"  int e = (b >> {m_bits}) & {(1 << e_bits) - 1}, m = b & {(1 << m_bits) - 1};\n"
            f"  {special}\n"
            f"  float v = e ? ldexpf((float)(m | {1 << m_bits}), e - {bias + m_bits})"
            f" : ldexpf((float)m, {1 - bias - m_bits});\n"
            f"  return b >> 7 ? -v : v;\n}}}}"
        )
        out[f"f32_{s}"] = (
            f"{{q}} {{u8}} hx_f32_{s}(float x) {{{{\n"
            f"  {{u8}} sign = signbit(x) ? 0x80 : 0;\n"
            f"  float a = fabsf(x), r;\n"
            f"  int e;\n"
            f"  if (a != a) return {nan}{signed};\n"
            f"  if (a > {top}f * 2) return {over}{signed};\n"
            f"  frexpf(a, &e);\n"
            f"  e = e - 1 < {1 - bias} ? {1 - bias} : e - 1;  /* a's binade or the subnormals' */\n"
            f"  r = ldexpf(nearbyintf(ldexpf(a, {m_bits} - e)), e - {m_bits});  /* to even */\n"
            f"  if (r > {top}f) return {over}{signed};\n"
            f"  if (r == 0.0f) return {'0' if unsigned_zero else 'sign'};\n"
            f"  frexpf(r, &e);\n"
            f"  e -= 1;\n"
            f"  if (e < {1 - bias}) return sign | ({{u8}})ldexpf(r, {bias + m_bits - 1});\n"
            f"  return sign | ({{u8}})((e + {bias}) << {m_bits})"
            f" | ({{u8}})(ldexpf(r, {m_bits} - e) - {1 << m_bits});\n}}}}"
        )
    return out


# float4_e2m1fn's eight magnitudes by code; a float rounds to the nearest (ties to the even
# code: the midpoints below go down at even codes, up at odd ones) and saturates at 6; NaN
# gives ml_dtypes' code: 8 (-0) for a positive NaN, 0 for a negative one.
FLOAT4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def float4_helpers() -> dict[str, str]:
    """`f4e2m1fn_f32` and `f32_f4e2m1fn`, in the conversions' template form."""
    table = ", ".join(f"{v}f" for v in FLOAT4)
    steps = []
    for code, (low, high) in enumerate(zip(FLOAT4, FLOAT4[1:], strict=False)):
        mid, tie = (low + high) / 2, "<=" if code % 2 == 0 else "<"
        steps.append(f"a {tie} {mid}f ? {code} : ")
    ladder = "".join(steps) + "7"
    return {
        "f4e2m1fn_f32": (
            f"{{q}} float hx_f4e2m1fn_f32({{u8}} b) {{{{\n"
            f"  const float v[8] = {{{{{table}}}}};\n"
            f"  return b > 7 ? -v[b & 7] : v[b & 7];  /* as ml_dtypes reads any byte */\n}}}}"
        ),
        "f32_f4e2m1fn": (
            f"{{q}} {{u8}} hx_f32_f4e2m1fn(float x) {{{{\n"
            f"  float a = fabsf(x);\n"
            f"  if (x != x) return signbit(x) ? 0 : 8;\n"
            f"  return (signbit(x) ? 8 : 0) | ({ladder});\n}}}}"
        ),
    }


def sub_byte_value(x: str, dtype: str) -> str:
    """The C int a sub-byte int `dtype` holds in the low bits of the integer expression `x`
    (sign-extended where signed): how a value reads as one, or wraps into one."""
    bits = SUB_BYTE_INTS[dtype]
    mask, sign = (1 << bits) - 1, 1 << (bits - 1)
    low = f"((unsigned){x} & {mask}u)"
    return f"((int){low})" if is_unsigned(dtype) else f"((int)({low} ^ {sign}u) - {sign})"


def sub_byte_helpers() -> dict[str, str]:
    """`<src>_<int4 ...>` for every dtype a cast converts from (the narrow floats arrive as
    float32), in the conversions' template form ({q}: the qualifier, {i8}/{u8}: the types)."""
    out = {}
    for dtype in SUB_BYTE_INTS:
        low, high = int_range(dtype)
        ctype = "{u8}" if low == 0 else "{i8}"
        for source in DTYPES:
            if source in NARROW_FLOATS:
                continue
            kind = f"{short_name(source)}_{short_name(dtype)}"
            if is_float(source):  # toward zero; 0 outside the range, NaN and inf too
                body = f"return x > {low - 1}.0 && x < {high + 1}.0 ? ({ctype})(int)x : 0;"
                arg = "double x"
            else:  # the low bits (sign-extended where signed)
                body = f"return ({ctype}){sub_byte_value('x', dtype)};"
                arg = "long long x"
            out[kind] = f"{{q}} {ctype} hx_{kind}({arg}) {{{{ {body} }}}}"
    return out
