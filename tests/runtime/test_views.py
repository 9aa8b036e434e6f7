"""Views: a reshape no kernel computes is its operand's buffer under another shape — planned
and unplanned, of intermediates, graph inputs and constants, returned by the graph, in chains,
beside in-place kernels; the memory plan aliases the two names."""

import numpy as np
import pytest

import hexir
from hexir.graph.evaluate import evaluate
from hexir.graph.memory import Step, plan_memory
from hexir.runtime.module import Module
from hexir.runtime.profile import command_ops

FUSION = pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])


def _weights(rng, *shape):
    return (rng.standard_normal(shape) * 0.1).astype("float32")


def _compile(graph: hexir.Graph, fusion: bool, target: str = "cpu") -> Module:
    with hexir.knobs.scope(fusion=fusion):
        return hexir.compile(graph, target=target)


def _no_reshape_command(module: Module) -> None:
    for command, task in zip(module.commands, module.report, strict=True):
        assert "reshape" not in task.ops
        assert all(op.kind != "reshape" for op in command_ops(module.graph, command))


def _check(module: Module, rng) -> list[np.ndarray]:
    """Planned (twice) and unplanned runs give the same bits, close to numpy's; the outputs."""
    inputs = [rng.standard_normal(v.type.shape).astype("float32") for v in module.graph.inputs]
    kept = [x.copy() for x in inputs]
    planned = module.run(inputs)
    again = module.run(inputs)
    unplanned = module.run(inputs, plan=False)
    for x, k in zip(inputs, kept, strict=True):
        np.testing.assert_array_equal(x, k)  # no run writes into the caller's inputs
    expected = evaluate(module.graph, inputs)
    for out, same, other, ref in zip(planned, again, unplanned, expected, strict=True):
        np.testing.assert_array_equal(out, same)
        np.testing.assert_array_equal(out, other)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    return planned


def attention_like(rng) -> hexir.Graph:
    """matmul -> reshape -> softmax -> reshape -> matmul."""
    g = hexir.GraphBuilder("views")
    x = g.input("x", (6, 16))
    h = g.matmul(x, g.constant(_weights(rng, 16, 24)))
    p = g.softmax(g.reshape(h, (6, 4, 6)), axis=-1)
    y = g.matmul(g.reshape(p, (6, 24)), g.constant(_weights(rng, 24, 8)))
    return g.build([y])


@FUSION
def test_reshapes_between_kernels_are_views(fusion, rng):
    module = _compile(attention_like(rng), fusion)
    _no_reshape_command(module)
    assert len(module.views) == 2 and len(module.commands) == 3
    for view, root in module.views.items():
        assert module.plan.placement(view) == module.plan.placement(root)
        assert (view, root) in module.plan.views
    _check(module, rng)


@FUSION
def test_a_returned_reshape_is_a_fresh_array(fusion, rng):
    g = hexir.GraphBuilder("returned")
    x = g.input("x", (4, 6))
    h = g.exp(x)
    graph = g.build([g.reshape(h, (24,)), g.tanh(h), g.reshape(g.relu(h), (2, 12))])
    module = _compile(graph, fusion)
    _no_reshape_command(module)
    flat, t, r = _check(module, rng)
    kept = [a.copy() for a in (flat, t, r)]
    flat[:] = -1.0  # mutating one output changes neither the others nor a later run
    np.testing.assert_array_equal(t, kept[1])
    module.run([rng.standard_normal((4, 6)).astype("float32")])
    np.testing.assert_array_equal(t, kept[1])
    np.testing.assert_array_equal(r, kept[2])
    again = module.run([np.ones((4, 6), "float32")])
    np.testing.assert_allclose(again[0], np.full(24, np.e, "float32"), rtol=1e-6)
    np.testing.assert_array_equal(flat, -1.0)  # the later run did not write into it either


@FUSION
def test_a_reshape_of_a_graph_input_aliases_it(fusion, rng):
    g = hexir.GraphBuilder("input_view")
    x = g.input("x", (2, 3, 8))
    flat = g.reshape(x, (6, 8))
    graph = g.build([g.matmul(flat, g.constant(_weights(rng, 8, 5))), g.reshape(x, (48,))])
    module = _compile(graph, fusion)
    _no_reshape_command(module)
    assert set(module.views.values()) == {"x"} and len(module.commands) == 1
    xv = rng.standard_normal((2, 3, 8)).astype("float32")
    _, returned = module.run([xv])
    returned[:] = 0.0  # the returned view is the user's, not the input's buffer
    np.testing.assert_array_equal(module.run([xv])[1], xv.reshape(48))
    _check(module, rng)


def test_a_graph_of_views_alone_runs_no_kernel(rng):
    g = hexir.GraphBuilder("only_views")
    x = g.input("x", (3, 4))
    graph = g.build([g.reshape(x, (12,))])
    module = hexir.compile(graph)
    assert module.commands == [] and list(module.views.values()) == ["x"]
    xv = rng.standard_normal((3, 4)).astype("float32")
    (out,) = module.run([xv])
    out[:] = 0.0
    np.testing.assert_array_equal(module.run([xv])[0], xv.reshape(12))
    np.testing.assert_array_equal(module.run([xv], plan=False)[0], xv.reshape(12))


def test_a_reshape_of_a_constant_is_folded(rng):
    g = hexir.GraphBuilder("constant_view")
    x = g.input("x", (4, 6))
    w = g.reshape(g.constant(_weights(rng, 2, 3, 5)), (6, 5))
    graph = g.build([g.matmul(x, w)])
    module = hexir.compile(graph)
    assert module.views == {} and len(module.commands) == 1
    _check(module, rng)


@FUSION
def test_chains_of_views_share_one_buffer(fusion, rng):
    g = hexir.GraphBuilder("chain")
    x = g.input("x", (4, 6))
    h = g.exp(x)
    a = g.reshape(h, (6, 4))
    b = g.reshape(a, (24,))  # kept a chain: `a` has a use of its own
    # (Softmaxes: an elementwise op would take the reshape below it, _sink_reshape.)
    graph = g.build([g.softmax(a, axis=1), g.softmax(b, axis=0)])
    module = _compile(graph, fusion)
    _no_reshape_command(module)
    (root,) = set(module.views.values())
    assert len(module.views) == 2 and root not in module.views
    assert len({module.plan.placement(v) for v in (*module.views, root)}) == 1
    _check(module, rng)


def test_an_in_place_kernel_never_overwrites_a_buffer_another_name_still_needs(rng):
    g = hexir.GraphBuilder("hazard")
    x = g.input("x", (4, 6))
    h = g.exp(x)
    t = g.tanh(g.reshape(h, (24,)))  # may not run over h: h is read below
    graph = g.build([g.add(g.reshape(t, (4, 6)), h)])
    module = _compile(graph, fusion=False)
    _no_reshape_command(module)
    h_name = module.commands[0].outputs[0]
    assert all(donor != h_name for _, donor in module.plan.inplace)
    _check(module, rng)


def test_an_in_place_kernel_takes_a_dying_buffer_through_its_view(rng):
    g = hexir.GraphBuilder("through")
    x = g.input("x", (4, 6))
    h = g.exp(x)
    t = g.tanh(g.reshape(h, (24,)))
    graph = g.build([g.sqrt(g.add(t, g.constant(np.float32(2.0))))])
    module = _compile(graph, fusion=False)
    h_name, t_name = module.commands[0].outputs[0], module.commands[1].outputs[0]
    assert (t_name, h_name) in module.plan.inplace
    _check(module, rng)


def test_a_kernel_reading_one_buffer_under_two_names_does_not_overwrite_it(rng):
    g = hexir.GraphBuilder("two_names")
    x = g.input("x", (4, 6))
    h = g.exp(x)
    y = g.add(g.reshape(h, (24,)), g.reshape(h, (1, 24)))
    graph = g.build([g.relu(y)])
    module = _compile(graph, fusion=False)
    h_name = module.commands[0].outputs[0]
    assert all(donor != h_name for _, donor in module.plan.inplace)
    _check(module, rng)


def test_the_plan_keeps_a_value_alive_while_a_view_of_it_is_read():
    steps = [
        Step((), ("a",)),
        Step(("a",), ("b",)),
        Step(("b",), ("c",)),
        Step(("v", "c"), ("d",)),  # reads a through its view v
    ]
    sizes = {"a": 4096, "b": 4096, "c": 4096, "d": 4096}
    plain = plan_memory(steps[:3], {k: sizes[k] for k in "abc"})
    assert plain.placement("a") == plain.placement("c")  # a dead at step 1: c reuses it
    plan = plan_memory(steps, sizes, {"v": "a"})
    assert plan.placement("v") == plan.placement("a")
    assert plan.placement("c") != plan.placement("a") and plan.views == (("v", "a"),)
    assert plan.lower_bound == 3 * 4096
    assert type(plan).from_json(plan.to_json()) == plan


def test_an_artifact_keeps_its_views(rng, tmp_path):
    module = _compile(attention_like(rng), fusion=False)
    loaded = hexir.runtime.load(module.save(tmp_path / "views.hxa"))
    assert loaded.views == module.views and loaded.plan == module.plan
    xv = rng.standard_normal((6, 16)).astype("float32")
    np.testing.assert_array_equal(loaded.run([xv])[0], module.run([xv])[0])


def test_a_cuda_module_has_no_reshape_command(rng):
    module = _compile(attention_like(rng), fusion=False, target="cuda -arch=sm_90")
    _no_reshape_command(module)
    assert len(module.views) == 2 and len(module.kernels) == len(module.commands) == 3
