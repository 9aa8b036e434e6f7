"""The native command runner: a planned CPU run calls every command from one C function, with
the same bits as calling the kernels from Python one by one."""

import numpy as np
from modules import fresh_copy

import hexir
from hexir.frontend import zoo
from hexir.graph.evaluate import evaluate
from hexir.runtime.native import MAX_ARGUMENTS, RUNNER_SOURCE


def _inputs(graph: hexir.Graph, rng) -> list[np.ndarray]:
    return [rng.standard_normal(v.type.shape).astype("float32") for v in graph.inputs]


def _per_command(module, inputs) -> list[np.ndarray]:
    """A planned run of a fresh copy of `module` with the runner off."""
    again = fresh_copy(module, native_run=False)
    assert again._cpu_buffers().runner is None
    return again.run(inputs)


def test_a_planned_run_is_one_native_call_with_the_per_command_bits(rng):
    graph = zoo.bert(seq=8, hidden=32, heads=2, ffn=64)
    module = hexir.compile(graph)
    first, second = _inputs(graph, rng), _inputs(graph, rng)
    out_first = module.run(first)
    assert module._cpu_buffers().runner is not None
    out_second = module.run(second)  # the inputs' pointers are bound per run
    for inputs, outputs in ((first, out_first), (second, out_second)):
        for ours, theirs in zip(outputs, _per_command(module, inputs), strict=True):
            np.testing.assert_array_equal(ours, theirs)
        expected = evaluate(graph, inputs)
        for ours, ref in zip(outputs, expected, strict=True):
            np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)
    # Each run hands back arrays of its own.
    assert not any(np.may_share_memory(a, b) for a in out_first for b in out_second)


def test_a_timed_native_run_gives_every_command_its_seconds(rng):
    graph = zoo.mlp(batch=4, sizes=(16, 32, 8))
    module = hexir.compile(graph)
    inputs = _inputs(graph, rng)
    outputs, seconds = module.run_timed(inputs)
    assert module._cpu_buffers().runner is not None
    assert len(seconds) == len(module.commands) and all(s >= 0 for s in seconds)
    np.testing.assert_array_equal(outputs[0], module.run(inputs)[0])


def test_a_kernel_with_more_arguments_than_the_runner_calls_runs_its_module_per_command(rng):
    g = hexir.GraphBuilder("wide")
    parts = [g.input(f"x{i}", (2, 3)) for i in range(MAX_ARGUMENTS + 2)]
    graph = g.build(g.relu(g.concat(parts, axis=0)))
    module = hexir.compile(graph)
    inputs = _inputs(graph, rng)
    (out,) = module.run(inputs)
    assert module._cpu_buffers().runner is None
    np.testing.assert_array_equal(out, np.maximum(np.concatenate(inputs, axis=0), 0))


def test_the_runner_calls_every_arity_it_claims():
    for n in range(MAX_ARGUMENTS + 1):
        assert f"case {n}:" in RUNNER_SOURCE
    assert f"case {MAX_ARGUMENTS + 1}:" not in RUNNER_SOURCE


def test_outputs_a_caller_has_let_go_are_reused_and_held_ones_never_written(rng):
    # The Python path's pools (the binder's, in C: tests/runtime/test_binder.py).
    graph = zoo.mlp(batch=4, sizes=(16, 32, 8))
    with hexir.knobs.scope(native_bind=False):
        module = hexir.compile(graph)
    assert module.binder_library is None
    first, second = _inputs(graph, rng), _inputs(graph, rng)
    held = module.run(first)[0]
    kept = held.copy()
    view = module.run(first)[0][1:]  # a view holds its array too
    for _ in range(5):
        again = module.run(second)[0]
        assert not np.may_share_memory(again, held) and not np.may_share_memory(again, view)
        del again
    np.testing.assert_array_equal(held, kept)  # no later run wrote into a held output
    np.testing.assert_array_equal(view, kept[1:])
    pool = next(iter(module._cpu_buffers().pools.values()))
    assert len(pool) == 3  # the held one, the viewed one, one reused by the five runs
    addresses = {module.run(second)[0].ctypes.data for _ in range(5)}
    assert len(addresses) == 1
    np.testing.assert_allclose(module.run(second)[0], evaluate(graph, second)[0], rtol=1e-5)


def test_a_change_of_thread_count_reaches_every_library_of_a_module(rng):
    # A run skips the per-library check while the count and every library's are unchanged;
    # a knob scope, or another module setting a shared library, must still be seen.
    from hexir.runtime import kernel

    graph = zoo.mlp(batch=64, sizes=(256, 512, 64))
    module, other = hexir.compile(graph), hexir.compile(graph)
    libraries = {k._key for k in module.kernels if k._set_threads is not None}
    assert libraries  # the mlp's dense layers run in parallel
    x = _inputs(graph, rng)
    expect = module.run(x)[0]
    default = hexir.knobs.get().num_threads
    assert {kernel._threads_set[key] for key in libraries} == {default}
    with hexir.knobs.scope(num_threads=1):
        np.testing.assert_array_equal(module.run(x)[0], expect)
        assert {kernel._threads_set[key] for key in libraries} == {1}
        other.run(x)  # shares the libraries (the build cache), as set
    np.testing.assert_array_equal(module.run(x)[0], expect)
    assert {kernel._threads_set[key] for key in libraries} == {default}
    with hexir.knobs.scope(num_threads=1):
        other.run(x)  # sets the shared libraries to 1 behind module's back
    module.run(x)
    assert {kernel._threads_set[key] for key in libraries} == {default}
