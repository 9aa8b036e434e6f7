"""The onnx package's own node test cases (`onnx.backend.test.case.node.collect_testcases`:
the generators ship in the wheel, so the cases are built here, not downloaded), run through
Hexir's import. Every case whose op types Hexir supports either imports and computes the
case's expected outputs (numpy semantics, and compiled for the CPU) or is refused
with a ModelError/HexirError naming why: never a wrong answer, never another exception."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import hexir
from hexir.errors import HexirError
from hexir.frontend.onnx_context import MUST_BE_CONSTANT
from hexir.frontend.onnx_import import SUPPORTED, import_onnx
from hexir.graph.evaluate import evaluate
from hexir.ir.dtype import ML_FLOATS, numpy_dtype

BFLOAT16 = numpy_dtype("bfloat16")

# Cases that pass on 2026-12-05 (onnx 1.23): a floor, so that a regression shows.
PASSING_AT_LEAST = 1286
# Every passing case compiles for the CPU and computes the same, float16 and bfloat16
# included: a test for each of SHARDS slices of them (under a minute each, where all of them
# in one test ran past pytest's 300 s timeout on a slow host).
SHARDS = 8


@functools.cache
def supported_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    return tuple(c for c in cases if {n.op_type for n in c.model.graph.node} <= set(SUPPORTED))


def _arrays(data) -> list[np.ndarray]:
    """A data set's arrays (the Cast cases keep theirs as TensorProtos)."""
    from onnx import TensorProto, numpy_helper

    return [numpy_helper.to_array(a) if isinstance(a, TensorProto) else np.asarray(a) for a in data]


def outcome(case, compile_it: bool = False) -> str:
    """'pass', 'refused: ...' or 'wrong: ...' for one case (its first data set)."""
    try:
        graph = import_onnx(case.model)
    except HexirError as e:
        return f"refused: {str(e).splitlines()[-1]}"
    inputs, expected = map(_arrays, case.data_sets[0])
    arrays = inputs[: len(graph.inputs)]
    try:
        got = evaluate(graph, arrays)
        if compile_it:
            got = hexir.compile(graph, target="cpu").run(arrays)
    except HexirError as e:
        return f"refused: {str(e).splitlines()[0]}"
    rtol, atol = case.rtol or 1e-3, case.atol or 1e-5
    for g, want in zip(got, expected, strict=True):
        want = np.asarray(want)
        # bfloat16 keeps 8 significant bits: Hexir rounds after every op, as ml_dtypes does,
        # where the reference may keep an intermediate in float32 (an expanded function's
        # exp - 1): the two are then one bfloat16 step apart.
        step = {BFLOAT16: 2.0**-7, np.dtype(np.float16): 2.0**-10}.get(want.dtype, 0.0)
        # ml_dtypes' floats (bfloat16, the 8-bit floats) compare as the float64s they hold
        g, want = (a.astype(np.float64) if a.dtype.name in ML_FLOATS else a for a in (g, want))
        # A bfloat16 or float16 sum of products (attention's probabilities times values,
        # expanded into narrow ops) rounds each partial sum: an element may be one step of
        # the output's scale away, however small the element.
        finite = want[np.isfinite(want)] if want.dtype.kind == "f" else want
        scale = float(np.abs(finite).max()) if step and finite.size else 0.0
        close = np.allclose(
            g, want, rtol=max(rtol, step), atol=max(atol, step * scale), equal_nan=True
        )
        if g.shape != want.shape or not close:
            return f"wrong: output {g.shape} against {want.shape}"
    return "pass"


def test_every_supported_node_case_passes_or_is_refused_never_wrong():
    outcomes = {c.name: outcome(c) for c in supported_cases()}
    wrong = {name: o for name, o in outcomes.items() if o.startswith("wrong")}
    assert not wrong, wrong
    passing = sum(o == "pass" for o in outcomes.values())
    assert passing >= PASSING_AT_LEAST, f"{passing} of {len(outcomes)} supported cases pass"


@functools.cache
def passing_cases() -> tuple:
    return tuple(c for c in supported_cases() if outcome(c) == "pass")


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_passing_node_case_compiled_for_the_cpu_computes_the_same(shard):
    passing = passing_cases()
    assert len(passing) >= PASSING_AT_LEAST
    outcomes = {c.name: outcome(c, compile_it=True) for c in passing[shard::SHARDS]}
    failed = {name: o for name, o in outcomes.items() if o != "pass"}
    assert not failed, failed


def test_resize_nearest_cases_with_their_scales_or_sizes_as_constants():
    """ONNX's cases feed scales and sizes as graph inputs; Hexir reads them as constants (as
    exported models have them): with those made initializers, every nearest case computes
    the case's expected output."""
    cases = [c for c in supported_cases() if "resize" in c.name and "nearest" in c.name]
    assert len(cases) >= 10
    for case in cases:
        runtime = {i.name for i in case.model.graph.input[1:]}  # all but the image
        model, inputs, expected = _with_named_constants(case, runtime)
        graph = import_onnx(model)
        for got in (evaluate(graph, inputs), hexir.compile(graph, target="cpu").run(inputs)):
            np.testing.assert_array_equal(got[0], np.asarray(expected[0]), err_msg=case.name)


def _with_named_constants(case, names: set[str]):
    """The case's model with the graph inputs `names` turned into initializers of the case's
    values, and the data set without them."""
    from onnx import numpy_helper

    inputs, expected = map(_arrays, case.data_sets[0])
    model = type(case.model)()
    model.CopyFrom(case.model)
    graph = model.graph
    kept = []
    for info, value in zip(list(graph.input), inputs, strict=False):
        if info.name in names:
            graph.initializer.append(numpy_helper.from_array(value, info.name))
            graph.input.remove(info)
        else:
            kept.append(value)
    return model, kept, expected


def constant_inputs_outcome(case) -> str | None:
    """None unless the case is refused for an input that must be a constant; then the
    outcome of the case with those inputs made initializers ('pass', 'refused: ...',
    'wrong')."""
    graph_inputs = {i.name for i in case.model.graph.input}
    names: set[str] = set()
    while True:  # a converter names one such input at a time; `names` grows or this ends
        model, arrays, expected = _with_named_constants(case, names)
        try:
            graph = import_onnx(model)
            break
        except HexirError as e:
            more = set(MUST_BE_CONSTANT.findall(str(e))) & graph_inputs - names
            if not more:
                return f"refused: {str(e).splitlines()[-1]}" if names else None
            names |= more
    if not names:
        return None
    try:
        got = evaluate(graph, arrays)
    except HexirError as e:
        return f"refused: {str(e).splitlines()[-1]}"
    return _verdict(case, got, expected)


# Cases refused only for an axes / shape / bounds input fed at run time that pass once it is
# a constant, 2026-12-04 (onnx 1.23): a floor.
CONSTANT_INPUTS_PASSING_AT_LEAST = 265


def test_cases_refused_for_a_runtime_shape_input_compute_the_same_with_it_constant():
    """ONNX's cases feed axes, shapes, starts, pads and the like as graph inputs, where
    exported models have constants (Hexir folds shape computations at import). Each case
    refused only for such an input, rerun with those inputs made initializers, computes the
    expected outputs or is refused for another reason: never wrong."""
    outcomes = {c.name: o for c in supported_cases() if (o := constant_inputs_outcome(c))}
    wrong = [name for name, o in outcomes.items() if o == "wrong"]
    assert not wrong, wrong
    passing = sum(o == "pass" for o in outcomes.values())
    assert passing >= CONSTANT_INPUTS_PASSING_AT_LEAST, f"{passing} of {len(outcomes)} pass"


def _verdict(case, got: list[np.ndarray], expected: list) -> str:
    """'pass' where every output has the expected shape and values within the case's
    tolerances, else 'wrong'."""
    rtol, atol = case.rtol or 1e-3, case.atol or 1e-5
    same = all(
        g.shape == np.shape(w) and np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        for g, w in zip(got, expected, strict=True)
    )
    return "pass" if same else "wrong"


def program_outcome(case, first: str | None = None) -> str | None:
    """None unless import_onnx refuses the case for an input that must be a constant (`first`:
    the case's `outcome`, where the caller has it); then the outcome of `import_program`
    (hexir/frontend/onnx_program.py), which makes the graph per value of such inputs as they
    come at run time, compiled for the CPU: 'pass', 'refused: ...' or 'wrong'."""
    from hexir.frontend.onnx_program import import_program

    first = outcome(case) if first is None else first
    if not first.startswith("refused") or "must be a constant" not in first:
        return None
    inputs, expected = map(_arrays, case.data_sets[0])
    try:
        program = import_program(case.model)
        got = program.compile("cpu").run(inputs[: len(program.inputs)])
    except HexirError as e:
        return f"refused: {(str(e).splitlines() or [''])[-1]}"
    return _verdict(case, got, expected)


# Cases refused for an input fed at run time that run as programs, 2026-12-05: a floor.
PROGRAM_PASSING_AT_LEAST = 277


@pytest.mark.slow
def test_cases_refused_for_a_runtime_input_run_as_programs_made_per_value():
    """The same cases through `import_program`: the stretch that needs an input's value is
    made and compiled per value at run time. Never wrong."""
    outcomes = {c.name: o for c in supported_cases() if (o := program_outcome(c))}
    wrong = [name for name, o in outcomes.items() if o == "wrong"]
    assert not wrong, wrong
    passing = sum(o == "pass" for o in outcomes.values())
    assert passing >= PROGRAM_PASSING_AT_LEAST, f"{passing} of {len(outcomes)} pass"


def test_programs_bind_inputs_read_through_shapes_and_past_zero_extents():
    """Cases import_program once refused: a crop's pads computed from the image's Shape and a
    target shape (the target is bound, the image, read for its static shape only, is not),
    and a Resize whose zero sizes, a first trial import's, stopped it before it named its
    roi (the trial with ones names it)."""
    names = {"test_center_crop_pad_crop_and_pad_expanded", "test_resize_tf_crop_and_resize"}
    cases = [c for c in supported_cases() if c.name in names]
    assert len(cases) == len(names)
    for case in cases:
        assert program_outcome(case) == "pass", case.name
