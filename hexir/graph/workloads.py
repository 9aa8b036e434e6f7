"""`hexir.workload(name, **shape)`: the unscheduled PrimFunc of a named computation.

workload("matmul", M=1024, N=1024, K=1024)            # params A, B, C
workload("dense", M=64, N=256, K=784, activation="relu")
workload("relu", shape=(4, 8))                        # any op of docs/ops.md
workload("add", shapes=[(4, 8), (8,)])
workload("reduce_max", shape=(4, 8), axes=(1,), keepdims=True)
workload("cast", shape=(4,), attrs={"dtype": "int32"})
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

from hexir.errors import HexirError
from hexir.graph.lower import lower, lowered, lowered_kinds
from hexir.ir.dtype import check_dtype
from hexir.ir.graph import Value
from hexir.ir.tir import PrimFunc
from hexir.ops import indexing, op_def
from hexir.ops.builder import GraphBuilder


def _finish(b: GraphBuilder, output: Value, output_name: str) -> PrimFunc:
    """Lower the builder's graph; the params are named after its inputs, then `output_name`."""
    return lower(b.build(output), b.name, [v.name for v in b.inputs] + [output_name])


def _matmul(M: int, N: int, K: int, *, dtype: str) -> PrimFunc:
    b = GraphBuilder("matmul")
    y = b.matmul(b.input("A", (M, K), dtype), b.input("B", (K, N), dtype))
    return _finish(b, y, "C")


def _batch_matmul(B: int, M: int, N: int, K: int, *, dtype: str) -> PrimFunc:
    b = GraphBuilder("batch_matmul")
    y = b.batch_matmul(b.input("A", (B, M, K), dtype), b.input("B", (B, K, N), dtype))
    return _finish(b, y, "C")


def _dense(
    M: int,
    N: int,
    K: int,
    bias: bool = True,
    activation: str | None = None,
    approximate: str = "none",
    *,
    dtype: str,
) -> PrimFunc:
    """Y = act(X[M,K] · W[N,K]ᵀ + bias[N]): blocks dense, bias_add, relu | gelu."""
    if activation not in (None, "relu", "gelu"):
        raise HexirError(
            f'workload dense: activation must be None, "relu" or "gelu", not {activation!r}'
        )
    b = GraphBuilder("dense")
    y = b.dense(b.input("X", (M, K), dtype), b.input("W", (N, K), dtype))
    if bias:
        y = b.bias_add(y, b.input("bias", (N,), dtype), axis=1)
    if activation == "relu":
        y = b.relu(y)
    elif activation == "gelu":
        y = b.gelu(y, approximate=approximate)
    return _finish(b, y, "Y")


def _conv2d(
    N: int,
    C: int,
    H: int,
    W: int,
    K: int,
    R: int,
    S: int,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
    *,
    dtype: str,
) -> PrimFunc:
    """NCHW input X, KCRS weights W (C/groups input channels per filter), output Y."""
    if not isinstance(groups, int) or groups < 1 or C % groups:
        raise HexirError(f"workload conv2d: groups={groups!r} must be >= 1 and divide C={C}")
    b = GraphBuilder("conv2d")
    x, w = b.input("X", (N, C, H, W), dtype), b.input("W", (K, C // groups, R, S), dtype)
    return _finish(b, b.conv2d(x, w, stride, padding, dilation, groups), "Y")


def _softmax(M: int, N: int, *, dtype: str) -> PrimFunc:
    b = GraphBuilder("softmax")
    return _finish(b, b.softmax(b.input("X", (M, N), dtype), axis=1), "Y")


def _log_softmax(M: int, N: int, *, dtype: str) -> PrimFunc:
    b = GraphBuilder("log_softmax")
    return _finish(b, b.log_softmax(b.input("X", (M, N), dtype), axis=1), "Y")


def _layer_norm(M: int, N: int, eps: float = 1e-5, *, dtype: str) -> PrimFunc:
    b = GraphBuilder("layer_norm")
    x = b.input("X", (M, N), dtype)
    gamma, beta = b.input("gamma", (N,), dtype), b.input("beta", (N,), dtype)
    return _finish(b, b.layer_norm(x, gamma, beta, axis=1, epsilon=eps), "Y")


def _rms_norm(M: int, N: int, eps: float = 1e-5, *, dtype: str) -> PrimFunc:
    b = GraphBuilder("rms_norm")
    x, scale = b.input("X", (M, N), dtype), b.input("scale", (N,), dtype)
    return _finish(b, b.rms_norm(x, scale, axis=1, epsilon=eps), "Y")


def _reduce_sum(M: int, N: int, *, dtype: str) -> PrimFunc:
    b = GraphBuilder("reduce_sum")
    return _finish(b, b.reduce_sum(b.input("X", (M, N), dtype), axes=(1,)), "Y")


# The named workloads of DESIGN.md §9: name -> builder (keywords: its signature).
WORKLOADS: dict[str, Callable[..., PrimFunc]] = {
    "matmul": _matmul,
    "batch_matmul": _batch_matmul,
    "dense": _dense,
    "conv2d": _conv2d,
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "reduce_sum": _reduce_sum,
}
_SHAPE_KEYWORDS = set("MNKBCHWRS")


def workload(name: str, dtype: str = "float32", **shape: object) -> PrimFunc:
    """The unscheduled PrimFunc of workload `name`; its outputs are the last params.

    The named workloads and their keywords (required unless a default is shown):

    - matmul(M, N, K): C[M,N] = A[M,K] · B[K,N]
    - batch_matmul(B, M, N, K): C[b] = A[b] · B[b]
    - dense(M, N, K, bias=True, activation=None | "relu" | "gelu", approximate="none" | "tanh"):
      Y = act(X[M,K] · W[N,K]ᵀ + bias[N]), one PrimFunc
    - conv2d(N, C, H, W, K, R, S, stride=1, padding=0, dilation=1, groups=1): X[N,C,H,W],
      W[K,C/groups,R,S] -> Y
    - softmax(M, N), log_softmax(M, N), layer_norm(M, N, eps=1e-5) (params X, gamma, beta, Y),
      rms_norm(M, N, eps=1e-5) (params X, scale, Y), reduce_sum(M, N)

    Any op of docs/ops.md also lowers alone, given its operand shapes: `shape=(4, 8)` for one
    operand, `shapes=[(4, 8), (8,)]` for several; other keywords are the op's attributes
    (`attrs={...}` for one named like a keyword here, e.g. cast's `dtype`). Operands take
    `dtype` (where's condition is bool, gathers' and scatters' indices int64, paged_attention's
    table and lengths int32); params are
    `in0, in1, ..., out0`. `shape`/`shapes` select this form for the names above too.
    """
    try:
        dtype = check_dtype(dtype)
    except (ValueError, TypeError) as e:
        raise HexirError(f"workload {name!r}: {e}") from None
    if "shape" in shape or "shapes" in shape:
        return _op_workload(name, dtype, shape)
    builder = WORKLOADS.get(name)
    if builder is None:
        raise HexirError(
            f"unknown workload {name!r}; the workloads are {', '.join(WORKLOADS)}, and any op "
            f"of docs/ops.md given shape= or shapes=: {', '.join(lowered_kinds())}"
        )
    _check_keywords(name, builder, shape)
    return builder(**shape, dtype=dtype)


def _check_keywords(name: str, builder: Callable[..., PrimFunc], given: Mapping) -> None:
    params = [p for p in inspect.signature(builder).parameters.values() if p.name != "dtype"]
    listed = ", ".join(
        p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params
    )
    unknown = sorted(set(given) - {p.name for p in params})
    missing = [p.name for p in params if p.default is p.empty and p.name not in given]
    if unknown or missing:
        what = f"unknown keyword(s) {', '.join(unknown)}" if unknown else ""
        what += ("; " if unknown and missing else "") + (
            f"missing keyword(s) {', '.join(missing)}" if missing else ""
        )
        raise HexirError(f"workload {name!r}: {what}; it takes {listed} (and dtype)")
    for key, value in given.items():
        if key in _SHAPE_KEYWORDS and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise HexirError(f"workload {name!r}: {key} must be a positive int, got {value!r}")


def _operand_dtype(kind: str, n: int, dtype: str) -> str:
    """`dtype`, but where's condition is bool, the indices of the runtime-index ops
    (`hexir.ops.indexing`, operand 1) int64, matmul_int4's packed weight uint8 and
    paged_attention's block table and lengths int32."""
    if kind == "where" and n == 0:
        return "bool"
    if kind == "matmul_int4" and n == 1:
        return "uint8"
    if kind == "paged_attention" and n in (3, 4):  # the block table and the lengths
        return "int32"
    return "int64" if n == 1 and op_def(kind) in indexing.OPS else dtype


def _op_workload(kind: str, dtype: str, kwargs: dict[str, object]) -> PrimFunc:
    if not lowered(kind):
        raise HexirError(f"unknown op {kind!r}; the ops are {', '.join(lowered_kinds())}")
    attrs = dict(kwargs)
    shapes = [attrs.pop("shape")] if "shape" in attrs else list(attrs.pop("shapes"))  # type: ignore[call-overload]
    if "shape" in attrs or "shapes" in attrs:
        raise HexirError(f"workload {kind!r}: give shape= or shapes=, not both")
    attrs.update(attrs.pop("attrs", None) or {})  # type: ignore[call-overload]
    b = GraphBuilder(kind)
    operands = [
        b.input(f"in{i}", shape, _operand_dtype(kind, i, dtype))  # type: ignore[arg-type]
        for i, shape in enumerate(shapes)
    ]
    return _finish(b, b.op(kind, *operands, **attrs), "out0")  # type: ignore[arg-type]
