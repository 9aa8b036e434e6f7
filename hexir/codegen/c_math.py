"""Vector math for the C printer: exp, log, erf, tanh, sigmoid, sqrt, rsqrt and pow on GCC
vectors of float32 lanes, emitted as `static inline` helpers only where a vectorized loop uses
them (c_vector.py), in place of a scalar loop of libm calls.

    name = printer.vector_helper("erf", "float32", 8)   # "hx_erf_f32x8", its C in the preamble

One C source serves every width (4, 8 or 16 lanes): GCC vector extensions only, no intrinsics,
so GCC lowers it to SSE, AVX2 or AVX-512. (On AVX2 a 16-lane vector's arithmetic runs in two
halves and its comparisons lane by lane: slow, with the same results, which is how the 16-lane
source is tested on an AVX2 machine. Hence no double comparisons in pow, whose double vectors
are twice the width.) No branches: every lane computes every case, and selects pick. The
scalar tail of a vectorized loop keeps libm's calls. Algorithms (coefficients from
scripts/fit_math.py, minimax fits; GCC contracts a*b + c into an FMA where the target has one):

- exp: n = round(x·log2 e) by the 1.5·2^23 trick, r = x − n·ln2 in two parts (Cody-Waite),
  |r| ≤ ln2/2, exp(r) = 1 + r + r²·P5(r); times 2^n (scale2) from exponent bits, in two
  halves, so that the last multiply overflows to inf and underflows to denormals and 0 as IEEE
  rounding does; on AVX-512 one VSCALEFPS, the same single rounding (c_vector.py). Below
  −104, where exp rounds to 0, a lane computes exp(0) and is then zeroed: an underflowing
  scale costs a microcode assist on the Intel Xeon measured, and a masked softmax (−1e9 or
  −inf logits) made one per masked element (GPT-2's 12 x 128 x 128 causal softmax 0.33 ->
  0.047 ms).
- log: x = 2^e·m with m in [√½, √2) from the bits (denormals scaled by 2^23 first),
  log1p(f) = f − f²/2 + f³·P8(f) for f = m − 1, plus e·ln2 in two parts; 0 → −inf,
  x < 0 → NaN, inf → inf.
- tanh: a + a³·P4(a²) for a = |x| < 0.625, else 1 − 2/(exp(2a) + 1), which saturates at 1;
  then x's sign (so tanh(−0) = −0).
- sigmoid: e = exp(−|x|), 1/(1 + e) for x ≥ 0 and e/(1 + e) below: no overflow, and tiny
  results keep their precision (the scalar form 1/(1 + exp(−x)) gives 0 below −88.7).
- erf: a + a·P5(a²) for a = |x| < 0.875; 1 − Q10(a − c) beyond, Q fit to erfc on [0.875, 2.25)
  (c = 1.5) and [2.25, 3.92) (c = 3); 1 from 3.919206, where erf rounds to 1; x's sign.
- sqrt: a loop over the lanes of __builtin_sqrtf, which GCC turns into one vsqrtps (with
  -fno-math-errno, which hexir always passes): exact. rsqrt: 1/sqrt(x).
- pow: exp(y·log|x|) with both in double (the float inputs widened exactly) and one rounding
  to float at the end, then C99's special cases: pow(x, ±0) = pow(1, y) = 1, pow(−1, ±inf) =
  1, NaN for x < 0 (other than −inf) with y not an integer, x's sign for odd integer y.

Largest error in float32 ulp against the double-precision function, over every float32
input, 8 lanes with FMA (scripts/check_math.py; docs/math.md has the table, with SSE and no
FMA too; tests/codegen/test_c_math.py the bounds): exp 0.99, log 0.83, tanh 1.33, sigmoid
2.83, erf 1.10, sqrt 0.5 (correctly rounded), rsqrt 1.49, pow 0.5 (over a grid of x and y).
NaN gives NaN (pow: as C99), and ±inf, ±0 and denormals give what numpy gives.

float64 lanes: exp, log and sigmoid by the same algorithms in double (exp's Taylor series to
r^13, log as fdlibm arranges the atanh series), sqrt and rsqrt; measured on 10 million random
doubles against long double numpy: exp 0.99 ulp, log 0.74, sigmoid 2.68, sqrt 0.5, rsqrt 1.49.
float64 tanh, erf and pow keep the scalar `omp simd` loop of libm calls (their polynomials
would need fits beyond double precision).
"""

from __future__ import annotations

import math
from string import Template
from typing import TYPE_CHECKING

from hexir.ir.dtype import short_name

if TYPE_CHECKING:
    from hexir.codegen.c import CPrinter

# The calls (and "pow", a Binary) with a vector form, per element type.
VECTOR_MATH: dict[str, frozenset[str]] = {
    "float32": frozenset({"exp", "log", "tanh", "sigmoid", "erf", "sqrt", "rsqrt", "pow", "round"}),
    "float64": frozenset({"exp", "log", "sigmoid", "sqrt", "rsqrt", "round"}),
}


def has_vector_form(name: str, dtype: str) -> bool:
    return name in VECTOR_MATH.get(dtype, frozenset())


def math_helper(p: CPrinter, kind: str, dtype: str, lanes: int) -> str:
    """The C of helper `kind` on `lanes` lanes of `dtype`, declaring the vector types it uses.
    Its template's fields: q (the qualifier), v (the vector type), m (ints of its width: masks
    and bits), sv (the name suffix, f32x8), lanes, fs and one (sqrtf's f, 1.0f), and the
    float64 vector of as many lanes: d, dm (its ints), dsv (its suffix)."""
    template = _TEMPLATES[kind, dtype]
    f32 = dtype == "float32"
    fields = dict(
        q=p.helper_qualifier,
        v=p.vector_type(dtype, lanes),
        m=p.vector_type("int32" if f32 else "int64", lanes) if "$m" in template else "",
        sv=f"{short_name(dtype)}x{lanes}",
        lanes=str(lanes),
        fs="f" if f32 else "",
        one="1.0f" if f32 else "1.0",
    )
    if "$d" in template:
        fields.update(
            d=p.vector_type("float64", lanes),
            dm=p.vector_type("int64", lanes),
            dsv=f"{short_name('float64')}x{lanes}",
        )
    return Template(template).substitute(fields)


def _lit(c: float, suffix: str) -> str:
    return f"{c!r}{suffix}"


def _estrin(var: str, t: str, coeffs: tuple[float, ...], vtype: str, suffix: str = "") -> str:
    """As `_horner`, by Estrin's scheme: pairs c0 + c1 t, then pairs of those times t^2, ...;
    a chain of log2(n) multiply-adds instead of n, for the long latencies of pow's helpers."""
    terms = [
        f"{_lit(coeffs[k], suffix)} + {_lit(coeffs[k + 1], suffix)} * {t}"
        if k + 1 < len(coeffs)
        else _lit(coeffs[k], suffix)
        for k in range(0, len(coeffs), 2)
    ]
    lines, power, level = [], t, 0
    while len(terms) > 1:
        level += 1
        square = f"{var}_{t}{2**level}"
        lines.append(f"  {vtype} {square} = {power} * {power};")
        terms = [
            f"({terms[k]}) + ({terms[k + 1]}) * {square}" if k + 1 < len(terms) else terms[k]
            for k in range(0, len(terms), 2)
        ]
        power = square
    lines.append(f"  {vtype} {var} = {terms[0]};")
    return "\n".join(lines) + "\n"


def _horner(var: str, t: str, coeffs: tuple[float, ...], vtype: str, suffix: str = "f") -> str:
    """Lines declaring `var` = sum coeffs[k] t^k (lowest degree first), by Horner's rule."""
    *rest, last = coeffs
    lines = [f"  {vtype} {var} = {_lit(last, suffix)} * {t}"]
    for c in reversed(rest):
        sign = "-" if c < 0 else "+"
        lines[-1] += f" {sign} {_lit(abs(c), suffix)};"
        lines.append(f"  {var} = {var} * {t}")
    lines.pop()
    return "\n".join(lines) + "\n"


# --- float32 ----------------------------------------------------------------------------------

EXP_P = (0.5, 0.16666666, 0.041666295, 0.008333497, 0.0013944649, 0.00019790352)
LOG_P = (
    0.33333313, -0.2500001, 0.20002119, -0.16667996, 0.14219552, -0.124055885, 0.11888162,
    -0.11675652, 0.06746642,
)  # fmt: skip
TANH_P = (-0.3333328, 0.13331442, -0.053739715, 0.020639088, -0.0057049873)
ERF_P = (0.12837915, -0.3761255, 0.11282455, -0.026791463, 0.0050321813, -0.0006203255)
# erfc(x) on [0.875, 2.25) in t = x - 1.5, and on [2.25, 3.92) in t = x - 3.
ERFC_NEAR = (
    0.03389485, -0.11893026, 0.17839569, -0.13875353, 0.044593748, 0.014886065, -0.019292198,
    0.0046348255, 0.0022792632, -0.0014417974, 0.00013042685,
)  # fmt: skip
ERFC_FAR = (
    2.2089653e-05, -0.00013924399, 0.00041783325, -0.00078937726, 0.0010433912, -0.0010140585,
    0.00074265455, -0.000400109, 0.00012682313, 2.6381015e-06, -1.2683269e-05,
)  # fmt: skip
# log(m) = 2 atanh(s) = 2s + s·z·(2/3 + 2z/5 + ...), z = s², |s| < 0.1716.
# pow's results are floats: 1e-12 relative in double keeps them within 0.5001 ulp.
ATANH_SERIES = tuple(2.0 / (2 * k + 3) for k in range(7))  # to z^7: 1.3e-12 relative
EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(10))  # to r^9: 7e-12 relative

_EXP = (
    "$q $v hx_exp_$sv($v x) {\n"
    "  /* exp(x) = 2^n exp(r), n = round(x log2(e)), r = x - n ln2 (hexir/codegen/c_math.py) */\n"
    "  /* exp rounds to 0 below -104: those lanes compute exp(0) and give 0, for an underflow\n"
    "     in the scaling is slow (a microcode assist on Intel Xeons); clamped above for n */\n"
    "  $m zero = x < -104.0f;\n"
    "  x = hx_min_$sv(hx_splat_$sv(89.0f), hx_select_$sv(zero, hx_splat_$sv(0.0f), x));\n"
    "  $v k = x * 1.44269504f + 12582912.0f;  /* + 1.5*2^23: rounds x*log2(e) to an integer */\n"
    "  $v fn = k - 12582912.0f;\n"
    "  $v r = x - fn * 0.693359375f;  /* exact: ln2's leading 9 bits times n */\n"
    "  r = r - fn * -2.12194440e-4f;  /* and the rest of ln2 */\n"
    + _horner("p", "r", EXP_P, "$v")
    + "  p = (r * r) * p + r + 1.0f;\n"
    "  return hx_select_$sv(zero, hx_splat_$sv(0.0f), hx_scale2_$sv(p, fn));\n"
    "}"
)

# a 2^b for b an integer in [-150, 129] (or NaN, with a NaN), rounded once: 2^b as 2^b1 2^b2,
# both normal, so that the last multiply overflows to inf and underflows to denormals and 0
# as IEEE rounding does (the masks: a NaN's b). One instruction on AVX-512 (c_vector.py).
_SCALE2 = (
    "$q $v hx_scale2_$sv($v a, $v b) {\n"
    "  $m n = ($m)(b + 12582912.0f) - 0x4B400000;  /* + 1.5*2^23: b's integer in the bits */\n"
    "  $m n1 = n >> 1, n2 = n - n1;\n"
    "  $v s1 = ($v)(((n1 + 127) & 0xFF) << 23), s2 = ($v)(((n2 + 127) & 0xFF) << 23);\n"
    "  return (a * s1) * s2;\n"
    "}"
)

_LOG = (
    "$q $v hx_log_$sv($v x) {\n"
    "  /* log(x) = e ln2 + log1p(f) for x = 2^e (1 + f) */\n"
    "  $m tiny = (($m)x & INT32_MAX) < 0x00800000;  /* |x| zero or denormal: scale by 2^23 */\n"
    "  $v a = hx_select_$sv(tiny, hx_abs_$sv(x) * 8388608.0f, hx_abs_$sv(x));\n"
    "  $m i = ($m)a - 0x3F3504F3;  /* the bits of sqrt(1/2): m = 1 + f in [sqrt(1/2), sqrt(2)) */\n"
    "  $v e = __builtin_convertvector((i >> 23) + (tiny & -23), $v);\n"
    "  $v f = ($v)((i & 0x007FFFFF) + 0x3F3504F3) - 1.0f;\n"
    "  $v z = f * f;\n"
    + _horner("p", "f", LOG_P, "$v")
    + "  $v y = (f * z) * p + e * -2.12194440e-4f - 0.5f * z;\n"
    "  y = f + y + e * 0.693359375f;\n"
    "  y = hx_select_$sv(x == INFINITY, x, y);\n"
    "  y = hx_select_$sv(x == 0.0f, hx_splat_$sv(-INFINITY), y);\n"
    "  return hx_select_$sv(x >= 0.0f, y, hx_splat_$sv(NAN));  /* x < 0 or NaN */\n"
    "}"
)

_TANH = (
    "$q $v hx_tanh_$sv($v x) {\n"
    "  /* a polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above; x's sign */\n"
    "  $v a = hx_abs_$sv(x), z = a * a;\n"
    + _horner("p", "z", TANH_P, "$v")
    + "  $v small = (a * z) * p + a;\n"
    "  $v big = 1.0f - 2.0f / (hx_exp_$sv(a + a) + 1.0f);  /* exp overflows: 1 */\n"
    "  $v r = hx_select_$sv(a < 0.625f, small, big);\n"
    "  return ($v)(($m)r | (($m)x & INT32_MIN));  /* x's sign, -0 too */\n"
    "}"
)

_SIGMOID = (
    "$q $v hx_sigmoid_$sv($v x) {\n"
    "  /* e = exp(-|x|): 1 / (1 + e) for x >= 0, e / (1 + e) below */\n"
    "  $v e = hx_exp_$sv(-hx_abs_$sv(x)), r = 1.0f / (1.0f + e);\n"
    "  return hx_select_$sv(x < 0.0f, e * r, r);\n"
    "}"
)

_ERF = (
    "$q $v hx_erf_$sv($v x) {\n"
    "  /* a + a P(a^2) below 0.875, 1 - erfc's polynomials in a - 1.5 and a - 3 above (a = |x|);\n"
    "     x's sign */\n"
    "  $v a = hx_abs_$sv(x), z = a * a, t = a - 1.5f, u = a - 3.0f;\n"
    + _horner("p", "z", ERF_P, "$v")
    + _horner("q", "t", ERFC_NEAR, "$v")
    + _horner("w", "u", ERFC_FAR, "$v")
    + "  $v big = 1.0f - hx_select_$sv(a < 2.25f, q, w);\n"
    "  big = hx_select_$sv(a >= 3.919206f, hx_splat_$sv(1.0f), big);  /* erf rounds to 1 */\n"
    "  $v r = hx_select_$sv(a < 0.875f, a * p + a, big);\n"
    "  return ($v)(($m)r | (($m)x & INT32_MIN));  /* x's sign, -0 too */\n"
    "}"
)

_SQRT = (
    "$q $v hx_sqrt_$sv($v x) {\n"
    "  /* GCC makes this loop one vector square root (vsqrtps): no vector sqrt in C */\n"
    "  for (int i = 0; i < $lanes; ++i) x[i] = __builtin_sqrt$fs(x[i]);\n"
    "  return x;\n"
    "}"
)

_RSQRT = "$q $v hx_rsqrt_$sv($v x) { return $one / hx_sqrt_$sv(x); }"

_ROUND = (
    "$q $v hx_round_$sv($v x) {\n"
    "  /* GCC makes this loop one vector rounding to nearest even (vrndscaleps, vroundps) */\n"
    "  for (int i = 0; i < $lanes; ++i) x[i] = __builtin_nearbyint$fs(x[i]);\n"
    "  return x;\n"
    "}"
)

_POW = (
    "$q $v hx_pow_$sv($v x, $v y) {\n"
    "  /* exp(y log|x|) in double, rounded once to float; then C99's special cases */\n"
    "  $v ay = hx_abs_$sv(y);\n"
    "  $d t = __builtin_convertvector(y, $d) * hx_powlog_$sv(hx_abs_$sv(x));\n"
    "  $v r = hx_powexp_$sv(t);\n"
    "  /* y an integer (every float from 2^24 on is an even one, inf too), and odd */\n"
    "  $v yc = hx_select_$sv(ay < 16777216.0f, y, hx_splat_$sv(0.0f));\n"
    "  $m yi = __builtin_convertvector(yc, $m);\n"
    "  $m integer = (__builtin_convertvector(yi, $v) == yc) & (y == y);\n"
    "  $m odd = ((yi & 1) != 0) & integer;\n"
    "  r = ($v)(($m)r ^ (odd & ($m)x & INT32_MIN));  /* x's sign for odd y: -0, -inf too */\n"
    "  $m invalid = (x < 0.0f) & (x != -INFINITY) & ~integer;\n"
    "  r = hx_select_$sv(invalid, hx_splat_$sv(NAN), r);\n"
    "  $m one = (x == 1.0f) | (y == 0.0f) | ((x == -1.0f) & (ay == INFINITY));\n"
    "  return hx_select_$sv(one, hx_splat_$sv(1.0f), r);\n"
    "}"
)

# log(a) in double for float lanes a = |x|: 2^e·m from the float bits as in hx_log, then the
# atanh series in double; 0 gives -inf, inf and NaN themselves.
_POWLOG = (
    "$q $d hx_powlog_$sv($v a) {\n"
    "  /* log(a) in double for float lanes a >= 0: 2^e m as in hx_log, then 2 atanh(s) */\n"
    "  $m tiny = ($m)a < 0x00800000;\n"
    "  $v b = hx_select_$sv(tiny, a * 8388608.0f, a);\n"
    "  $m i = ($m)b - 0x3F3504F3;\n"
    "  $d e = __builtin_convertvector((i >> 23) + (tiny & -23), $d);\n"
    "  $d m = __builtin_convertvector(($v)((i & 0x007FFFFF) + 0x3F3504F3), $d);\n"
    "  $d s = (m - 1.0) / (m + 1.0), z = s * s;\n"
    + _estrin("p", "z", ATANH_SERIES, "$d")
    + "  $d r = e * 0.6931471805599453 + ((s * z) * p + (s + s));\n"
    "  $v special = hx_select_$sv(a == 0.0f, hx_splat_$sv(-INFINITY), a);\n"
    "  $m use = (a == 0.0f) | (a == INFINITY) | (a != a);\n"
    "  return hx_select_$dsv(__builtin_convertvector(use, $dm),\n"
    "                        __builtin_convertvector(special, $d), r);\n"
    "}"
)

# exp(t) for double lanes, rounded once to float (to denormals and inf as that rounding does).
_POWEXP = (
    "$q $v hx_powexp_$sv($d t) {\n"
    "  /* exp(t) = 2^n exp(r) in double, exp(r) by its Taylor series, rounded once to float */\n"
    "  /* clamped so that n fits (NaN stays): compared as floats, as AVX2 compares 8 doubles\n"
    "     lane by lane */\n"
    "  $v tf = __builtin_convertvector(t, $v);\n"
    "  $dm lo = __builtin_convertvector(tf < -110.0f, $dm);\n"
    "  $dm hi = __builtin_convertvector(tf > 100.0f, $dm);\n"
    "  t = hx_select_$dsv(hi, hx_splat_$dsv(100.0), t);\n"
    "  t = hx_select_$dsv(lo, hx_splat_$dsv(-110.0), t);\n"
    "  $d k = t * 1.4426950408889634 + 6755399441055744.0;  /* + 1.5*2^52: round */\n"
    "  $dm n = ($dm)k - 0x4338000000000000;\n"
    "  $d fn = k - 6755399441055744.0;\n"
    "  $d r = t - fn * 0.6931471803691238 - fn * 1.9082149292705877e-10;\n"
    + _estrin("p", "r", EXP_TAYLOR, "$d")
    + "  return __builtin_convertvector(p * ($d)(((n + 1023) & 0x7FF) << 52), $v);\n"
    "}"
)

# --- float64 ----------------------------------------------------------------------------------

EXP64_P = tuple(1.0 / math.factorial(k) for k in range(2, 14))  # exp(r) = 1 + r + r^2 P(r)
LOG64_R = tuple(2.0 / (2 * k + 3) for k in range(10))  # R(z) / z, as ATANH_SERIES, to z^10

_EXP64 = (
    "$q $v hx_exp_$sv($v x) {\n"
    "  /* as hx_exp_f32: n = round(x log2(e)), r = x - n ln2 in two parts, exp(r) by its Taylor\n"
    "     series to r^13 (4e-18 relative for |r| <= ln2/2), 2^n in two halves */\n"
    "  x = hx_min_$sv(hx_splat_$sv(710.0), hx_max_$sv(hx_splat_$sv(-746.0), x));\n"
    "  $v k = x * 1.4426950408889634 + 6755399441055744.0;  /* + 1.5*2^52: round */\n"
    "  $v fn = k - 6755399441055744.0;\n"
    "  $v r = x - fn * 0.6931471803691238;  /* exact: ln2's leading 32 bits times n */\n"
    "  r = r - fn * 1.9082149292705877e-10;\n"
    + _horner("p", "r", EXP64_P, "$v", "")
    + "  p = (r * r) * p + r + 1.0;\n"
    "  return hx_scale2_$sv(p, fn);\n"
    "}"
)

_SCALE2_64 = (
    "$q $v hx_scale2_$sv($v a, $v b) {\n"
    "  $m n = ($m)(b + 6755399441055744.0) - 0x4338000000000000;  /* + 1.5*2^52 */\n"
    "  $m n1 = n >> 1, n2 = n - n1;\n"
    "  $v s1 = ($v)(((n1 + 1023) & 0x7FF) << 52), s2 = ($v)(((n2 + 1023) & 0x7FF) << 52);\n"
    "  return (a * s1) * s2;\n"
    "}"
)

_LOG64 = (
    "$q $v hx_log_$sv($v x) {\n"
    "  /* as hx_log_f32, x = 2^e (1 + f); log1p(f) = f - (h - s (h + R(s^2))) with h = f^2/2,\n"
    "     s = f / (2 + f) and R(z) = 2z/3 + 2z^2/5 + ..., as fdlibm arranges it */\n"
    "  $m tiny = (($m)x & INT64_MAX) < 0x0010000000000000;  /* zero or denormal: times 2^52 */\n"
    "  $v a = hx_select_$sv(tiny, hx_abs_$sv(x) * 4503599627370496.0, hx_abs_$sv(x));\n"
    "  $m i = ($m)a - 0x3FE6A09E667F3BCD;  /* the bits of sqrt(1/2) */\n"
    "  $m ei = (i >> 52) + (tiny & -52);\n"
    "  $v e = ($v)(ei + 0x4338000000000000) - 6755399441055744.0;  /* to double, exactly */\n"
    "  $v f = ($v)((i & 0x000FFFFFFFFFFFFF) + 0x3FE6A09E667F3BCD) - 1.0;\n"
    "  $v h = 0.5 * f * f, s = f / (2.0 + f), z = s * s;\n"
    + _horner("p", "z", LOG64_R, "$v", "")
    + "  $v y = s * (h + z * p) + e * 1.9082149292705877e-10;  /* ln2 in two parts */\n"
    "  y = e * 0.6931471803691238 - ((h - y) - f);\n"
    "  y = hx_select_$sv(x == INFINITY, x, y);\n"
    "  y = hx_select_$sv(x == 0.0, hx_splat_$sv(-INFINITY), y);\n"
    "  return hx_select_$sv(x >= 0.0, y, hx_splat_$sv(NAN));  /* x < 0 or NaN */\n"
    "}"
)

_SIGMOID64 = _SIGMOID.replace("1.0f", "1.0").replace("0.0f", "0.0")

_TEMPLATES: dict[tuple[str, str], str] = {
    ("exp", "float32"): _EXP,
    ("scale2", "float32"): _SCALE2,
    ("log", "float32"): _LOG,
    ("tanh", "float32"): _TANH,
    ("sigmoid", "float32"): _SIGMOID,
    ("erf", "float32"): _ERF,
    ("sqrt", "float32"): _SQRT,
    ("rsqrt", "float32"): _RSQRT,
    ("pow", "float32"): _POW,
    ("powlog", "float32"): _POWLOG,
    ("powexp", "float32"): _POWEXP,
    ("exp", "float64"): _EXP64,
    ("scale2", "float64"): _SCALE2_64,
    ("log", "float64"): _LOG64,
    ("sigmoid", "float64"): _SIGMOID64,
    ("sqrt", "float64"): _SQRT,
    ("rsqrt", "float64"): _RSQRT,
    ("round", "float32"): _ROUND,
    ("round", "float64"): _ROUND,
}

# The helpers each helper calls, as (kind, dtype): registered first, so declared before use.
_F32, _F64 = "float32", "float64"
MATH_NEEDS: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("exp", _F32): (("min", _F32), ("select", _F32), ("splat", _F32), ("scale2", _F32)),
    ("log", _F32): (("select", _F32), ("abs", _F32), ("splat", _F32)),
    ("tanh", _F32): (("exp", _F32), ("select", _F32), ("abs", _F32)),
    ("sigmoid", _F32): (("exp", _F32), ("select", _F32), ("abs", _F32)),
    ("erf", _F32): (("select", _F32), ("abs", _F32), ("splat", _F32)),
    ("rsqrt", _F32): (("sqrt", _F32),),
    ("rsqrt", _F64): (("sqrt", _F64),),
    ("exp", _F64): (("min", _F64), ("max", _F64), ("splat", _F64), ("scale2", _F64)),
    ("log", _F64): (("select", _F64), ("abs", _F64), ("splat", _F64)),
    ("sigmoid", _F64): (("exp", _F64), ("select", _F64), ("abs", _F64)),
    ("pow", _F32): (("powlog", _F32), ("powexp", _F32), ("abs", _F32)),
    ("powlog", _F32): (("select", _F32), ("splat", _F32), ("select", _F64)),
    ("powexp", _F32): (("select", _F64), ("splat", _F64)),
}
