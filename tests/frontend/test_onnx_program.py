"""ONNX If and Loop, imported as a program (hexir/frontend/onnx_program.py) that the VM runs
(hexir/runtime/vm.py): the onnx package's own If and Loop cases, and models whose branches and
bodies compute, against ONNX Runtime on fresh inputs."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.case.node import collect_testcases

import hexir.runtime
from hexir.errors import HexirError, ModelError
from hexir.frontend.onnx_program import import_program
from hexir.runtime.vm import Call, CompiledProgram, If, Loop, Program, Run

F = TensorProto.FLOAT


@functools.cache
def _cases():
    return {c.name: c for c in collect_testcases(None) if c.name in ("test_if", "test_loop11")}


def _case(name):
    return _cases()[name]


@pytest.mark.parametrize("name", ["test_if", "test_loop11"])
def test_the_onnx_packages_if_and_loop_cases_run(name):
    case = _case(name)
    program = import_program(case.model)
    assert any(isinstance(s, If | Loop) for s in program.steps)
    inputs, outputs = case.data_sets[0]
    got = program.compile("cpu").run(list(inputs))
    for g, w in zip(got, outputs, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def _model():
    """y = If(sum(x) > 0, x * 2, x - 1); then Loop(n): acc += y * (i + 1) (i the iteration,
    as a float), scan out acc; outputs the final acc and the scans."""
    then = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t_out"])], "then", [],
        [helper.make_tensor_value_info("t_out", F, [3, 4])],
        [numpy_helper.from_array(np.float32(2.0), "two")],
    )  # fmt: skip
    else_ = helper.make_graph(
        [helper.make_node("Sub", ["x", "one"], ["e_out"])], "else", [],
        [helper.make_tensor_value_info("e_out", F, [3, 4])],
        [numpy_helper.from_array(np.float32(1.0), "one")],
    )  # fmt: skip
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Add", ["i_f", "one_b"], ["k"]),
            helper.make_node("Mul", ["y", "k"], ["yk"]),
            helper.make_node("Add", ["acc_in", "yk"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["acc_out"], ["scan"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", F, [3, 4]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", F, [3, 4]),
            helper.make_tensor_value_info("scan", F, [3, 4]),
        ],
        [numpy_helper.from_array(np.float32(1.0), "one_b")],
    )
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["c"]),
            helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=else_),
            helper.make_node("Loop", ["n", "", "acc0"], ["acc", "scans"], body=body),
            helper.make_node("Relu", ["acc"], ["out"]),
        ],
        "program",
        [
            helper.make_tensor_value_info("x", F, [3, 4]),
            helper.make_tensor_value_info("n", TensorProto.INT64, []),
            helper.make_tensor_value_info("acc0", F, [3, 4]),
        ],
        [helper.make_tensor_value_info("out", F, [3, 4]),
         helper.make_tensor_value_info("scans", F, [None, 3, 4])],
        [numpy_helper.from_array(np.float32(0.0), "zero")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("sign, trips", [(1, 4), (-1, 3), (1, 0)])
def test_branches_and_loops_compute_as_onnxruntime(sign, trips):
    rng = np.random.default_rng()
    model = _model()
    x = (np.abs(rng.standard_normal((3, 4))) * sign).astype(np.float32)
    feeds = {"x": x, "n": np.array(trips), "acc0": rng.standard_normal((3, 4)).astype(np.float32)}
    compiled = import_program(model).compile("cpu")
    if trips == 0:  # no iteration: the scans' shapes are unknown to Hexir
        with pytest.raises(Exception, match="ran no iteration"):
            compiled.run(feeds)
        return
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = compiled.run(feeds)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_compiled_program_saves_as_one_artifact_and_loads_as_a_program(tmp_path):
    rng = np.random.default_rng()
    model = _model()
    compiled = import_program(model).compile("cpu")
    path = compiled.save(tmp_path / "program.hxa")
    loaded = hexir.runtime.load(path)
    assert isinstance(loaded, CompiledProgram)
    # the same steps, its runs over the loaded modules
    assert loaded.program.to_json() == compiled.program.to_json()
    for sign in (1, -1):
        feeds = {
            "x": (np.abs(rng.standard_normal((3, 4))) * sign).astype(np.float32),
            "n": np.array(3),
            "acc0": rng.standard_normal((3, 4)).astype(np.float32),
        }
        for got, want in zip(loaded.run(feeds), compiled.run(feeds), strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_program_with_steps_made_as_it_runs_has_no_artifact(tmp_path):
    compiled = import_program(_case("test_loop11").model).compile("cpu")
    with pytest.raises(HexirError, match="reads the values of iter_count as constants"):
        compiled.save(tmp_path / "loop.hxa")
    assert not (tmp_path / "loop.hxa").exists()


def test_builtin_steps_compute_and_an_unknown_one_is_refused():
    x = np.random.default_rng().standard_normal((3, 5)).astype(np.float32)
    program = Program(
        ("x",),
        (Call("argmax", ("x",), ("i",)), Call("cast", ("i",), ("f",), (("dtype", "float32"),))),
        ("f",),
    )
    (f,) = program.compile("cpu").run([x])
    np.testing.assert_array_equal(f, np.argmax(x, -1).astype(np.float32))
    with pytest.raises(HexirError, match="unknown VM builtin 'sort'; the builtins are argmax"):
        Call("sort", ("x",), ("y",))


def test_a_stretch_that_needs_an_inputs_value_is_made_once_per_value():
    case = _case("test_loop11")
    program = import_program(case.model)
    (loop,) = [s for s in program.steps if isinstance(s, Loop)]
    (stretch,) = [s for s in loop.body.steps if isinstance(s, Run)]
    assert stretch.graph is None and stretch.bound == ("iter_count",)
    compiled = program.compile("cpu")
    inputs, _ = case.data_sets[0]
    compiled.run(list(inputs))
    compiled.run(list(inputs))
    made = [key for key in compiled._modules if key[0] == id(stretch)]
    assert len(made) == int(inputs[0])  # one per iteration count, made once


def test_a_tensor_between_steps_without_a_shape_is_refused():
    model = _model()
    del model.graph.input[2].type.tensor_type.shape.dim[:]
    model.graph.input[2].type.tensor_type.ClearField("shape")
    with pytest.raises(ModelError, match="no shape"):
        import_program(model)
