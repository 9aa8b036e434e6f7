"""A graph with symbolic dimensions made concrete: each symbol's size read from the shapes of
the inputs it is run on, then every op's type inferred again at those sizes.

    sizes = symbol_sizes(graph, {"x": (1, 17, 768)})      # {"seq": 17}
    concrete = specialize(graph, sizes)                     # tensor<1x17x768xf32>, ...

Every op is rebuilt with `make_op` from its operands and its (normalized) attributes, as the
parser rebuilds a printed graph, a symbolic dimension in an attribute (a reshape's shape, an
arange's bounds) taken at the given sizes; so a size at which an op does not fit (a reshape
that no longer divides) is that op's TypeInferenceError. Constants keep their data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hexir.errors import TypeInferenceError
from hexir.ir.graph import Graph, Op, TensorType, Value
from hexir.ir.symbolic import Sym, bind_sizes, shape_at
from hexir.ops import make_op

__all__ = ["graph_symbols", "require_sizes", "specialize", "symbol_sizes"]


def graph_symbols(graph: Graph) -> frozenset[str]:
    """The symbols the graph's inputs name (every symbol elsewhere derives from them)."""
    return frozenset(
        name for v in graph.inputs for d in v.type.shape if isinstance(d, Sym) for name in d.symbols
    )


def require_sizes(graph: Graph, what: str) -> None:
    """TypeInferenceError where `graph` has symbolic dimensions: `what` (lowering, tuning)
    works at fixed sizes, which `specialize` gives."""
    symbols = sorted(graph_symbols(graph))
    if symbols:
        sizes = ", ".join(f"'{s}': ..." for s in symbols)
        raise TypeInferenceError(
            f"graph @{graph.name} has symbolic dimensions ({', '.join(symbols)}) and {what} "
            f"works at fixed sizes: specialize it first, hexir.specialize(graph, {{{sizes}}})"
        )


def symbol_sizes(graph: Graph, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Each symbol's size from the inputs' shapes (by input name): a dimension that is a
    symbol alone binds it, then every dimension must equal what its symbols give. Raises
    TypeInferenceError listing every input that does not fit."""
    declared = [(f"%{v.name}", v.type.shape) for v in graph.inputs]
    sizes, problems = bind_sizes(declared, [tuple(shapes[v.name]) for v in graph.inputs])
    if problems:
        raise TypeInferenceError(
            f"the inputs do not fit graph @{graph.name}: " + "; ".join(dict.fromkeys(problems))
        )
    return sizes


def _concrete_attr(value: object, sizes: Mapping[str, int]) -> object:
    """An attribute with each symbolic dimension in it (reshape's shape, arange's bounds) at
    the given sizes."""
    if isinstance(value, Sym):
        return value.evaluate(sizes)
    if isinstance(value, tuple) and any(isinstance(v, Sym) for v in value):
        return tuple(v.evaluate(sizes) if isinstance(v, Sym) else v for v in value)
    return value


def specialize(graph: Graph, sizes: Mapping[str, int]) -> Graph:
    """`graph` at the given size of each of its symbols (all of them: a symbol left without a
    size is a TypeInferenceError)."""
    missing = sorted(graph_symbols(graph) - set(sizes))
    if missing:
        raise TypeInferenceError(f"graph @{graph.name}: no size given for {', '.join(missing)}")
    values: dict[str, Value] = {}

    def concrete(v: Value) -> Value:
        shape = shape_at(v.type.shape, sizes)
        return Value(v.name, TensorType(shape, v.type.dtype))

    inputs = tuple(concrete(v) for v in graph.inputs)
    values.update((v.name, v) for v in inputs)
    ops: list[Op] = []
    for op in graph.ops:
        if op.kind == "constant":
            new = op
        else:
            operands = [values[v.name] for v in op.operands]
            attrs = {k: _concrete_attr(a, sizes) for k, a in op.attrs}
            new = make_op(op.name, operands, attrs, op.result.name, op.placement)
        values[new.result.name] = new.result
        ops.append(new)
    outputs = tuple(values[v.name] for v in graph.outputs)
    return Graph(graph.name, inputs, tuple(ops), outputs, graph.constants)
