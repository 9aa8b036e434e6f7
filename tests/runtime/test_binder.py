"""The native binder: the usual `Module.run` call (a list of arrays of the graph's types)
checked, bound, run and answered from C, with the bits and the output pools of the Python
path; anything unusual still takes the checked Python path."""

import numpy as np
import pytest
from modules import fresh_copy

import hexir
from hexir.errors import BuildError, HexirError
from hexir.frontend import zoo
from hexir.runtime import binder as binder_module


def _inputs(graph: hexir.Graph, rng) -> list[np.ndarray]:
    return [rng.standard_normal(v.type.shape).astype("float32") for v in graph.inputs]


def _python_path(module) -> hexir.runtime.module.Module:
    """A fresh copy of `module` that binds in Python."""
    again = fresh_copy(module, native_bind=False)
    assert again._cpu_buffers().binder is None
    return again


def _kv_step():
    return zoo.gpt2_decode(past=7, hidden=32, heads=2)


def test_the_binder_gives_the_bits_of_the_python_path(rng):
    # gpt2-decode's step: three inputs, three outputs (the hidden state and both KV caches).
    graph = _kv_step()
    module = hexir.compile(graph)
    assert module._cpu_buffers().binder is not None
    python = _python_path(module)
    for _ in range(2):
        inputs = _inputs(graph, rng)
        ours, theirs = module.run(inputs), python.run(inputs)
        assert [a.shape for a in ours] == [v.type.shape for v in graph.outputs]
        for a, b in zip(ours, theirs, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    tuple_inputs = tuple(inputs)
    for a, b in zip(module.run(tuple_inputs), theirs, strict=True):
        np.testing.assert_array_equal(a, b)
    timed, seconds = module.run_timed(inputs)  # bound in C too, each command timed
    assert len(seconds) == len(module.commands) and all(s > 0 for s in seconds)
    for a, b in zip(timed, theirs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_outputs_a_caller_keeps_are_never_written_again_and_released_ones_are_reused(rng):
    graph = zoo.mlp(batch=4, sizes=(16, 32, 8))
    module = hexir.compile(graph)
    first, second = _inputs(graph, rng), _inputs(graph, rng)
    (kept,) = module.run(first)
    snapshot = kept.copy()
    view = module.run(second)[0][1:]  # a view keeps its array from the pool too
    (third,) = module.run(first)
    assert not np.may_share_memory(third, kept) and not np.may_share_memory(third, view)
    np.testing.assert_array_equal(kept, snapshot)
    np.testing.assert_array_equal(third, snapshot)
    address = third.__array_interface__["data"][0]
    del third
    (again,) = module.run(second)
    assert again.__array_interface__["data"][0] == address  # the pool's free array


def test_inputs_the_binder_does_not_take_still_run_or_are_refused_as_before(rng):
    graph = zoo.mlp(batch=4, sizes=(16, 32, 8))
    module = hexir.compile(graph)
    assert module._cpu_buffers().binder is not None
    (x,) = _inputs(graph, rng)
    (expected,) = module.run([x])
    fortran = np.asfortranarray(x)
    for inputs in ([fortran], {"x": x}):
        np.testing.assert_array_equal(module.run(inputs)[0], expected)
    with pytest.raises(HexirError, match=">f4"):
        module.run([x.astype(x.dtype.newbyteorder())])
    with pytest.raises(HexirError, match="float64"):
        module.run([x.astype(np.float64)])
    with pytest.raises(HexirError, match="shape"):
        module.run([x[:2]])
    with pytest.raises(HexirError):
        module.run([x, x])


def _twice(b, x):
    y = b.relu(x)
    return [y, y]


@pytest.mark.parametrize(
    "build, binds",
    [
        (lambda b, x: [b.relu(x), b.tanh(x)], True),  # two computed values
        (lambda b, x: [b.relu(x), x], False),  # an output that is an input
        (_twice, False),  # one value returned twice
        (lambda b, x: [b.reshape(b.relu(x), (4, 8, 4))], False),  # a view of a computed value
    ],
)
def test_graphs_whose_outputs_are_not_each_a_computed_value_bind_in_python(build, binds, rng):
    builder = hexir.GraphBuilder("g")
    x = builder.input("x", (4, 32))
    graph = builder.build(build(builder, x))
    module = hexir.compile(graph)
    inputs = _inputs(graph, rng)
    for _ in range(2):
        outputs = module.run(inputs)
        assert (module._cpu_buffers().binder is not None) == binds
        for ours, ref in zip(outputs, hexir.graph.evaluate.evaluate(graph, inputs), strict=True):
            np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)
        assert not any(np.may_share_memory(a, b) for a in outputs for b in outputs if a is not b)


def test_without_the_compiler_or_headers_for_the_binder_modules_bind_in_python(rng, monkeypatch):
    build = hexir.runtime.cc.compile_c

    def fail(source, target, include_dirs=()):
        if include_dirs:
            raise BuildError("no Python headers here")
        return build(source, target)

    binder_module.library.cache_clear()
    monkeypatch.setattr(hexir.runtime.cc, "compile_c", fail)
    try:
        graph = zoo.mlp(batch=4, sizes=(16, 32, 8))
        module = hexir.compile(graph)
        assert module._cpu_buffers().runner is not None
        assert module._cpu_buffers().binder is None
        inputs = _inputs(graph, rng)
        np.testing.assert_allclose(
            module.run(inputs)[0], hexir.graph.evaluate.evaluate(graph, inputs)[0], rtol=1e-5
        )
    finally:
        binder_module.library.cache_clear()
