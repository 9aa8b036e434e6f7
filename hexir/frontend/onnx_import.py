"""ONNX import: an ONNX model (default domain) as a Hexir graph of static shapes. Nodes are
read as of opsets 13–23: an older model is converted up with onnx.version_converter, a newer
one is read as opset 23 where each of its ops means the same there or its converter
implements the newer version (`NEWER`), else refused, naming them (`op_versions`: the newest
version of each op read).

    graph = import_onnx("model.onnx")                       # or an onnx.ModelProto
    graph = import_onnx("bert.onnx", dims={"batch": 1, "sequence": 128})
    graph = import_onnx("bert.onnx", input_shapes={"input_ids": (1, 128)})

A model exported with dynamic axes has symbolic input dims (`dim_param`s such as
"sequence_length", or unnamed ones); the graph is specialized to one size of each: `dims`
binds the named ones (in every input and output that names them), `input_shapes` gives
whole input shapes (binding the names they hold, so an attention_mask of the same
[batch, sequence] follows an input_ids given by shape). The Shape -> Gather -> Concat ->
Reshape chains exporters write for dynamic axes then fold to constants.

Initializers become constants (created where first used); names are cleaned to the graph's
identifier alphabet and kept where they name a graph input, an output or a node's result.
Conversion goes on past an unsupported node (skipping the nodes that need its outputs, whose
op types and attributes are still checked), so a model with unsupported nodes fails with one
`ModelError` that lists every one of them (name, op type and what is unsupported).
The supported op types are the keys of `SUPPORTED`; gelu and rsqrt written as subgraphs
(`onnx_patterns`) import as one op.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from hexir.errors import HexirError, ModelError
from hexir.frontend.onnx_context import Context, Node, Unsupported, clean_name, hexir_dtype
from hexir.frontend.onnx_ops import SPECS, Spec
from hexir.frontend.onnx_ops_activation import ACTIVATION_SPECS
from hexir.frontend.onnx_ops_attention import ATTENTION_SPECS
from hexir.frontend.onnx_ops_compose import COMPOSED_SPECS
from hexir.frontend.onnx_ops_loss import LOSS_SPECS
from hexir.frontend.onnx_ops_quant import QUANT_SPECS
from hexir.frontend.onnx_ops_resize import RESIZE_SPECS
from hexir.frontend.onnx_ops_shape import SHAPE_SPECS
from hexir.frontend.onnx_ops_window import WINDOW_SPECS
from hexir.frontend.onnx_patterns import Match, find_matches, scalar_constants
from hexir.ir.graph import Graph, Op, Value
from hexir.ir.symbolic import SYMBOL_RE, Dim, Sym, SymbolicError, parse_dim
from hexir.ops.builder import GraphBuilder

if TYPE_CHECKING:
    import onnx

__all__ = ["import_onnx", "load_proto", "op_versions", "SUPPORTED", "OPSETS"]

# Opsets 22 and 23 change only the type constraints of the ops imported here (bfloat16 and
# the 4-bit floats), and add RMSNormalization.
OPSETS = range(13, 24)
SUPPORTED: dict[str, Spec] = {
    **SPECS,
    **ACTIVATION_SPECS,
    **SHAPE_SPECS,
    **WINDOW_SPECS,
    **COMPOSED_SPECS,
    **QUANT_SPECS,
    **RESIZE_SPECS,
    **ATTENTION_SPECS,
    **LOSS_SPECS,
}
_DOMAINS = ("", "ai.onnx")


def import_onnx(
    model: str | os.PathLike[str] | onnx.ModelProto,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    name: str | None = None,
    symbolic: bool = False,
) -> Graph:
    """The Hexir graph of `model` (a path or an onnx.ModelProto). `dims` binds symbolic dims
    by their names, `input_shapes` gives inputs' whole shapes (by ONNX name or Hexir's clean
    one): together they must fix every input's shape (module docstring), unless `symbolic`,
    which keeps each dim they leave free as a symbolic dimension; `name` names the graph."""
    proto, source = load_proto(model)
    proto, opset = _opset(proto, source)
    onnx_graph = proto.graph
    nodes = [_node(i, n) for i, n in enumerate(onnx_graph.node)]
    initializers = {t.name: t for t in onnx_graph.initializer}
    builder = GraphBuilder(clean_name(name or onnx_graph.name or "model", "model"))
    ctx = Context(builder, initializers, opset)
    bound = _inputs(ctx, onnx_graph, input_shapes or {}, dims or {}, source, symbolic)
    problems = _convert(ctx, nodes, onnx_graph)
    outputs = [_output(ctx, o.name) for o in onnx_graph.output]
    if not problems:
        problems = _check_outputs(onnx_graph, outputs, bound)
    if problems:
        raise ModelError(
            f"cannot import {source}: {len(problems)} node(s) or output(s) are not supported "
            f"by Hexir's ONNX import (default domain, opsets {OPSETS.start}-{OPSETS.stop - 1}, "
            "the op types of hexir.frontend.onnx_import.SUPPORTED); rewrite or remove them, "
            "or export the model with supported ops:",
            tuple(problems),
        )
    named = [(o.name, v) for o, v in zip(onnx_graph.output, outputs, strict=True) if v is not None]
    return _finish(builder, ctx, named)


def input_names(model: str | os.PathLike[str]) -> list[str]:
    """The names the graph `import_onnx` makes of the ONNX model at `model` gives its inputs
    (the ONNX graph's inputs without an initializer, names cleaned), in order; weights are
    not read."""
    import onnx

    path = os.fspath(model)
    try:
        graph = onnx.load(path, load_external_data=False).graph
    except Exception as e:  # protobuf's DecodeError and friends
        raise ModelError(f"{path} is not a readable ONNX model: {e}") from e
    weights = {t.name for t in graph.initializer}
    return _clean_names([v for v in graph.input if v.name not in weights])


def _clean_names(inputs: list[Any]) -> list[str]:
    """The graph inputs' names in Hexir: cleaned, and made distinct."""
    names: list[str] = []
    for v in inputs:
        name = base = clean_name(v.name, "input")
        while name in names:
            name = f"{base}_{len(names)}"
        names.append(name)
    return names


def _output(ctx: Context, name: str) -> Value | None:
    if name in ctx.initializers and name not in ctx.values:  # an initializer as an output
        return ctx.value_of(name)
    return ctx.values.get(name)


def load_proto(model: Any) -> tuple[Any, str]:
    """The ModelProto of a path or a ModelProto (its local functions inlined), and how to
    name it in messages; ModelError for a missing or unreadable file."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        proto, source = model, f"ONNX model {model.graph.name!r}"
    else:
        path = os.fspath(model)
        if not os.path.exists(path):
            raise ModelError(f"no such ONNX file: {path}")
        try:
            proto = onnx.load(path)
        except Exception as e:  # protobuf's DecodeError and friends
            raise ModelError(f"{path} is not a readable ONNX model: {e}") from e
        source = path
    if proto.functions:  # model-local functions: expand them into plain nodes
        from onnx import inliner

        proto = inliner.inline_local_functions(proto)
    return proto, source


def _opset(proto: Any, source: str) -> tuple[Any, int]:
    """(the model, the opset its nodes are read at). An opset before OPSETS is converted up with
    onnx.version_converter; one after it is read as the last of OPSETS where each of the
    model's nodes means the same there or NEWER reads its version (`_changed`; a node that
    does not is refused, named)."""
    import onnx

    versions = [o.version for o in proto.opset_import if o.domain in _DOMAINS]
    version = versions[0] if versions else 0
    first, last = OPSETS.start, OPSETS.stop - 1
    if version < first:
        try:
            converted = onnx.version_converter.convert_version(proto, first)
        except Exception as e:  # the converter raises several kinds
            raise ModelError(
                f"{source} uses ONNX opset {version}; Hexir imports opsets {first}-{last}, and "
                f"onnx.version_converter could not convert it to {first}: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from e
        return converted, first
    if version > last:
        changed = sorted(
            {_changed(n, last, version) for n in proto.graph.node if n.domain in _DOMAINS} - {""}
        )
        if changed:
            raise ModelError(
                f"{source} uses ONNX opset {version}; Hexir reads ops as defined up to opset "
                f"{last}, and these changed since: {', '.join(changed)}. Export the model at "
                f"opset {last} or lower."
            )
        return proto, last
    return proto, version


# Ops whose converters implement a definition newer than OPSETS' last: the newest version each
# reads, where its meaning changed beyond types added (which Hexir's dtype checks refuse where
# it lacks them). Attention 24-25: nonpad_kv_seqlen and windows. BitShift 28: signed ints,
# shifted right arithmetically, and amounts below 0 or of the width or more giving the sign's
# fill, as the left_shift and right_shift ops do. Cast 24, CastLike 24: round_mode, which
# applies to float8e8m0 only (no Hexir dtype); an infinity cast saturating to an 8-bit FNUZ
# float gives its largest, as it always did here and in onnx's reference. Mod 28: fmod=0 of
# floats, the floor remainder with numpy's special cases (the mod op). Range 27: stash_type,
# the float16 and bfloat16 ranges counted in float32 (or float64). ReduceLogSum 28,
# ReduceLogSumExp 28: -inf for an empty set, which their compositions give. SpaceToDepth 28:
# mode.
NEWER = {
    "Attention": 25,
    "BitShift": 28,
    "Cast": 28,
    "CastLike": 25,
    "Mod": 28,
    "Range": 27,
    "ReduceLogSum": 28,
    "ReduceLogSumExp": 28,
    "SpaceToDepth": 28,
}
# The newest opset whose op definitions, text included, the table above was checked against
# (onnx 1.23's). A later version may change an op's meaning in its text alone (Mod 28 did):
# it is refused, unless NEWER reads it.
CHECKED = 28


def op_versions(op_type: str) -> tuple[int, int] | None:
    """(the newest version of `op_type` Hexir reads, the newest the installed onnx defines);
    None where onnx does not define the op. A version after OPSETS' last is read where
    `_changed` finds that a node setting none of the attributes and giving none of the
    optional inputs added since means the same."""
    from onnx import defs, helper

    newest = defs.onnx_opset_version()
    try:
        top = defs.get_schema(op_type, newest).since_version
    except Exception:  # noqa: BLE001 - an op the installed onnx does not define
        return None
    bare, read = helper.make_node(op_type, [], []), OPSETS.stop - 1
    while read < newest and not _changed(bare, OPSETS.stop - 1, read + 1):
        read += 1
    return defs.get_schema(op_type, read).since_version, top


def _changed(node: Any, last: int, version: int) -> str:
    """'' where `node` means at opset `version` what it meant at `last`: its op's definition is
    the same, or one NEWER reads, or (up to CHECKED) differs only in types it widened (which
    Hexir's dtype checks still refuse where it lacks them), in attributes the node does not set
    and in optional inputs added after the old ones that the node does not give; else what
    changed."""
    from onnx import defs

    try:
        new = defs.get_schema(node.op_type, max_inclusive_version=version)
    except Exception:  # noqa: BLE001 - an op onnx does not know: the node check names it
        return ""
    old = _read_schema(node.op_type, last)
    if old.since_version == new.since_version or new.since_version <= NEWER.get(node.op_type, 0):
        return ""
    if new.since_version > CHECKED:
        return (
            f"{node.op_type} (version {new.since_version}, after opset {CHECKED}, the newest "
            "Hexir's import was checked against)"
        )
    set_attrs = {a.name for a in node.attribute}
    added = set(new.attributes) - set(old.attributes)
    same = (
        not (added & set_attrs)
        and set(old.attributes) <= set(new.attributes)
        and _same_inputs(old.inputs, new.inputs, node)
        and _ports(old.outputs) == _ports(new.outputs)
        and all(types <= _types(new).get(k, set()) for k, types in _types(old).items())
    )
    return (
        ""
        if same
        else f"{node.op_type} (version {new.since_version}, Hexir reads {old.since_version})"
    )


def _read_schema(op_type: str, last: int) -> Any:
    """The definition of `op_type` that its converter implements: the one of opset `last`, or
    for an op that came after it (Swish, CumProd) its first."""
    from onnx import defs

    for version in range(last, defs.onnx_opset_version() + 1):
        try:
            return defs.get_schema(op_type, max_inclusive_version=version)
        except Exception:  # noqa: BLE001, S112 - not defined yet at `version`
            continue
    raise KeyError(op_type)  # not reached: `_changed` found it defined


def _same_inputs(old: Any, new: Any, node: Any) -> bool:
    """Whether `new` is `old` followed by optional inputs only, none of which `node` gives."""
    from onnx.defs import OpSchema

    before, after = _ports(old), _ports(new)
    if before == after and before and before[-1][1] == OpSchema.FormalParameterOption.Variadic:
        return True  # the same variadic inputs (Einsum's): the node gives any number of them
    added = after[len(before) :]
    return (
        after[: len(before)] == before
        and all(option == OpSchema.FormalParameterOption.Optional for _, option in added)
        and all(not name for name in node.input[len(before) :])
    )


def _ports(params: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.option) for p in params]


def _types(schema: Any) -> dict[str, set[str]]:
    return {t.type_param_str: set(t.allowed_type_strs) for t in schema.type_constraints}


def _node(index: int, proto: Any) -> Node:
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    name = proto.name or f"#{index} -> {proto.output[0] if proto.output else ''}"
    return Node(
        index, name, proto.op_type, proto.domain, tuple(proto.input), tuple(proto.output), attrs
    )


def _inputs(
    ctx: Context,
    onnx_graph: Any,
    shapes: Mapping[str, Sequence[int]],
    dims: Mapping[str, int],
    source: str,
    symbolic: bool = False,
) -> dict[str, int]:
    """Graph inputs (those without an initializer), each of the static shape its declared
    dims, `dims` and `shapes` give (`_bind`), or with `symbolic` a symbol for each dim they
    leave free; every problem at once. The dims bound, by name."""
    real = [v for v in onnx_graph.input if v.name not in ctx.initializers]
    names = _clean_names(real)
    by_name = {n: v for v, name in zip(real, names, strict=True) for n in (v.name, name)}
    problems = [
        f"input_shapes names {n!r}, which is no input of the model"
        for n in shapes
        if n not in by_name
    ]
    given = {by_name[n].name: tuple(s) for n, s in shapes.items() if n in by_name}
    bound, more = _bind(real, given, dims)
    problems += more
    for v, name in zip(real, names, strict=True):
        try:
            dtype, shape = _input_type(v, given.get(v.name), bound, symbolic and name)
        except Unsupported as e:
            problems.append(str(e))
            continue
        ctx.values[v.name] = ctx.builder.input(name, shape, dtype)
    if problems:
        raise ModelError(
            f"cannot import {source}: Hexir compiles static shapes, one size of each dim; bind "
            "the model's symbolic dims by name with dims={name: size} (the CLI's --dim "
            "NAME=SIZE) or give whole shapes with input_shapes={input: shape} (the CLI takes "
            "them from --inputs):",
            tuple(problems),
        )
    return bound


def _declared(info: Any) -> list[int | str | None] | None:
    """An input's or output's declared dims (a size, a dim_param's name, or None for an
    unnamed symbolic dim); None where the shape is not declared at all."""
    tensor = info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim
    ]


def _bind(
    real: list[Any], given: Mapping[str, tuple[int, ...]], dims: Mapping[str, int]
) -> tuple[dict[str, int], list[str]]:
    """Each dim_param's size: from `dims`, then from the whole shapes `given` where they hold
    it; and the problems: a size that is no positive int, a given shape that disagrees with
    the declared dims, a dim_param two sources size differently, a name no input uses."""
    problems = [
        f"dims[{n!r}] = {s!r} is not a positive size" for n, s in dims.items() if not _size(s)
    ]
    bound = {n: int(s) for n, s in dims.items() if _size(s)}
    named = {d for v in real for d in (_declared(v) or ()) if isinstance(d, str)}
    unknown = sorted(set(dims) - named)
    problems += [f"dims names {n!r}, which no input of the model has" for n in unknown]
    for v in real:
        shape, declared = given.get(v.name), _declared(v)
        if shape is None or declared is None:
            continue
        if len(shape) != len(declared):
            problems.append(f"input {v.name!r} has rank {len(declared)}, given shape {shape}")
            continue
        for axis, (size, want) in enumerate(zip(shape, declared, strict=True)):
            if isinstance(want, str):
                want = bound.setdefault(want, size)
            if want is not None and want != size:
                problems.append(
                    f"input {v.name!r}: dim {axis} ({_dim_text(declared[axis])}) is {want}, "
                    f"given shape {shape}"
                )
    return bound, problems


def _size(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and value > 0


def _dim_text(dim: int | str | None) -> str:
    return "unnamed symbolic" if dim is None else repr(dim)


def _input_type(
    info: Any, shape: Sequence[int] | None, bound: Mapping[str, int], symbolic: str | bool = False
) -> tuple[str, Sequence[Dim]]:
    """The input's dtype and shape; `symbolic` (the input's clean name) makes each free dim
    a symbol: its dim_param (read as a dimension, `past + 1`, where it is one) or, unnamed,
    `<input>_<axis>`."""
    kind = info.type.WhichOneof("value")
    if kind != "tensor_type":
        what = _NOT_TENSORS.get(kind or "", "of no declared type")
        raise Unsupported(f"input {info.name!r} is {what}: Hexir's graphs hold tensors only")
    dtype = hexir_dtype(info.type.tensor_type.elem_type, f"input {info.name!r}")
    if shape is not None:
        return dtype, shape
    declared = _declared(info)
    if declared is None:
        raise Unsupported(f"input {info.name!r} declares no shape: give it in input_shapes")
    dims: list = [bound.get(d, d) if isinstance(d, str) else d for d in declared]
    if symbolic:
        dims = [_symbol(d, f"{symbolic}_{axis}") for axis, d in enumerate(dims)]
    free = [_dim_text(d) for d in dims if not isinstance(d, int | Sym)]
    if free:
        raise Unsupported(f"input {info.name!r} has symbolic dims {', '.join(free)} not bound")
    return dtype, dims


# ONNX's values that are not tensors (TypeProto's other kinds), as a refusal names them.
_NOT_TENSORS = {
    "sequence_type": "a sequence",
    "optional_type": "an optional",
    "map_type": "a map",
    "sparse_tensor_type": "a sparse tensor",
}


def _symbol(dim: int | str | None, unnamed: str) -> Dim:
    """A declared dim as a dimension: a size, or a dim_param as a symbol."""
    if isinstance(dim, int):
        return dim
    if dim is None:
        return Sym.named(_symbol_name(unnamed))
    try:
        return parse_dim(dim)
    except SymbolicError:
        return Sym.named(_symbol_name(dim))


def _symbol_name(text: str) -> str:
    name = re.sub(r"\W", "_", text)
    return name if SYMBOL_RE.fullmatch(name) else f"d_{name}"


def _uses(nodes: list[Node], onnx_graph: Any) -> Counter[str]:
    """How often each tensor is used, graph outputs included."""
    uses = Counter(t for node in nodes for t in node.inputs if t)
    uses.update(o.name for o in onnx_graph.output)
    return uses


def _convert(ctx: Context, nodes: list[Node], onnx_graph: Any) -> list[str]:
    """Convert every node; the problems of every unsupported node, in order."""
    uses = _uses(nodes, onnx_graph)
    matches = find_matches(nodes, scalar_constants(ctx.initializers, nodes), uses)
    interior = set().union(*(m.interior for m in matches.values()))
    problems: list[str] = []
    poisoned: set[str] = set()
    for node in nodes:
        if node.index in interior:  # made by its pattern's root, unless a refusal reaches it
            if any(t in poisoned for t in node.inputs):
                poisoned.update(node.outputs)
            continue
        found = _static_problems(node, uses)
        if found or any(t in poisoned for t in node.inputs):
            problems += [f"{node.label}: {p}" for p in found]
            poisoned.update(node.outputs)
            continue
        ctx.node = node
        try:
            values = _convert_node(ctx, node, matches.get(node.index))
        except _REFUSALS as e:
            problems.append(f"{node.label}: {_refusal(e)}")
            poisoned.update(node.outputs)
        else:
            # A node may name more outputs than Hexir makes (unused ones: _static_problems).
            ctx.values.update((t, v) for t, v in zip(node.outputs, values, strict=False) if t)
    ctx.node = None
    return problems


# What converting a node may raise about that node: its own refusal (Unsupported), make_op's
# checks and numpy's broadcasting (HexirError, ValueError), a damaged node (a required
# attribute missing, an input too few, an axis past the rank), a shape of absurd extents.
_REFUSALS = (
    Unsupported, HexirError, SymbolicError, ValueError, TypeError, IndexError, KeyError,
    MemoryError,
)  # fmt: skip


def _refusal(e: Exception) -> str:
    """Why a node's conversion failed, as one line of the import's problems."""
    if isinstance(e, Unsupported):
        return str(e)
    if isinstance(e, HexirError | ValueError):
        return f"Hexir cannot build it: {str(e).splitlines()[0]}"
    if isinstance(e, MemoryError):
        return f"its tensors do not fit in memory ({e})"
    return f"malformed node ({type(e).__name__}: {e})"


def _convert_node(ctx: Context, node: Node, match: Match | None) -> Sequence[Value]:
    if match is not None:
        return [ctx.op(match.kind, ctx.value_of(match.x), **match.attrs)]
    return SUPPORTED[node.op_type].convert(ctx)


def _static_problems(node: Node, uses: Mapping[str, int]) -> list[str]:
    """What makes a node unsupported whatever its inputs: its domain, op type, attributes,
    and which of its outputs are used."""
    if node.domain not in _DOMAINS:
        return [f"domain {node.domain!r} is not supported (only the default domain)"]
    spec = SUPPORTED.get(node.op_type)
    if spec is None:
        return ["op type not supported"]
    problems = []
    for key, value in node.attrs.items():
        allowed = spec.attrs.get(key, ())
        if key not in spec.attrs:
            problems.append(f"attribute {key!r} is not supported")
        elif allowed is not None and value not in allowed:
            shown = ", ".join(map(repr, allowed))
            problems.append(f"attribute {key}={value!r} is not supported (only {shown})")
    made = spec.outputs(node.attrs) if callable(spec.outputs) else spec.outputs
    if made is not None:
        for k, out in enumerate(node.outputs[made:], made):
            if out and uses.get(out):
                problems.append(f"output {k} ({out!r}) is used, and Hexir does not make it")
    return problems


def _check_outputs(
    onnx_graph: Any, outputs: list[Value | None], bound: Mapping[str, int]
) -> list[str]:
    """Each graph output exists and agrees with the shape ONNX declares, where its dims are
    sizes or dim_params the inputs bound."""
    problems = []
    for info, value in zip(onnx_graph.output, outputs, strict=True):
        if value is None:
            problems.append(f"output {info.name!r} is made by no node")
            continue
        dims = _declared(info)
        declared = (
            None if dims is None else tuple(bound.get(d) if isinstance(d, str) else d for d in dims)
        )
        if dims is not None and value.type.symbolic and len(dims) == len(value.type.shape):
            # a dim_param the inputs did not bind is checked as the symbol it names
            declared = tuple(
                _symbol(d, "") if isinstance(d, str) and b is None else b
                for d, b in zip(dims, declared, strict=True)
            )
        if declared is not None and None not in declared and declared != value.type.shape:
            problems.append(
                f"output {info.name!r} is declared {declared}, Hexir infers {value.type!r}"
            )
    return problems


def _finish(builder: GraphBuilder, ctx: Context, outputs: list[tuple[str, Value]]) -> Graph:
    """The graph without dead ops, its values named after the ONNX tensors they are."""
    graph = builder.build([v for _, v in outputs])
    live = _live_ops(graph)
    names = _names(graph, ctx, outputs, live)

    def rename(v: Value) -> Value:
        return Value(names[v.name], v.type)

    ops, constants = [], dict(graph.constants)
    kept: list[tuple[str, Any]] = []
    for op in live:
        attrs = op.attrs
        if op.kind == "constant":
            attrs = (("name", names[op.result.name]),)
            kept.append((names[op.result.name], constants[str(op.attr("name"))]))
        ops.append(
            replace(
                op, operands=tuple(map(rename, op.operands)), result=rename(op.result), attrs=attrs
            )
        )
    return Graph(
        graph.name,
        tuple(map(rename, graph.inputs)),
        tuple(ops),
        tuple(map(rename, graph.outputs)),
        tuple(kept),
    )


def _live_ops(graph: Graph) -> list[Op]:
    needed = {v.name for v in graph.outputs}
    live = []
    for op in reversed(graph.ops):
        if op.result.name in needed:
            live.append(op)
            needed.update(v.name for v in op.operands)
    return live[::-1]


def _names(
    graph: Graph, ctx: Context, outputs: list[tuple[str, Value]], live: list[Op]
) -> dict[str, str]:
    """Hexir value name -> final name: inputs keep theirs, then outputs, then every value that
    is an ONNX tensor, then helpers named after the tensor they helped make."""
    names: dict[str, str] = {v.name: v.name for v in graph.inputs}
    taken = set(names.values())

    def give(value_name: str, wanted: str) -> None:
        if value_name in names:
            return
        base, n = clean_name(wanted), 1
        final = base
        while final in taken:
            final, n = f"{base}_{n}", n + 1
        names[value_name] = final
        taken.add(final)

    for onnx_name, value in outputs:
        give(value.name, onnx_name)
    for onnx_name, value in ctx.values.items():
        give(value.name, onnx_name)
    for op in live:
        owner = ctx.owner.get(op.result.name, "")
        give(op.result.name, f"{owner}.{op.kind}" if owner else op.kind)
    return names
