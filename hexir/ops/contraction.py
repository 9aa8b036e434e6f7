"""Contractions: matmul, batch_matmul and dense (x·wᵀ), each one reduction block.

They are the anchors of fusion: a contraction's group takes its elementwise epilogues
(bias_add, activations, the residual add). Their numpy semantics sum in float64 (int64 for
ints) and round once. Operands of the same dtype give that dtype; 8-bit integer operands
(int8 or uint8, either one each: ONNX MatMulInteger's) give int32, each product widened first.
"""

from __future__ import annotations

import numpy as np

from hexir.ir.arith_eval import fold_cast
from hexir.ir.dtype import BYTE_INTS, is_float
from hexir.ir.graph import Op, TensorType
from hexir.ir.op_attrs import Check, dims, fail
from hexir.ir.tir import Binary, Buffer, Cast, Expr, IntImm
from hexir.ops.base import Exporter, OpDef, Pattern, multiply_adds, operand_names, unpositional
from hexir.ops.compute import Kernel, floordiv
from hexir.ops.numeric import Attrs, block_axis, unblock_axis, unblock_perm, wide


def _contraction_flops(op: Op) -> int:
    """2 per multiply-add: each output element sums K products (K = the first operand's last
    axis, for all three ops)."""
    return multiply_adds(op.result.type.size * op.operands[0].type.shape[-1])


def result_dtype(c: Check) -> str:
    """The operands' dtype, or int32 for 8-bit integers of either signedness, or float32 for
    bfloat16s."""
    if all(t.dtype in BYTE_INTS for t in c.types):
        return "int32"
    if all(t.dtype == "bfloat16" for t in c.types):
        return "float32"
    c.dtype_in("numeric", 0)
    return c.same_dtype()


def _matmul_infer(c: Check) -> TensorType:
    block = c.integer("weight_block", minimum=1) if c.raw.get("weight_block") else 0
    group = c.integer("weight_kgroup", minimum=1) if c.raw.get("weight_kgroup") else 0
    if group and not block:
        fail("weight_kgroup needs weight_block")
    a, b = c.ranks(2, 4 if group else 3 if block else 2)
    dtype = result_dtype(c)
    if group and b.shape[2:] != (block, group):
        fail(
            f"weight_block={block}, weight_kgroup={group} need b of shape "
            f"[N/{block}, K/{group}, {block}, {group}], b is {dims(b)}"
        )
    elif block and not group and b.shape[2] != block:
        fail(f"weight_block={block} needs b of shape [N/{block}, K, {block}], b is {dims(b)}")
    k, n = matmul_weight_shape(b.shape, block, group)
    if a.shape[1] != k:
        fail(f"inner dimensions differ: a is {dims(a)}, b is {dims(b)}")
    return TensorType((a.shape[0], n), dtype)


# matmul's and batch_matmul's `weight_block`: b's columns (its last axis, N) in blocks of b,
# the block's index first and the place in it last: [K, N] -> [N/b, K, b], [B, K, N] ->
# [N/b, B, K, b] (each column panel contiguous, as the CPU kernels read it). matmul's
# `weight_kgroup=g` (with weight_block=b) also takes K in groups of g, innermost: [N/b, K/g,
# b, g], each column's g consecutive products side by side, as a dot-product instruction
# reads them (VNNI's vpdpbusd: 4 bytes of each of 16 columns, `hexir/schedule/tensorize.py`).


def matmul_weight_shape(shape: tuple[int, ...], block: int, group: int = 0) -> tuple[int, ...]:
    """A matmul's or batch_matmul's b as it is unblocked ([K, N] or [B, K, N]), from its
    shape, blocked when `block` is set (and in K groups when `group` is)."""
    if group:
        return (shape[1] * shape[3], shape[0] * shape[2])
    return (*shape[1:-1], shape[0] * shape[-1]) if block else tuple(shape)


def group_matmul_weight(b: np.ndarray, block: int, group: int) -> np.ndarray:
    """A [K, N] matmul operand as weight_block=block, weight_kgroup=group read it:
    [N/block, K/group, block, group]."""
    k, n = b.shape
    split = b.reshape(k // group, group, n // block, block)
    return np.ascontiguousarray(split.transpose(2, 0, 3, 1))


def ungroup_matmul_weight(b: np.ndarray) -> np.ndarray:
    """The [K, N] operand of a grouped one ([N/b, K/g, b, g])."""
    nb, kg, block, group = b.shape
    return b.transpose(1, 3, 0, 2).reshape(kg * group, nb * block)


def block_matmul_weight(b: np.ndarray, block: int) -> np.ndarray:
    """A [.., K, N] matmul or batch_matmul operand with its columns in blocks of `block`:
    [N/b, .., K, b] (what a contraction of weight_block=b reads)."""
    return block_axis(b, b.ndim - 1, block)


def unblock_matmul_weight(b: np.ndarray) -> np.ndarray:
    """The [.., K, N] operand of a blocked one ([N/b, .., K, b])."""
    return unblock_axis(b, b.ndim - 2)


def _matmul_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    """matmul's and batch_matmul's: a blocked b (weight_block) unblocked first."""
    b = xs[1]
    if attrs.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    elif attrs.get("weight_kgroup"):
        b = ungroup_matmul_weight(b)
    elif attrs.get("weight_block"):
        b = unblock_matmul_weight(b)
    return np.matmul(wide(xs[0]), wide(b))


def _weight_read(b: Buffer, block: int, lead: tuple[Expr, ...], n: Expr, group: int = 0) -> Expr:
    """b at column `n` and its other indices `lead` (k, or batch and k), blocked or not."""
    if group:
        (k,) = lead
        return b[floordiv(n, block), floordiv(k, group), _mod(n, block), _mod(k, group)]
    if block:
        return b[(floordiv(n, block), *lead, _mod(n, block))]
    return b[(*lead, n)]


def _mod(x: Expr, n: int) -> Expr:
    return Binary("floormod", x, IntImm(n))


def _matmul_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    a, b = args
    block = int(op.attr("weight_block", 0))  # type: ignore[arg-type]
    group = int(op.attr("weight_kgroup", 0))  # type: ignore[arg-type]
    dt = out.dtype

    def product(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        weight = _weight_read(b, block, (r[0],), s[1], group)
        return fold_cast(dt, a[s[0], r[0]]) * fold_cast(dt, weight)

    k.reduce("matmul", out, a.shape[-1:], product)


def _matmul_export(ex: Exporter, op: Op) -> None:
    """matmul's and batch_matmul's: a blocked b back to [.., K, N] first (ONNX Runtime folds
    that at load time)."""
    names = operand_names(op)
    if op.attr("transpose_b"):
        names[1] = ex.node("Transpose", [names[1]], perm=(0, 2, 1))
    elif op.attr("weight_kgroup"):
        k, n = matmul_weight_shape(op.operands[1].type.shape, 1, 1)
        moved = ex.node("Transpose", [names[1]], perm=(1, 3, 0, 2))
        names[1] = ex.node("Reshape", [moved, ex.ints((k, n), f"{op.result.name}.b")])
    elif op.attr("weight_block"):
        rank = len(op.operands[1].type.shape)
        shape = matmul_weight_shape(op.operands[1].type.shape, 1)
        moved = ex.node("Transpose", [names[1]], perm=unblock_perm(rank - 2, rank - 1))
        names[1] = ex.node("Reshape", [moved, ex.ints(shape, f"{op.result.name}.b")])
    ex.node(_onnx_matmul(op), _float32(ex, op, names), op.result.name)


def _float32(ex: Exporter, op: Op, names: list[str]) -> list[str]:
    """The operands' names, bfloat16 ones cast to float32 first: ONNX's MatMul of bfloat16s
    gives bfloat16, Hexir's float32 (the products and sums in float32 both ways)."""
    to = ex.elem_type("float32")
    return [
        ex.node("Cast", [name], to=to) if v.type.dtype == "bfloat16" else name
        for name, v in zip(names, op.operands, strict=True)
    ]


def _onnx_matmul(op: Op) -> str:
    """MatMul, or MatMulInteger for 8-bit operands (ONNX's MatMul takes none)."""
    return "MatMulInteger" if op.operands[0].type.dtype in BYTE_INTS else "MatMul"


def _row_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    """matmul, dense, matmul_int4: positions along the rows of `a` (M) stay the result's rows;
    along K the result reads across them; the weight carries none."""
    a, *weights = axes
    if any(w is not None for w in weights):
        raise unpositional(op, "the positions run along its weight")
    if a not in (None, 0):
        raise unpositional(op, "it contracts the axis along which the positions run")
    return a


def _batch_positions(op: Op, axes: tuple[int | None, ...]) -> int | None:
    """batch_matmul: positions along the batch (both operands), a's rows (M) or b's columns
    (N) stay where they are in the result; along K it reads across them."""
    a, b = axes
    n = 1 if op.attr("transpose_b") else 2
    if op.attr("weight_block") is not None and b is not None:
        raise unpositional(op, "the positions run along its blocked weight")
    found = {0: a == 0 and b == 0, 1: a == 1 and b is None, 2: a is None and b == n}
    for axis, holds in found.items():
        if holds:
            return axis
    if a is None and b is None:
        return None
    raise unpositional(op, "it contracts, or reads across, the axis the positions run along")


MATMUL = OpDef(
    "matmul",
    "a[M,K] · b[K,N] (weight_block=b: b's columns in blocks of b, innermost, [N/b, K, b]; "
    "with weight_kgroup=g, K in groups of g too, [N/b, K/g, b, g])",
    ("a", "b"),
    ("weight_block", "weight_kgroup"),
    infer=_matmul_infer,
    fusion=Pattern.OUT_FUSABLE,
    evaluate=_matmul_evaluate,
    lower=_matmul_lower,
    export=_matmul_export,
    flops=_contraction_flops,
    positions=_row_positions,
)


def _batch_matmul_infer(c: Check) -> TensorType:
    block = c.integer("weight_block", minimum=1) if c.raw.get("weight_block") else 0
    flipped = c.flag("transpose_b", False) if c.raw.get("transpose_b") else False
    if flipped and block:
        fail("transpose_b and weight_block do not go together (a blocked b is laid out already)")
    a, b = c.ranks(3, 4 if block else 3)
    dtype = result_dtype(c)
    if block and b.shape[3] != block:
        fail(f"weight_block={block} needs b of shape [N/{block}, B, K, {block}], b is {dims(b)}")
    batch, k, n = matmul_weight_shape(b.shape, block)
    if flipped:
        n, k = k, n
    if a.shape[0] != batch:
        fail(f"batch dimensions differ: a is {dims(a)}, b is {dims(b)}")
    if a.shape[2] != k:
        fail(f"inner dimensions differ: a is {dims(a)}, b is {dims(b)}")
    return TensorType((a.shape[0], a.shape[1], n), dtype)


def _batch_matmul_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    a, b = args
    block = int(op.attr("weight_block", 0))  # type: ignore[arg-type]
    flipped = bool(op.attr("transpose_b", 0))

    def product(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        if flipped:
            weight = b[s[0], s[2], r[0]]
        else:
            weight = _weight_read(b, block, (s[0], r[0]), s[2])
        return fold_cast(out.dtype, a[s[0], s[1], r[0]]) * fold_cast(out.dtype, weight)

    k.reduce("batch_matmul", out, a.shape[-1:], product)


BATCH_MATMUL = OpDef(
    "batch_matmul",
    "a[B,M,K] · b[B,K,N], one matmul per batch (weight_block=b: b's columns in blocks of b, "
    "innermost, [N/b, B, K, b]; transpose_b: b given as [B,N,K], a transpose read in place)",
    ("a", "b"),
    ("weight_block", "transpose_b"),
    infer=_batch_matmul_infer,
    fusion=Pattern.OUT_FUSABLE,
    evaluate=_matmul_evaluate,
    lower=_batch_matmul_lower,
    export=_matmul_export,
    flops=_contraction_flops,
    positions=_batch_positions,
)


def _dense_infer(c: Check) -> TensorType:
    x, w = c.ranks(2, 2)
    dtype = result_dtype(c)
    if x.shape[1] != w.shape[1]:
        fail(f"inner dimensions differ: x is {dims(x)}, w is {dims(w)} (w is [N, K])")
    return TensorType((x.shape[0], w.shape[0]), dtype)


def _dense_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    return np.matmul(wide(xs[0]), wide(xs[1]).T)


def _dense_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    x, w = args

    def product(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        return fold_cast(out.dtype, x[s[0], r[0]]) * fold_cast(out.dtype, w[s[1], r[0]])

    k.reduce("dense", out, x.shape[-1:], product)


def _dense_export(ex: Exporter, op: Op) -> None:
    # Gemm(transB=1) for floats; ONNX's Gemm takes no ints, so MatMul of the transposed weight.
    names, out = _float32(ex, op, operand_names(op)), op.result.name
    if is_float(op.operands[0].type.dtype):
        ex.node("Gemm", names, out, transB=1)
    else:
        ex.node(_onnx_matmul(op), [names[0], ex.node("Transpose", [names[1]], perm=[1, 0])], out)


DENSE = OpDef(
    "dense",
    "x[M,K] · w[N,K]ᵀ",
    ("x", "w"),
    (),
    infer=_dense_infer,
    fusion=Pattern.OUT_FUSABLE,
    evaluate=_dense_evaluate,
    lower=_dense_lower,
    export=_dense_export,
    flops=_contraction_flops,
    positions=_row_positions,
)

# --- 4-bit weights ---------------------------------------------------------------------------
# matmul_int4's w holds a [K, N] matrix of int4 values (-8..7), two per byte along K: byte
# [k // 2, n] has row k = 2i in its low nibble and row 2i + 1 in its high one, so that a
# vector of consecutive columns reads consecutive bytes and one shift (the same for every lane)
# picks either row. Each group of `group` rows of a column shares a float32 scale.


def pack_int4(q: np.ndarray) -> np.ndarray:
    """A [K, N] array of ints in -8..7 (K even) as matmul_int4's w: uint8 [K/2, N]."""
    nibbles = q.astype(np.int16).astype(np.uint8) & 0xF
    return nibbles[0::2] | (nibbles[1::2] << 4)


def unpack_int4(w: np.ndarray) -> np.ndarray:
    """The int8 [K, N] matrix matmul_int4's w holds."""
    rows = np.empty((2 * w.shape[0], w.shape[1]), np.int8)
    rows[0::2] = ((w & 0xF) ^ 8).astype(np.int8) - 8
    rows[1::2] = ((w >> 4) ^ 8).astype(np.int8) - 8
    return rows


def int4_weight(w: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    """The float32 [K, N] weight matmul_int4 multiplies by: each int4 times its group's
    scale, rounded to float32."""
    return unpack_int4(w).astype(np.float32) * np.repeat(scale, group, axis=0)


def _matmul_int4_infer(c: Check) -> TensorType:
    group = c.integer("group", minimum=2)
    block = c.integer("weight_block", minimum=1) if c.raw.get("weight_block") else 0
    rank = 3 if block else 2
    a, w, scale = c.ranks(2, rank, rank)
    if (a.dtype, w.dtype, scale.dtype) != ("float32", "uint8", "float32"):
        fail(f"needs a float32, w uint8 and scale float32, got {a.dtype}, {w.dtype}, {scale.dtype}")
    if block and (w.shape[2] != block or scale.shape[2] != block):
        fail(f"weight_block={block} needs w and scale of shape [N/{block}, .., {block}]")
    k, n = a.shape[1], matmul_weight_shape(w.shape, block)[1]
    if group % 2 or k % group:
        fail(f"group={group} must be even and divide K={k}")
    if matmul_weight_shape(w.shape, block) != (k // 2, n) or matmul_weight_shape(
        scale.shape, block
    ) != (k // group, n):
        fail(
            f"a is {dims(a)}: w must hold [{k // 2}, N] (two rows a byte) and scale "
            f"[{k // group}, N]; w is {dims(w)}, scale {dims(scale)}"
            + (f" (in panels of {block})" if block else "")
        )
    return TensorType((a.shape[0], n), "float32")


def _matmul_int4_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    a, w, scale = xs
    if attrs.get("weight_block"):
        w, scale = unblock_matmul_weight(w), unblock_matmul_weight(scale)
    weight = int4_weight(w, scale, int(attrs["group"]))  # type: ignore[arg-type]
    return np.matmul(wide(a), wide(weight))


def _matmul_int4_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    """The reduction over K as (group, byte row in the group, nibble), each index affine: a
    byte's int4 is its value shifted left to the top of an int32 and back, arithmetically
    (sign-extended), times its group's scale, times a."""
    a, w, scale = args
    group = int(op.attr("group"))  # type: ignore[arg-type]
    block = int(op.attr("weight_block", 0))  # type: ignore[arg-type]
    rows = a.shape[1] // group

    def product(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        g, i, nibble = r
        byte = Cast("int32", _weight_read(w, block, (g * (group // 2) + i,), s[1]))
        value = Binary("shr", Binary("shl", byte, IntImm(28) - nibble * 4), IntImm(28))
        weight = Cast("float32", value) * _weight_read(scale, block, (g,), s[1])
        return a[s[0], g * group + i * 2 + nibble] * weight

    k.reduce("matmul_int4", out, (rows, group // 2, 2), product)


def _matmul_int4_export(ex: Exporter, op: Op) -> None:
    """ONNX (opset 17) has no int4: the weight unpacked by integer ops (a nibble is the byte
    mod 16 or divided by 16, made signed by ((x + 8) mod 16) - 8), interleaved back to [K, N],
    scaled by its groups' scales and multiplied; ONNX Runtime folds that into a float32
    weight when w and scale are constants."""
    a, w, scale = operand_names(op)
    group = int(op.attr("group"))  # type: ignore[arg-type]
    k = op.operands[0].type.shape[1]
    n = op.result.type.shape[1]
    base = op.result.name
    if op.attr("weight_block"):  # panels [N/b, R, b] back to [R, N]
        w = _unpanel(ex, w, (k // 2, n), base)
        scale = _unpanel(ex, scale, (k // group, n), base)
    wide_w = ex.node("Cast", [w], to=ex.elem_type("int32"))
    sixteen, eight = ex.const(np.int32(16), f"{base}.16"), ex.const(np.int32(8), f"{base}.8")
    halves = []
    for nibble in (ex.node("Mod", [wide_w, sixteen]), ex.node("Div", [wide_w, sixteen])):
        signed = ex.node("Sub", [ex.node("Mod", [ex.node("Add", [nibble, eight]), sixteen]), eight])
        halves.append(ex.node("Unsqueeze", [signed, ex.ints((1,), f"{base}.axis")]))
    rows = ex.node("Reshape", [ex.node("Concat", halves, axis=1), ex.ints((k, n), f"{base}.kn")])
    grouped = ex.node("Unsqueeze", [scale, ex.ints((1,), f"{base}.axis")])
    spread = ex.node("Expand", [grouped, ex.ints((k // group, group, n), f"{base}.expand")])
    scales = ex.node("Reshape", [spread, ex.ints((k, n), f"{base}.kn")])
    weight = ex.node("Mul", [ex.node("Cast", [rows], to=ex.elem_type("float32")), scales])
    ex.node("MatMul", [a, weight], op.result.name)


def _unpanel(ex: Exporter, name: str, shape: tuple[int, int], base: str) -> str:
    moved = ex.node("Transpose", [name], perm=(1, 0, 2))
    return ex.node("Reshape", [moved, ex.ints(shape, f"{base}.rows")])


MATMUL_INT4 = OpDef(
    "matmul_int4",
    "a[M,K] · (int4 w[K,N] × scale[K/group,N]): w packed two rows a byte, [K/2,N] uint8 (row "
    "2i in byte i's low nibble, 2i+1 in its high one), each `group` rows of a column sharing "
    "a float32 scale (weight_block=b: w and scale in column panels, [N/b, K/2, b] and "
    "[N/b, K/group, b])",
    ("a", "w", "scale"),
    ("group", "weight_block"),
    infer=_matmul_int4_infer,
    fusion=Pattern.OUT_FUSABLE,
    evaluate=_matmul_int4_evaluate,
    lower=_matmul_int4_lower,
    export=_matmul_int4_export,
    flops=_contraction_flops,
    positions=_row_positions,
)


OPS: tuple[OpDef, ...] = (MATMUL, BATCH_MATMUL, DENSE, MATMUL_INT4)
