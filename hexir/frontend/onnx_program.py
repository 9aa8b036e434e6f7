"""ONNX models with `If` and `Loop`: imported as a program (hexir/runtime/vm.py) whose
straight-line stretches are graphs (`import_onnx` of each stretch) and whose If and Loop
nodes are program steps, their branches and bodies programs of their own.

    program = import_program("model.onnx")        # or an onnx.ModelProto
    outputs = program.compile("cpu").run({"x": x, "n": np.array(5)})

A stretch's inputs are the tensors it reads that something before it defines (the model's
inputs, an earlier stretch's or step's outputs, or, in a branch or body, the enclosing
graph's tensors), its outputs the tensors it defines that anything after it reads; their
types come from ONNX's shape inference (`onnx.shape_inference`), and a stretch whose inputs
it leaves without a static shape is refused, naming them. A model without If or Loop is one
stretch: the program of `import_onnx`'s graph.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from hexir.errors import ModelError
from hexir.frontend.onnx_context import MUST_BE_CONSTANT
from hexir.frontend.onnx_import import import_onnx, load_proto
from hexir.runtime.vm import If, Loop, Program, Run

__all__ = ["import_program"]

CONTROL = ("If", "Loop")
# A stretch whose import needs an input's value (a Slice's starts, a Reshape's shape, a
# Resize's scales) takes such inputs of up to this many elements as constants, the stretch
# made per value at run time.
BOUND_ELEMENTS = 64
BOUND_ROUNDS = 8  # trial imports that look for more of them


class _Binder:
    """A stretch's ONNX model made a graph for given values of its `bound` inputs."""

    def __init__(self, model: Any, bound: tuple[str, ...]):
        self.model, self.bound = model, bound

    def __call__(self, values: dict) -> Any:
        from onnx import numpy_helper

        model = type(self.model)()
        model.CopyFrom(self.model)
        graph = model.graph
        kept = [i for i in graph.input if i.name not in self.bound]
        del graph.input[:]
        graph.input.extend(kept)
        graph.initializer.extend(numpy_helper.from_array(values[n], n) for n in self.bound)
        return import_onnx(model)


def import_program(model: str | os.PathLike[str] | Any, *, name: str | None = None) -> Program:
    """The program of an ONNX model whose graph may hold If and Loop nodes (module doc)."""
    import onnx

    proto, _ = load_proto(model)
    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception as e:  # onnx raises several kinds
        raise ModelError(f"ONNX shape inference failed on {proto.graph.name!r}: {e}") from e
    builder = _Builder(proto)
    graph = proto.graph
    inputs = tuple(i.name for i in graph.input if i.name not in builder.initializers)
    steps = builder.steps(list(graph.node), [o.name for o in graph.output], graph.name)
    return Program(inputs, steps, tuple(o.name for o in graph.output), name or graph.name)


# Ops whose output needs only their input's static shape, never its values.
SHAPE_ONLY = ("Shape", "Size")


def _sources(nodes: Sequence[Any], names: Iterable[str], inputs: Sequence[str]) -> list[str]:
    """The stretch inputs that tensors `names` are computed from (themselves where they are
    inputs), through the nodes that make them (a Slice's starts from Unsqueeze(iteration));
    not through a Shape or Size node (a crop's pads from an image's shape and a target)."""
    producer = {
        t: node for node in nodes for t in node.output if t and node.op_type not in SHAPE_ONLY
    }
    found: list[str] = []
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.append(name)
        elif name in producer:
            todo += [t for t in producer[name].input if t]
    return found


class _Builder:
    def __init__(self, proto: Any):
        self.proto = proto
        self.initializers = {t.name: t for t in proto.graph.initializer}
        self.types: dict[str, Any] = {}
        self._collect(proto.graph)
        self.count = 0

    def _collect(self, graph: Any) -> None:
        """Every tensor's declared type, in the graph and its branches and bodies."""
        for info in (*graph.input, *graph.output, *graph.value_info):
            self.types[info.name] = info
        for node in graph.node:
            for attr in node.attribute:
                if attr.g.node or attr.g.output:
                    self._collect(attr.g)

    def steps(self, nodes: list[Any], wanted: Sequence[str], label: str) -> tuple:
        """The steps of `nodes`: stretches between the If and Loop nodes."""
        steps: list = []
        stretch: list[Any] = []
        for n, node in enumerate(nodes):
            if node.op_type not in CONTROL:
                stretch.append(node)
                continue
            later = [*self._reads(nodes[n:]), *wanted]
            if stretch:
                steps.append(self._run(stretch, later, label))
                stretch = []
            steps.append(self._control(node, label))
        if stretch:
            steps.append(self._run(stretch, list(wanted), label))
        return tuple(steps)

    def _reads(self, nodes: Iterable[Any]) -> list[str]:
        """The tensors `nodes` read, their branches' and bodies' outer references included."""
        found: list[str] = []
        for node in nodes:
            found += [t for t in node.input if t]
            for attr in node.attribute:
                if attr.g.node or attr.g.output:
                    inner = {t for n in attr.g.node for t in n.output} | {
                        i.name for i in attr.g.input
                    }
                    inner |= {t.name for t in attr.g.initializer}
                    found += [t for t in self._reads(attr.g.node) if t not in inner]
                    found += [o.name for o in attr.g.output if o.name not in inner]
        return found

    def _run(self, nodes: list[Any], later: Sequence[str], label: str) -> Run:
        """One stretch of plain nodes as a graph: what it reads from before, what it defines
        that `later` reads."""
        from onnx import helper

        made = {t for node in nodes for t in node.output if t}
        reads = self._reads(nodes)
        inputs = list(dict.fromkeys(t for t in reads if t not in made | self.initializers.keys()))
        outputs = list(dict.fromkeys(t for t in later if t in made))
        used = set(reads) & self.initializers.keys()
        self.count += 1
        graph = helper.make_graph(
            nodes,
            f"{label}_{self.count}",
            [self._info(t) for t in inputs],
            [self._info(t) for t in outputs],
            [self.initializers[t] for t in sorted(used)],
        )
        model = helper.make_model(graph, opset_imports=list(self.proto.opset_import))
        model.ir_version = self.proto.ir_version
        try:
            return Run(import_onnx(model), tuple(inputs), tuple(outputs))
        except ModelError as refused:
            bound = self._bound(model, inputs, str(refused))
            if not bound:
                raise
        return Run(None, tuple(inputs), tuple(outputs), bound, _Binder(model, bound))

    def _bound(self, model: Any, inputs: list[str], refusal: str) -> tuple[str, ...]:
        """The small inputs whose values the stretch needs as constants: those its refusal
        names or computes them from, then those trial imports with them as zeros and as ones
        name next (a node's refusal names its first such input only, and a zero extent may
        stop it before it reads the next: a Resize's sizes, then its roi); () where it needs
        a big one's."""
        bound: tuple[str, ...] = ()
        for _ in range(BOUND_ROUNDS):
            named = dict.fromkeys(MUST_BE_CONSTANT.findall(refusal))
            needed = [t for t in _sources(model.graph.node, named, inputs) if t not in bound]
            if not needed:
                return bound
            if not all(self._small(t) for t in needed):
                return ()
            bound += tuple(needed)
            refusals = []
            for fill in (0, 1):
                try:
                    _Binder(model, bound)({t: self._filled(t, fill) for t in bound})
                    return bound
                except ModelError as again:
                    refusals.append(str(again))
            refusal = "\n".join(refusals)
        return bound  # the run-time import says what else it needs

    def _filled(self, name: str, value: int) -> np.ndarray:
        """Input `name` of its declared shape and type, every element `value`."""
        from onnx import helper

        tensor = self.types[name].type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        return np.full([d.dim_value for d in tensor.shape.dim], value, dtype)

    def _small(self, name: str) -> bool:
        """An input of at most BOUND_ELEMENTS elements: one whose value a stretch may take as
        a constant, made per value."""
        tensor = self.types[name].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        return None not in dims and math.prod(dims) <= BOUND_ELEMENTS  # type: ignore[arg-type]

    def _info(self, name: str) -> Any:
        info = self.types.get(name)
        if info is None or not info.type.tensor_type.HasField("shape"):
            raise ModelError(
                f"tensor {name!r} flows between steps of the program and ONNX shape inference "
                "gives it no shape: declare it in the model's value_info"
            )
        return info

    def _control(self, node: Any, label: str) -> If | Loop:
        graphs = {a.name: a.g for a in node.attribute}
        outputs = tuple(node.output)
        self._output_types(node, graphs)
        if node.op_type == "If":
            then, else_ = (
                self._branch(graphs[k], label, ()) for k in ("then_branch", "else_branch")
            )
            return If(node.input[0], then, else_, outputs)
        body = graphs["body"]
        formal = tuple(i.name for i in body.input)
        if len(formal) < 2:
            raise ModelError(f"Loop {node.name!r}: its body takes no iteration count and condition")
        trip = node.input[0] if len(node.input) > 0 and node.input[0] else None
        cond = node.input[1] if len(node.input) > 1 and node.input[1] else None
        return Loop(trip, cond, tuple(node.input[2:]), self._branch(body, label, formal), outputs)

    def _output_types(self, node: Any, graphs: dict[str, Any]) -> None:
        """Types for an If's or Loop's outputs where shape inference gave none: an If's
        branch outputs' (the then branch's), a Loop's carried values keep their inputs'."""
        from onnx import helper

        if node.op_type == "If":
            sources = [o.name for o in graphs["then_branch"].output]
        else:
            sources = list(node.input[2:])
        for out, source in zip(node.output, sources, strict=False):
            info, known = self.types.get(out), self.types.get(source)
            if known is None or not known.type.tensor_type.HasField("shape"):
                continue
            if info is None or not info.type.tensor_type.HasField("shape"):
                tensor = known.type.tensor_type
                dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
                self.types[out] = helper.make_tensor_value_info(out, tensor.elem_type, dims)

    def _branch(self, graph: Any, label: str, formal: tuple[str, ...]) -> Program:
        for t in graph.initializer:
            self.initializers[t.name] = t
        outputs = [o.name for o in graph.output]
        steps = self.steps(list(graph.node), outputs, f"{label}_{graph.name}")
        return Program(formal, steps, tuple(outputs), graph.name)
