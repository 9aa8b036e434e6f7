"""The text form of the `hexir` dialect: print a graph (parsed back by `hexir.ops.parse`).

    hexir.graph @mlp(%x: tensor<64x784xf32>) -> tensor<64x10xf32> {
      %w0 = hexir.constant @w0 : tensor<784x256xf32>
      %0 = hexir.matmul %x, %w0 {placement = "cpu"} : tensor<64x256xf32>
      %s = hexir.constant dense<[1.0, 2.0]> : tensor<2xf32>
      %1 = hexir.reduce_sum %0 {axes = (1,), keepdims = false, placement = "cpu"} : tensor<64xf32>
      hexir.return %1
    }

The rules (`parse_graph(print_graph(g), constants=...) == g` for every graph; the parser,
which checks each op against its definition, is `hexir.ops.graph_parser`):

- Types: `tensor<64x784xf32>`; rank 0 is `tensor<f32>`; a zero extent prints as `0`.
  Element types by their short names: f16, f32, f64, i32, i64, i1 (bool).
- Several outputs: `-> (tensor<..>, tensor<..>)` and `hexir.return %a, %b`; none: `-> ()` and
  `hexir.return`.
- An op: `%result = hexir.<op> %a, %b {attrs} : <result type>`. The attribute dict holds the
  normalized attributes (docs/ops.md) and `placement`, sorted by key, and is always printed.
  Values: ints `3`; floats by `repr` (`1e-05`, `0.0`, `inf`, `-inf`, `nan`); bools
  `true`/`false`; strings JSON-quoted; tuples of ints `(1, 2)`, `(3,)`, `()`. Where an
  attribute is a dimension (reshape's shape, arange's bounds), a symbolic one prints as in a
  type: `{seq}`, `(1, {seq}, {past + seq})`.
- A constant: `%c = hexir.constant <data> : <type>`, its attribute dict printed only when its
  placement is not "cpu". The data of up to 16 elements is inline: `dense<[[1.0, 2.0], ...]>`
  with brackets nested as the shape (rank 0: `dense<1.5>`), floats in the shortest form that
  reads back to the same value of their dtype, ints in decimal, bools `true`/`false`. A
  constant named like its result value prints `dense<..>` alone; otherwise `@name dense<..>`.
  Larger data prints as `@name`, and `parse_graph` takes it from `constants={name: array}`.
- Graph.constants are kept in the order of the constant ops; data that no op uses is not
  printed and so does not survive a round trip.
- The parser also accepts `// comments`, any whitespace between tokens, attributes in any
  order, and an op without an attribute dict (placement "cpu", every attribute defaulted).
"""

from __future__ import annotations

import json

import numpy as np

from hexir.ir.dtype import is_float, short_name
from hexir.ir.graph import Graph, Op, TensorType, Value
from hexir.ir.symbolic import Sym, format_dim
from hexir.ir.tir import Annotations

INLINE_LIMIT = 16  # constants of at most this many elements print inline


def print_tensor_type(t: TensorType) -> str:
    return f"tensor<{''.join(f'{format_dim(d)}x' for d in t.shape)}{short_name(t.dtype)}>"


def format_attr_value(value: object) -> str:
    """One attribute value in the text form; TypeError for a value the text cannot hold."""
    match value:
        case bool():
            return "true" if value else "false"
        case int():
            return str(value)
        case float():
            return repr(value)
        case str():
            return json.dumps(value)
        case Sym():
            return format_dim(value)
        case tuple() if all(isinstance(v, int | Sym) and not isinstance(v, bool) for v in value):
            inner = ", ".join(map(format_dim, value))
            return f"({inner},)" if len(value) == 1 else f"({inner})"
    raise TypeError(f"no text form for the attribute value {value!r}")


def print_attrs(attrs: Annotations, placement: str) -> str:
    """The attribute dict: `attrs` and `placement`, sorted by key."""
    items = sorted((*attrs, ("placement", placement)))
    return "{" + ", ".join(f"{k} = {format_attr_value(v)}" for k, v in items) + "}"


def print_op(op: Op, data: np.ndarray | None = None) -> str:
    """One op; a constant's `data`, when given and small, prints inline."""
    result = f"%{op.result.name} = {op.name}"
    type_text = print_tensor_type(op.result.type)
    if op.name == "hexir.constant":
        return f"{result} {_constant_body(op, data)} : {type_text}"
    operands = "".join(f" %{v.name}," for v in op.operands).rstrip(",")  # none: arange
    return f"{result}{operands} {print_attrs(op.attrs, op.placement)} : {type_text}"


def _constant_body(op: Op, data: np.ndarray | None) -> str:
    name = op.attr("name")
    if data is None or data.size > INLINE_LIMIT:
        parts = [f"@{name}"]
    else:
        parts = [] if name == op.result.name else [f"@{name}"]
        # ConstantData stores a rank-0 array as shape (1,); the op's type has the true shape
        shaped = data.reshape(op.result.type.shape)
        parts.append(f"dense<{print_dense(shaped, op.result.type.dtype)}>")
    if op.placement != "cpu":
        parts.append(print_attrs((), op.placement))
    return " ".join(parts)


def print_dense(data: np.ndarray, dtype: str) -> str:
    """The elements of `data`, brackets nested as its shape."""
    if data.ndim == 0:
        return _element(data[()], dtype)
    return "[" + ", ".join(print_dense(sub, dtype) for sub in data) + "]"


def _element(x: object, dtype: str) -> str:
    if dtype == "bool":
        return "true" if x else "false"
    if is_float(dtype):
        # numpy prints the shortest digits that read back to the same value of x's own dtype
        return str(x)
    return str(int(x))  # type: ignore[call-overload]


def _print_types(values: tuple[Value, ...]) -> str:
    types = [print_tensor_type(v.type) for v in values]
    return types[0] if len(types) == 1 else f"({', '.join(types)})"


def print_graph(graph: Graph) -> str:
    args = ", ".join(f"%{v.name}: {print_tensor_type(v.type)}" for v in graph.inputs)
    lines = [f"hexir.graph @{graph.name}({args}) -> {_print_types(graph.outputs)} {{"]
    data = dict(graph.constants)
    for op in graph.ops:
        blob = data.get(str(op.attr("name"))) if op.name == "hexir.constant" else None
        lines.append("  " + print_op(op, blob.array if blob is not None else None))
    returned = ", ".join(f"%{v.name}" for v in graph.outputs)
    lines.append(f"  hexir.return {returned}".rstrip())
    lines.append("}")
    return "\n".join(lines)
