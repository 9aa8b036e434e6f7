"""The element types of both dialects: their names, short text forms and numpy types."""

from __future__ import annotations

import numpy as np

# name -> (short text form, numpy dtype, C type). bfloat16's numpy type is ml_dtypes' (onnx's
# own dependency), imported on first use: it takes half a second, which every `hexir` command
# would pay. C stores bfloat16 as its 16 bits and computes it in float (codegen/c_narrow.py).
_TABLE: dict[str, tuple[str, type | None, str]] = {
    "float32": ("f32", np.float32, "float"),
    "float64": ("f64", np.float64, "double"),
    "float16": ("f16", np.float16, "_Float16"),
    "bfloat16": ("bf16", None, "uint16_t"),
    # 8-bit floats (ml_dtypes' names; E exponent and M mantissa bits, fn: finite, no inf,
    # uz: no negative zero, its code the one NaN): stored as their bits, computed in float.
    "float8_e4m3fn": ("f8e4m3fn", None, "uint8_t"),
    "float8_e4m3fnuz": ("f8e4m3fnuz", None, "uint8_t"),
    "float8_e5m2": ("f8e5m2", None, "uint8_t"),
    "float8_e5m2fnuz": ("f8e5m2fnuz", None, "uint8_t"),
    # 4-bit float (E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), one per byte.
    "float4_e2m1fn": ("f4e2m1fn", None, "uint8_t"),
    # Sub-byte integers (ml_dtypes' names), one per byte as numpy holds them: they only move
    # and convert (hexir.ops.make_op refuses arithmetic on them); the C type holds the value.
    "int4": ("i4", None, "int8_t"),
    "uint4": ("u4", None, "uint8_t"),
    "int2": ("i2", None, "int8_t"),
    "uint2": ("u2", None, "uint8_t"),
    "int8": ("i8", np.int8, "int8_t"),
    "int16": ("i16", np.int16, "int16_t"),
    "int32": ("i32", np.int32, "int32_t"),
    "int64": ("i64", np.int64, "int64_t"),
    "uint8": ("u8", np.uint8, "uint8_t"),
    "uint16": ("u16", np.uint16, "uint16_t"),
    "uint32": ("u32", np.uint32, "uint32_t"),
    "uint64": ("u64", np.uint64, "uint64_t"),
    "bool": ("i1", np.bool_, "bool"),
}
DTYPES: tuple[str, ...] = tuple(_TABLE)
BYTE_INTS = ("int8", "uint8")  # 8-bit operands contract into int32 (VNNI's, MatMulInteger's)
SUB_BYTE_INTS = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2}  # name -> bits
_BY_SHORT = {short: name for name, (short, _, _) in _TABLE.items()}


def check_dtype(dtype: str) -> str:
    """Return the canonical dtype name for a name or short form; raise ValueError otherwise."""
    if dtype in _TABLE:
        return dtype
    if dtype in _BY_SHORT:
        return _BY_SHORT[dtype]
    name = np.dtype(dtype).name if _is_numpy_dtype(dtype) else None
    if name in _TABLE:
        return name
    raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")


def _is_numpy_dtype(dtype: object) -> bool:
    try:
        np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        return False
    return True


def short_name(dtype: str) -> str:
    return _TABLE[dtype][0]


def from_short(short: str) -> str:
    return _BY_SHORT[short]


def numpy_dtype(dtype: str) -> np.dtype:
    scalar = _TABLE[dtype][1]
    if scalar is None:  # bfloat16, the 8-bit floats, the sub-byte ints
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(scalar)


# The floats kept in a byte each: the 8-bit ones and float4_e2m1fn (its code in the low four
# bits, as ml_dtypes holds it), converted one element at a time (hexir/codegen/c_narrow.py).
BYTE_FLOATS = (
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float4_e2m1fn",
)
# The float dtypes numpy keeps as ml_dtypes' (kind "V" there, not "f").
ML_FLOATS = ("bfloat16", *BYTE_FLOATS)


def numpy_is_float(dtype: np.dtype) -> bool:
    """Whether a numpy dtype holds floats: numpy's own or ml_dtypes'."""
    return dtype.kind == "f" or dtype.name in ML_FLOATS


def c_type(dtype: str) -> str:
    return _TABLE[dtype][2]


def is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype == "bfloat16"


def is_int(dtype: str) -> bool:
    """Signed or unsigned integers (not bool)."""
    return dtype.startswith(("int", "uint"))


def is_unsigned(dtype: str) -> bool:
    return dtype.startswith("uint")


def is_index_int(dtype: str) -> bool:
    """int32 and int64: the integers whose arithmetic the simplifier treats as exact (loop
    and index arithmetic); narrower and unsigned ones wrap, and are left as written."""
    return dtype in ("int32", "int64")


def int_bits(dtype: str) -> int:
    """The bits of the integer `dtype`: 8 per byte, or a sub-byte int's 4 or 2."""
    return SUB_BYTE_INTS.get(dtype) or 8 * itemsize(dtype)


def int_range(dtype: str) -> tuple[int, int]:
    """The smallest and largest value of the integer `dtype` (np.iinfo's, for sub-byte ints
    too)."""
    bits = int_bits(dtype)
    return (
        (0, (1 << bits) - 1) if is_unsigned(dtype) else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    )


def wrap_int(value: int, dtype: str) -> int:
    """`value` wrapped into the integer `dtype` (two's complement), as a C cast does."""
    bits = int_bits(dtype)
    value %= 1 << bits
    return value - (1 << bits) if not is_unsigned(dtype) and value >> (bits - 1) else value


def random_array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Fresh random values of `dtype`, never zeros: floats in [0.5, 1.5), ints in [1, 10),
    random bools (a model's inputs in `hexir run`, and where a tune times a model)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if is_int(dtype):
        return rng.integers(1, 10, size=shape).astype(numpy_dtype(dtype))
    return rng.uniform(0.5, 1.5, size=shape).astype(numpy_dtype(dtype))


def itemsize(dtype: str) -> int:
    return numpy_dtype(dtype).itemsize
