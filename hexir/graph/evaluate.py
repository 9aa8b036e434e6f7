"""The numpy evaluator of `hexir` graphs: `evaluate(graph, inputs)`, op by op.

    outputs = evaluate(graph, [x])           # or evaluate(graph, {"x": x})
    y = evaluate_op(op, [a, b])              # one op, result of exactly op.result.type

Each op's numpy semantics is its definition's `evaluate` (`hexir.ops`; the precision rules
are in `hexir.ops.numeric`): a function of (operand arrays, attrs) -> array, whose answer
the driver casts to the op's result dtype. Floating-point exceptions are not errors: inf and
nan are values, as in the kernels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hexir.errors import HexirError
from hexir.graph.specialize import graph_symbols, specialize, symbol_sizes
from hexir.ir.dtype import numpy_dtype
from hexir.ir.graph import Graph, Op, Value
from hexir.ops import op_def

__all__ = ["evaluate", "evaluate_op", "constant_array", "bind_inputs", "input_sizes"]


# ---------------------------------------------------------------------------------------------
# Graphs


def evaluate(
    graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> list[np.ndarray]:
    """Run `graph` op by op in numpy; one fresh array per graph output, in order. A graph
    with symbolic dimensions runs at the sizes its inputs give them."""
    if graph_symbols(graph):
        graph = specialize(graph, input_sizes(graph, inputs))
    env = bind_inputs(graph, inputs)
    for op in graph.ops:
        if op.kind == "constant":
            env[op.result.name] = constant_array(graph, op)
        else:
            env[op.result.name] = evaluate_op(op, [_lookup(env, v, op) for v in op.operands])
    return [np.array(_lookup(env, v, None)) for v in graph.outputs]


def evaluate_op(op: Op, operands: Sequence[np.ndarray]) -> np.ndarray:
    """The numpy value of one non-constant op, of exactly `op.result.type`."""
    d = op_def(op.kind)
    fn = d.evaluate if d is not None else None
    if fn is None:
        raise HexirError(f"no numpy semantics for op kind {op.kind!r}: {op!r}")
    try:
        with np.errstate(all="ignore"):
            out = np.asarray(fn(list(operands), dict(op.attrs)))
            out = out.astype(numpy_dtype(op.result.type.dtype), copy=False)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise HexirError(f"cannot evaluate {op!r}: {type(e).__name__}: {e}") from e
    if out.shape != op.result.type.shape:
        raise HexirError(
            f"evaluating {op!r} gave shape {out.shape}, its type says {op.result.type.shape}"
        )
    return out


def constant_array(graph: Graph, op: Op) -> np.ndarray:
    """The data of a `hexir.constant` op, checked against its result type."""
    name = op.attr("name")
    try:
        array = graph.constant(str(name))
    except KeyError:
        raise HexirError(f"graph @{graph.name} has no data for constant @{name}: {op!r}") from None
    _check_array(array, op.result, f"constant @{name}")
    return array


def _lookup(env: dict[str, np.ndarray], value: Value, op: Op | None) -> np.ndarray:
    try:
        return env[value.name]
    except KeyError:
        where = f" in {op!r}" if op is not None else " as a graph output"
        raise HexirError(f"%{value.name} is used{where} before it is defined") from None


def bind_inputs(
    graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The graph's inputs by name, from a list in graph order or a dict by name, each checked
    for its shape and dtype (shared by the numpy evaluator and compiled modules)."""
    env = inputs_by_name(graph, inputs)
    for value in graph.inputs:
        _check_array(env[value.name], value, f"input %{value.name} of graph @{graph.name}")
    return env


def inputs_by_name(
    graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The graph's inputs by name, as numpy arrays, from a list in graph order or a dict by
    name; their shapes and dtypes unchecked."""
    names = [v.name for v in graph.inputs]
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        if missing or extra:
            raise HexirError(
                f"graph @{graph.name} takes inputs {_names(names)}; missing {_names(missing)}, "
                f"unexpected {_names(extra)}"
            )
        arrays = [inputs[n] for n in names]
    else:
        arrays = list(inputs)
        if len(arrays) != len(names):
            raise HexirError(
                f"graph @{graph.name} takes {len(names)} inputs ({_names(names)}), "
                f"got {len(arrays)}"
            )
    return {name: np.asarray(array) for name, array in zip(names, arrays, strict=True)}


def input_sizes(
    graph: Graph, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> dict[str, int]:
    """Each symbol of a graph with symbolic dimensions, sized by the inputs' shapes."""
    arrays = inputs_by_name(graph, inputs)
    return symbol_sizes(graph, {name: a.shape for name, a in arrays.items()})


def _check_array(array: np.ndarray, value: Value, what: str) -> None:
    want = numpy_dtype(value.type.dtype)
    if array.shape != value.type.shape or array.dtype != want:
        raise HexirError(
            f"{what} must be {value.type!r} (shape {value.type.shape}, numpy {want}); "
            f"got shape {array.shape}, numpy {array.dtype}"
        )


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"%{n}" for n in names) or "none"
