"""Contractions: matmul, batch_matmul and dense (x·wᵀ), each one reduction block.

They are the anchors of fusion: a contraction's group takes its elementwise epilogues
(bias_add, activations, the residual add). Their numpy semantics sum in float64 (int64 for
ints) and round once.
"""

from __future__ import annotations

import numpy as np

from hexir.ir.graph import Op, TensorType
from hexir.ir.op_attrs import Check, dims, fail
from hexir.ir.tir import Binary, Buffer, Expr, IntImm
from hexir.ops.base import Exporter, OpDef, Pattern, multiply_adds, operand_names
from hexir.ops.compute import Kernel, floordiv
from hexir.ops.numeric import Attrs, block_axis, unblock_axis, unblock_perm, wide


def _contraction_flops(op: Op) -> int:
    """2 per multiply-add: each output element sums K products (K = the first operand's last
    axis, for all three ops)."""
    return multiply_adds(op.result.type.size * op.operands[0].type.shape[-1])


def _matmul_infer(c: Check) -> TensorType:
    block = c.integer("weight_block", minimum=1) if c.raw.get("weight_block") else 0
    a, b = c.ranks(2, 3 if block else 2)
    c.dtype_in("numeric", 0)
    dtype = c.same_dtype()
    if block and b.shape[2] != block:
        fail(f"weight_block={block} needs b of shape [N/{block}, K, {block}], b is {dims(b)}")
    k, n = matmul_weight_shape(b.shape, block)
    if a.shape[1] != k:
        fail(f"inner dimensions differ: a is {dims(a)}, b is {dims(b)}")
    return TensorType((a.shape[0], n), dtype)


# matmul's and batch_matmul's `weight_block`: b's columns (its last axis, N) in blocks of b,
# the block's index first and the place in it last: [K, N] -> [N/b, K, b], [B, K, N] ->
# [N/b, B, K, b] (each column panel contiguous, as the CPU kernels read it).


def matmul_weight_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    """A matmul's or batch_matmul's b as it is unblocked ([K, N] or [B, K, N]), from its
    shape, blocked when `block` is set."""
    return (*shape[1:-1], shape[0] * shape[-1]) if block else tuple(shape)


def block_matmul_weight(b: np.ndarray, block: int) -> np.ndarray:
    """A [.., K, N] matmul or batch_matmul operand with its columns in blocks of `block`:
    [N/b, .., K, b] (what a contraction of weight_block=b reads)."""
    return block_axis(b, b.ndim - 1, block)


def unblock_matmul_weight(b: np.ndarray) -> np.ndarray:
    """The [.., K, N] operand of a blocked one ([N/b, .., K, b])."""
    return unblock_axis(b, b.ndim - 2)


def _matmul_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    """matmul's and batch_matmul's: a blocked b (weight_block) unblocked first."""
    b = unblock_matmul_weight(xs[1]) if attrs.get("weight_block") else xs[1]
    return np.matmul(wide(xs[0]), wide(b))


def _weight_read(b: Buffer, block: int, lead: tuple[Expr, ...], n: Expr) -> Expr:
    """b at column `n` and its other indices `lead` (k, or batch and k), blocked or not."""
    if block:
        return b[(floordiv(n, block), *lead, Binary("floormod", n, IntImm(block)))]
    return b[(*lead, n)]


def _matmul_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    a, b = args
    block = int(op.attr("weight_block", 0))  # type: ignore[arg-type]

    def product(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        return a[s[0], r[0]] * _weight_read(b, block, (r[0],), s[1])

    k.reduce("matmul", out, a.shape[-1:], product)


def _matmul_export(ex: Exporter, op: Op) -> None:
    """matmul's and batch_matmul's: a blocked b back to [.., K, N] first (ONNX Runtime folds
    that at load time)."""
    names = operand_names(op)
    if op.attr("weight_block"):
        rank = len(op.operands[1].type.shape)
        shape = matmul_weight_shape(op.operands[1].type.shape, 1)
        moved = ex.node("Transpose", [names[1]], perm=unblock_perm(rank - 2, rank - 1))
        names[1] = ex.node("Reshape", [moved, ex.ints(shape, f"{op.result.name}.b")])
    ex.node("MatMul", names, op.result.name)


MATMUL = OpDef(
    "matmul",
    "a[M,K] · b[K,N] (weight_block=b: b's columns in blocks of b, innermost, [N/b, K, b])",
    ("a", "b"),
    ("weight_block",),
    infer=_matmul_infer,
    fusion=Pattern.OUT_FUSABLE,
    evaluate=_matmul_evaluate,
    lower=_matmul_lower,
    export=_matmul_export,
    flops=_contraction_flops,
)


def _batch_matmul_infer(c: Check) -> TensorType:
    block = c.integer("weight_block", minimum=1) if c.raw.get("weight_block") else 0
    a, b = c.ranks(3, 4 if block else 3)
    c.dtype_in("numeric", 0)
    dtype = c.same_dtype()
    if block and b.shape[3] != block:
        fail(f"weight_block={block} needs b of shape [N/{block}, B, K, {block}], b is {dims(b)}")
    batch, k, n = matmul_weight_shape(b.shape, block)
    if a.shape[0] != batch:
        fail(f"batch dimensions differ: a is {dims(a)}, b is {dims(b)}")
    if a.shape[2] != k:
        fail(f"inner dimensions differ: a is {dims(a)}, b is {dims(b)}")
    return TensorType((a.shape[0], a.shape[1], n), dtype)


def _batch_matmul_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    a, b = args
    block = int(op.attr("weight_block", 0))  # type: ignore[arg-type]

    def product(s: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        return a[s[0], s[1], r[0]] * _weight_read(b, block, (s[0], r[0]), s[2])

    k.reduce("batch_matmul", out, a.shape[-1:], product)


BATCH_MATMUL = OpDef(
    "batch_matmul",
    "a[B,M,K] · b[B,K,N], one matmul per batch (weight_block=b: b's columns in blocks of b, "
    "innermost, [N/b, B, K, b])",
    ("a", "b"),
    ("weight_block",),
    infer=_batch_matmul_infer,
    fusion=Pattern.OUT_FUSABLE,
    evaluate=_matmul_evaluate,
    lower=_batch_matmul_lower,
    export=_matmul_export,
    flops=_contraction_flops,
)


def _dense_infer(c: Check) -> TensorType:
    x, w = c.ranks(2, 2)
    c.dtype_in("numeric", 0)
    dtype = c.same_dtype()
    if x.shape[1] != w.shape[1]:
        fail(f"inner dimensions differ: x is {dims(x)}, w is {dims(w)} (w is [N, K])")
    return TensorType((x.shape[0], w.shape[0]), dtype)


def _dense_evaluate(xs: list[np.ndarray], attrs: Attrs) -> np.ndarray:
    return np.matmul(wide(xs[0]), wide(xs[1]).T)


def _dense_lower(k: Kernel, op: Op, args: tuple[Buffer, ...], out: Buffer) -> None:
    x, w = args
    k.reduce("dense", out, x.shape[-1:], lambda s, r: x[s[0], r[0]] * w[s[1], r[0]])


def _dense_export(ex: Exporter, op: Op) -> None:
    # Gemm(transB=1) for floats; ONNX's Gemm takes no ints, so MatMul of the transposed weight.
    names, out = operand_names(op), op.result.name
    if op.operands[0].type.dtype.startswith("float"):
        ex.node("Gemm", names, out, transB=1)
    else:
        ex.node("MatMul", [names[0], ex.node("Transpose", [names[1]], perm=[1, 0])], out)


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
)

OPS: tuple[OpDef, ...] = (MATMUL, BATCH_MATMUL, DENSE)
