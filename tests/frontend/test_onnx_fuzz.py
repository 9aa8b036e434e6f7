"""Hostile ONNX files: damaged bytes and mutated graphs get a ModelError out of the import and
nothing else, and a mutated model that imports compiles and runs, or is refused, without a
crash. The mutations are seeded (numpy), so a failure replays; the seeds are the committed
Hugging Face fixtures and Hexir's own exports of zoo models."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import hexir
from hexir.errors import HexirError, ModelError
from hexir.frontend.load import load_model
from hexir.frontend.onnx_export import export_onnx
from hexir.frontend.onnx_import import import_onnx
from hexir.ir.dtype import numpy_dtype

FIXTURES = Path(__file__).parent / "fixtures"
MUTANTS = 25  # per seed model and mutation test


def _seed_models() -> dict[str, onnx.ModelProto]:
    models = {name: onnx.load(FIXTURES / f"{name}.onnx") for name in ("bert_tiny", "gpt2_tiny")}
    models["mlp"] = export_onnx(load_model("mlp"))
    models["resnet18"] = export_onnx(load_model("resnet18"))
    return models


@pytest.fixture(scope="module")
def seeds() -> dict[str, onnx.ModelProto]:
    return _seed_models()


def _pick(rng: np.random.Generator, items):
    return items[int(rng.integers(len(items)))] if len(items) else None


def _mutate_attribute(rng: np.random.Generator, graph) -> None:
    node = _pick(rng, graph.node)
    attr = _pick(rng, node.attribute) if node is not None else None
    if attr is None:
        return
    big = int(rng.choice([-3, -1, 0, 1, 2, 7, 10**9, -(10**9)]))
    if attr.type == onnx.AttributeProto.INT:
        attr.i = big
    elif attr.type == onnx.AttributeProto.INTS and len(attr.ints):
        attr.ints[int(rng.integers(len(attr.ints)))] = big
    elif attr.type == onnx.AttributeProto.FLOAT:
        attr.f = float(rng.choice([np.nan, np.inf, -1.0, 0.0]))
    elif attr.type == onnx.AttributeProto.STRING:
        attr.s = b"bogus"


def _mutate_input_shape(rng: np.random.Generator, graph) -> None:
    value = _pick(rng, graph.input)
    dims = value.type.tensor_type.shape.dim if value is not None else []
    if len(dims):
        _pick(rng, dims).dim_value = int(rng.choice([0, 1, 3, 10**7]))


def _mutate_op_type(rng: np.random.Generator, graph) -> None:
    node = _pick(rng, graph.node)
    kinds = ["Add", "MatMul", "Relu", "Gather", "Reshape", "Conv", "Softmax", "Transpose", "Slice"]
    if node is not None:
        node.op_type = str(_pick(rng, kinds))


def _rewire(rng: np.random.Generator, graph) -> None:
    node = _pick(rng, graph.node)
    if node is None or not len(node.input):
        return
    names = [v.name for v in graph.input] + [t.name for t in graph.initializer]
    names += [out for n in graph.node for out in n.output] + ["", "nowhere"]
    node.input[int(rng.integers(len(node.input)))] = str(_pick(rng, names))


def _drop_or_add_input(rng: np.random.Generator, graph) -> None:
    node = _pick(rng, graph.node)
    if node is None:
        return
    if len(node.input) and rng.random() < 0.5:
        del node.input[-1]
    else:
        node.input.append(node.input[0] if len(node.input) else "x")


def _mutate_initializer(rng: np.random.Generator, graph) -> None:
    tensor = _pick(rng, graph.initializer)
    if tensor is None:
        return
    array = numpy_helper.to_array(tensor).copy()
    if array.size and array.dtype.kind in "iu":  # indices, shapes, axes: out of range
        array.flat[int(rng.integers(array.size))] = int(rng.choice([-(2**40), -5, 10**6]))
    elif array.size:
        array.flat[int(rng.integers(array.size))] = float(rng.choice([np.nan, np.inf, 1e30]))
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def _break_initializer_dims(rng: np.random.Generator, graph) -> None:
    tensor = _pick(rng, graph.initializer)
    if tensor is not None and len(tensor.dims):
        tensor.dims[0] = int(tensor.dims[0]) + int(rng.choice([-1, 1, 5]))


def _delete_node(rng: np.random.Generator, graph) -> None:
    if len(graph.node):
        del graph.node[int(rng.integers(len(graph.node)))]


def _mutate_dtype(rng: np.random.Generator, graph) -> None:
    value = _pick(rng, graph.input)
    if value is not None:
        value.type.tensor_type.elem_type = int(rng.choice([2, 6, 7, 9, 10, 11, 16, 0, 99]))


MUTATIONS = (
    _mutate_attribute,
    _mutate_input_shape,
    _mutate_op_type,
    _rewire,
    _drop_or_add_input,
    _mutate_initializer,
    _break_initializer_dims,
    _delete_node,
    _mutate_dtype,
)


def _mutant(rng: np.random.Generator, model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` after one to three random mutations."""
    mutant = copy.deepcopy(model)
    for _ in range(int(rng.integers(1, 4))):
        _pick(rng, MUTATIONS)(rng, mutant.graph)
    return mutant


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny"])
def test_damaged_files_give_a_model_error_or_import(name, tmp_path):
    data = (FIXTURES / f"{name}.onnx").read_bytes()
    rng = np.random.default_rng(0)
    path = tmp_path / "damaged.onnx"
    refused = 0
    for _ in range(3 * MUTANTS):
        damaged = bytearray(data)
        match int(rng.integers(3)):
            case 0:  # truncated
                damaged = damaged[: int(rng.integers(len(damaged)))]
            case 1:  # bytes flipped
                for _ in range(int(rng.integers(1, 20))):
                    damaged[int(rng.integers(len(damaged)))] = int(rng.integers(256))
            case _:  # garbage inserted
                at = int(rng.integers(len(damaged)))
                damaged[at:at] = rng.integers(0, 256, 500, dtype=np.uint8).tobytes()
        path.write_bytes(bytes(damaged))
        try:
            load_model(path)
        except ModelError:
            refused += 1
    assert refused > MUTANTS  # most damage is found; none escapes as another exception


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny", "mlp", "resnet18"])
def test_mutated_graphs_give_a_model_error_or_import(name, seeds):
    rng = np.random.default_rng(1)
    imported = 0
    for _ in range(MUTANTS):
        try:
            import_onnx(_mutant(rng, seeds[name]))
            imported += 1
        except ModelError as e:
            assert e.problems or "cannot" in str(e)
    assert imported < MUTANTS  # the mutations do break models


def _random_inputs(rng: np.random.Generator, graph: hexir.Graph) -> list[np.ndarray]:
    """Fresh inputs; integers (token ids) well outside any vocabulary, either sign."""
    arrays = []
    for value in graph.inputs:
        dtype = np.dtype(numpy_dtype(value.type.dtype))
        shape = value.type.shape
        if dtype.kind in "iu":
            arrays.append(rng.integers(-300, 300, shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.random(shape) < 0.5)
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_tiny", "mlp"])
def test_mutated_models_that_import_compile_and_run_or_are_refused(name, seeds):
    # Whatever imports either compiles and runs on the CPU (token ids out of range read
    # clamped rows, never outside the table) or is refused with a Hexir error.
    rng = np.random.default_rng(2)
    ran = 0
    for _ in range(MUTANTS // 2):
        try:
            graph = import_onnx(_mutant(rng, seeds[name]))
        except ModelError:
            continue
        try:
            module = hexir.compile(graph, target="cpu")
            outputs = module.run(_random_inputs(rng, graph))
        except HexirError:
            continue
        assert len(outputs) == len(graph.outputs)
        ran += 1
    assert ran > 0
