"""A graph with symbolic dimensions compiles to one module that runs any size of them."""

import numpy as np
import pytest

import hexir
from hexir.errors import ArtifactError, TypeInferenceError
from hexir.graph.specialize import specialize, symbol_sizes
from hexir.runtime.symbolic_module import SymbolicModule


def _block(rng):
    """x [1, seq, 32] -> relu(x @ w) -> softmax, concatenated after past [1, past, 16], then
    layer-normed over 16; its weights as numpy arrays for the reference."""
    w = rng.standard_normal((32, 16)).astype(np.float32)
    gamma, beta = (rng.standard_normal(16).astype(np.float32) for _ in range(2))
    b = hexir.GraphBuilder("block")
    x = b.input("x", (1, "seq", 32))
    past = b.input("past", (1, "past", 16))
    y = b.softmax(b.relu(b.matmul(b.reshape(x, (-1, 32)), b.constant(w))))
    both = b.reshape(b.concat([past, b.reshape(y, (1, -1, 16))], axis=1), (-1, 16))
    out = b.layer_norm(both, b.constant(gamma), b.constant(beta), epsilon=1e-5)
    return b.build(out), (w, gamma, beta)


def _numpy(x, past, w, gamma, beta):
    h = np.maximum(x[0] @ w, 0)
    e = np.exp(h - h.max(-1, keepdims=True))
    both = np.concatenate([past[0], e / e.sum(-1, keepdims=True)])
    mean, var = both.mean(-1, keepdims=True), both.var(-1, keepdims=True)
    return (both - mean) / np.sqrt(var + 1e-5) * gamma + beta


def test_one_module_runs_prompts_of_lengths_1_17_and_200():
    rng = np.random.default_rng()
    graph, weights = _block(rng)
    module = hexir.compile(graph)
    assert isinstance(module, SymbolicModule) and module.symbols == ("past", "seq")
    for seq, past in [(1, 3), (17, 5), (200, 1), (17, 5)]:
        x = rng.standard_normal((1, seq, 32)).astype(np.float32)
        p = rng.standard_normal((1, past, 16)).astype(np.float32)
        (out,) = module.run([x, p])
        assert out.shape == (seq + past, 16)
        np.testing.assert_allclose(out, _numpy(x, p, *weights), rtol=1e-4, atol=1e-5)
        (by_name,) = module.run({"past": p, "x": x})
        np.testing.assert_array_equal(by_name, out)
    # each size compiled once: the repeated (17, 5) ran the module compiled before
    assert sorted(module.specializations) == [
        (("past", 1), ("seq", 200)), (("past", 3), ("seq", 1)), (("past", 5), ("seq", 17)),
    ]  # fmt: skip


def test_the_reference_evaluates_a_symbolic_graph_at_its_inputs_sizes():
    rng = np.random.default_rng()
    graph, weights = _block(rng)
    x = rng.standard_normal((1, 9, 32)).astype(np.float32)
    p = rng.standard_normal((1, 2, 16)).astype(np.float32)
    (out,) = hexir.reference(graph, [x, p])
    # float32 sums of 32 products and a layer norm, in two summation orders: a few ulps
    np.testing.assert_allclose(out, _numpy(x, p, *weights), rtol=1e-5, atol=1e-5)


def test_specialize_gives_the_graph_at_fixed_sizes():
    graph, _ = _block(np.random.default_rng(0))
    sizes = symbol_sizes(graph, {"x": (1, 7, 32), "past": (1, 4, 16)})
    assert sizes == {"seq": 7, "past": 4}
    concrete = specialize(graph, sizes)
    assert [v.type.shape for v in concrete.inputs] == [(1, 7, 32), (1, 4, 16)]
    assert concrete.outputs[0].type.shape == (11, 16)
    assert not any(op.result.type.symbolic for op in concrete.ops)


@pytest.mark.parametrize(
    "shapes, message",
    [
        ([(1, 7, 32), (1, 4, 15)], r"%past is 1x\{past\}x16, given shape \(1, 4, 15\)"),
        ([(1, 7), (1, 4, 16)], r"%x has rank 3, given shape \(1, 7\)"),
        ([(2, 7, 32), (1, 4, 16)], r"%x is 1x\{seq\}x32"),
        ([(1, 0, 32), (1, 4, 16)], r"\{seq\} would be 0"),
    ],
)
def test_inputs_that_do_not_fit_the_symbols_are_refused(shapes, message):
    graph, _ = _block(np.random.default_rng(0))
    module = hexir.compile(graph)
    arrays = [np.zeros(s, np.float32) for s in shapes]
    with pytest.raises(TypeInferenceError, match=message):
        module.run(arrays)
    assert module.specializations == {}


def test_a_symbol_no_input_fixes_alone_is_refused():
    b = hexir.GraphBuilder("g")
    x = b.input("x", ("{2*n}",))
    graph = b.build(b.relu(x))
    with pytest.raises(TypeInferenceError, match=r"no input fixes \{2\*n\}"):
        hexir.compile(graph).run([np.ones(4, np.float32)])


def test_a_symbolic_module_is_not_saved_but_a_specialization_is(tmp_path):
    graph, _ = _block(np.random.default_rng(0))
    module = hexir.compile(graph)
    with pytest.raises(ArtifactError, match=r"save one specialization"):
        module.save(tmp_path / "block.hexir")
    assert module.specialized({"seq": 4, "past": 2}).save(tmp_path / "b.hexir").exists()
