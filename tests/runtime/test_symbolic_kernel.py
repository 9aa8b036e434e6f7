"""A kernel with symbolic extents: hextir buffers and loops of a size known at run time,
compiled once, the size an argument read from the arrays, its assumptions guarded."""

import numpy as np
import pytest

import hexir
from hexir.errors import BuildError, HexirError
from hexir.graph.lower import lower
from hexir.graph.specialize import specialize
from hexir.ir.symbolic import Sym, shape_at
from hexir.ir.tir_parse import parse_func
from hexir.ir.tir_text import print_func
from hexir.runtime.build import build, c_source
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.target import Target

LENGTHS = (1, 17, 200)


def _layer_norm_gelu():
    b = hexir.GraphBuilder("ln")
    x, g, beta = b.input("x", (1, "seq", 96)), b.input("g", (96,)), b.input("b", (96,))
    return b.build(b.gelu(b.layer_norm(x, g, beta, epsilon=1e-5)))


def _softmax():
    b = hexir.GraphBuilder("sm")
    return b.build(b.softmax(b.input("x", ("seq", 4, 40)), axis=-1))


def _bias_relu():
    b = hexir.GraphBuilder("br")
    return b.build(b.relu(b.add(b.input("x", ("rows", 64)), b.input("bias", (64,)))))


def _dense():
    b = hexir.GraphBuilder("dense")
    x, w = b.input("x", ("seq", 48)), b.input("w", (48, 32))
    return b.build(b.add(b.matmul(x, w), b.input("bias", (32,))))


def _inputs(graph, sizes, rng):
    return {
        v.name: rng.standard_normal(shape_at(v.type.shape, sizes)).astype(np.float32)
        for v in graph.inputs
    }


def test_a_symbolic_kernel_round_trips_through_the_hextir_text_form():
    func = lower(_layer_norm_gelu())
    text = print_func(func)
    assert "buffer<1x{seq}x96xf32>" in text and "in 0..{seq} serial" in text
    assert "spatial({seq})" in text
    again = parse_func(text)
    assert again == func and print_func(again) == text and again.symbols == ("seq",)
    scheduled = default_schedule(func, "cpu").func
    assert parse_func(print_func(scheduled)) == scheduled


def test_the_text_form_reads_sums_of_symbols_and_refuses_bad_ones():
    text = """hextir.func @copy(%a: buffer<{past + 1}x8xf32>, %b: buffer<{past + 1}x8xf32>) {
  for %i in 0..{past + 1} serial {
    for %j in 0..8 serial {
      %b[%i, %j] = %a[%i, %j]
    }
  }
}"""
    func = parse_func(text)
    assert func.params[0].shape == (Sym.named("past") + 1, 8) and func.symbols == ("past",)
    a = np.random.default_rng().standard_normal((5, 8)).astype(np.float32)
    out = np.empty_like(a)
    build(func)(a, out)
    np.testing.assert_array_equal(out, a)
    with pytest.raises(hexir.errors.ParseError, match="bad dimension"):
        parse_func(text.replace("{past + 1}x8", "{past * past}x8", 1))


@pytest.mark.parametrize("make", [_layer_norm_gelu, _softmax, _bias_relu, _dense])
def test_one_build_runs_every_size_and_matches_numpy(make):
    graph = make()
    func = default_schedule(lower(graph), "cpu").func
    (symbol,) = func.symbols
    assert f"int64_t {symbol})" in c_source(func)  # the size is the kernel's last argument
    kernel = build(func)
    rng = np.random.default_rng()
    for n in LENGTHS:
        inputs = _inputs(graph, {symbol: n}, rng)
        (want,) = hexir.reference(specialize(graph, {symbol: n}), inputs)
        out = np.full(want.shape, np.nan, np.float32)
        kernel(*inputs.values(), out)
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_the_rows_run_in_parallel_and_the_row_stays_vectorized():
    func = default_schedule(lower(_layer_norm_gelu()), "cpu").func
    source = c_source(func)
    # in parallel where the rows make enough work, asked at run time
    assert "#pragma omp parallel for num_threads(hx_num_threads()) if(" in source
    assert "* seq >= 32768)" in source
    lanes = Target("cpu").vector_width
    assert "< seq;" in source and f"hx_erf_f32x{lanes}" in source


def test_the_kernel_guards_its_assumptions():
    kernel = build(default_schedule(lower(_layer_norm_gelu()), "cpu").func)
    g = np.ones(96, np.float32)
    with pytest.raises(HexirError, match=r"out0 is 1x\{seq\}x96, given shape \(1, 6, 96\)"):
        kernel(np.ones((1, 5, 96), np.float32), g, g, np.empty((1, 6, 96), np.float32))
    with pytest.raises(HexirError, match="a symbol is a size of at least 1"):
        kernel(np.ones((1, 0, 96), np.float32), g, g, np.empty((1, 0, 96), np.float32))
    with pytest.raises(HexirError, match="has rank 3"):
        kernel(np.ones((5, 96), np.float32), g, g, np.empty((5, 96), np.float32))


def _concat():
    b = hexir.GraphBuilder("cat")
    return b.build(b.concat([b.input("past", ("past", 8)), b.input("x", ("seq", 8))], axis=0))


def _mean_over_the_symbol():
    b = hexir.GraphBuilder("mean")
    return b.build(b.reduce_mean(b.input("x", ("seq", 24)), axes=0))


def _transpose():
    b = hexir.GraphBuilder("t")
    return b.build(b.transpose(b.input("x", (2, "seq", 8)), perm=(0, 2, 1)))


@pytest.mark.parametrize("make", [_concat, _mean_over_the_symbol, _transpose])
def test_sums_counts_and_strides_of_symbols_are_computed_at_run_time(make):
    graph = make()
    func = default_schedule(lower(graph), "cpu").func
    assert parse_func(print_func(func)) == func  # a symbol read in the body: `%past`
    kernel = build(func)
    rng = np.random.default_rng()
    symbols = kernel.func.symbols
    for n in LENGTHS:
        sizes = {s: n + k for k, s in enumerate(symbols)}  # past != seq where both stand
        inputs = _inputs(graph, sizes, rng)
        (want,) = hexir.reference(specialize(graph, sizes), inputs)
        out = np.full(want.shape, np.nan, np.float32)
        kernel(*inputs.values(), out)
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=1e-6)


def test_an_op_that_needs_a_number_where_a_symbol_stands_is_named():
    b = hexir.GraphBuilder("flat")
    graph = b.build(b.reshape(b.input("x", ("seq", 8)), (-1,)))
    with pytest.raises(HexirError, match="hexir.reshape does not lower at symbolic sizes"):
        lower(graph)


def test_symbolic_kernels_build_for_the_cpu_only():
    func = lower(_bias_relu())
    with pytest.raises(BuildError, match="symbolic"):
        build(func, "cuda")


def test_tuning_refuses_a_symbolic_kernel_by_name(tmp_path):
    func = lower(_bias_relu())
    with pytest.raises(hexir.errors.TypeInferenceError, match="symbolic extents.*rows"):
        hexir.tune(func, target="cpu", trials=2, database=f"sqlite:///{tmp_path / 't.db'}")
