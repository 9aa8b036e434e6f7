"""hexir.quantize and `hexir quantize`: linear layers of constant weights as int8 products,
checked against a numpy integer reference of the same scheme, against the float32 model, and
compiled for the CPU."""

from __future__ import annotations

import numpy as np
import pytest

import hexir
from hexir.cli import main
from hexir.errors import HexirError
from hexir.graph.evaluate import evaluate


def _dense_graph(w: np.ndarray, rows: int) -> hexir.Graph:
    b = hexir.GraphBuilder("layer")
    x = b.input("x", (rows, w.shape[1]))
    return b.build(b.op("relu", b.dense(x, b.constant(w))))


def _two_layers(rng: np.random.Generator, rows: int = 8) -> hexir.Graph:
    b = hexir.GraphBuilder("two")
    x = b.input("x", (rows, 96))
    h = b.op("relu", b.matmul(x, b.constant(rng.standard_normal((96, 128)).astype(np.float32))))
    w2 = rng.standard_normal((64, 128)).astype(np.float32)
    return b.build(b.op("relu", b.dense(h, b.constant(w2))))


def _numpy_int8_dense(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The scheme in numpy: w per row of [N, K] (an output column) symmetric int8, x uint8 by
    DynamicQuantizeLinear's rule, the product in int32, then the two scales (float32)."""
    top = np.abs(w).max(axis=1)
    w_scale = np.where(top > 0, top / 127, 1).astype(np.float32)
    wq = np.clip(np.rint(w / w_scale[:, None]), -127, 127).astype(np.int32)
    f = np.float32
    low, high = min(f(x.min()), f(0)), max(f(x.max()), f(0))
    span = f(high - low) if high != low else f(1)
    scale = f(span / f(255))
    zero = np.rint(np.clip(f(0) - low / scale, f(0), f(255)))
    xq = np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.int32)
    acc = (xq - np.int32(zero)) @ wq.T
    return np.maximum(acc.astype(np.float32) * (scale * w_scale), 0)


def test_a_dense_layer_computes_the_numpy_integer_reference(rng):
    w = rng.standard_normal((48, 160)).astype(np.float32)
    graph = _dense_graph(w, 5)
    quantized, layers = hexir.quantize(graph)
    assert [layer.shape for layer in layers] == [(160, 48)]
    assert any(op.kind == "constant" and op.result.type.dtype == "int8" for op in quantized.ops)
    x = rng.standard_normal((5, 160)).astype(np.float32)
    want = _numpy_int8_dense(x, w)
    for got in (evaluate(quantized, [x])[0], hexir.compile(quantized).run([x])[0]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    # and close to the float32 layer: a few quantization steps of 1/127 and 1/255 of the range
    exact = np.maximum(x @ w.T, 0)
    assert np.abs(want - exact).max() < 0.03 * np.abs(exact).max()


def test_a_quantized_model_keeps_its_names_and_is_near_the_float32_one(rng):
    graph = hexir.load_model("gpt2-decode")
    quantized, layers = hexir.quantize(graph)
    assert len(layers) == 4 and all(layer.weight_error < 4e-3 for layer in layers)
    assert [v.name for v in quantized.outputs] == [v.name for v in graph.outputs]
    assert [v.name for v in quantized.inputs] == [v.name for v in graph.inputs]
    # the float32 weights are gone: a quarter of their bytes stays, as int8
    f32_bytes = sum(d.array.nbytes for _, d in graph.constants)
    q_bytes = sum(d.array.nbytes for _, d in quantized.constants)
    assert q_bytes < 0.3 * f32_bytes
    assert not any(
        d.array.dtype == np.float32 and d.array.size > 4096 for _, d in quantized.constants
    )
    inputs = [rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs]
    errors = hexir.frontend.quantize.quantization_error(graph, quantized, inputs)
    assert all(0 < e < 0.05 for e in errors), errors
    compiled = hexir.compile(quantized).run(inputs)
    for got, want in zip(compiled, evaluate(quantized, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_static_activations_take_their_scales_from_calibration(rng):
    graph = _two_layers(rng)
    sets = [[rng.standard_normal((8, 96)).astype(np.float32)] for _ in range(16)]
    static, layers = hexir.quantize(graph, activations="static", calibration=sets)
    dynamic, _ = hexir.quantize(graph)
    assert len(layers) == 2
    # dynamic: each activation's range is reduced at run time; static: no reduction left
    ranges = ("reduce_max", "reduce_min")
    assert sorted(op.kind for op in dynamic.ops if op.kind in ranges) == sorted(ranges * 2)
    assert not any(op.kind in ranges for op in static.ops)
    held_out = [rng.standard_normal((8, 96)).astype(np.float32)]
    want = evaluate(graph, held_out)[0]
    got = hexir.compile(static).run(held_out)[0]
    # (a held-out value beyond the calibrated range clips: a static scale's known cost)
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
    np.testing.assert_allclose(got, evaluate(static, held_out)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(HexirError, match="needs calibration inputs"):
        hexir.quantize(graph, activations="static")


def test_refusals_name_what_is_missing(rng):
    graph = _two_layers(rng)
    with pytest.raises(HexirError, match="int8, int4, bfloat16"):
        hexir.quantize(graph, weights="int2")
    with pytest.raises(HexirError, match="weight-only"):
        hexir.quantize(graph, weights="int4", activations="static", calibration=[[]])
    with pytest.raises(HexirError, match="one of dynamic, static"):
        hexir.quantize(graph, activations="float8")


def test_cli_quantize_writes_a_model_that_runs_and_reports_its_error(tmp_path, capsys, rng):
    out = tmp_path / "mlp-int8.hexir"
    assert main(["quantize", "mlp", "-o", str(out)]) == 0
    report = capsys.readouterr().out
    assert (
        "2 linear layers in int8" in report
    )  # fc3 (256 x 10) is too small to gain and "largest |int8 - float32|" in report
    loaded = hexir.load_model(str(out))
    x = rng.standard_normal(loaded.inputs[0].type.shape).astype(np.float32)
    np.testing.assert_allclose(
        hexir.compile(loaded).run([x])[0], evaluate(loaded, [x])[0], rtol=1e-4, atol=1e-6
    )
    assert main(["run", str(out), "--check"]) == 0

    # static activations from a stack of calibration sets
    graph = hexir.load_model("mlp")
    shape = graph.inputs[0].type.shape
    calib = tmp_path / "calib.npz"
    np.savez(calib, **{graph.inputs[0].name: rng.standard_normal((3, *shape)).astype("f4")})
    out2 = tmp_path / "static.hexir"
    args = ["quantize", "mlp", "-o", str(out2), "--activations", "int8", "--calibrate"]
    assert main([*args, str(calib)]) == 0
    assert "from calibration (3 sets)" in capsys.readouterr().out
    assert not any(
        op.kind in ("reduce_max", "reduce_min") for op in hexir.load_model(str(out2)).ops
    )

    np.savez(calib, **{graph.inputs[0].name: np.ones((3, 5), "f4")})
    assert main([*args, str(calib)]) == 1
    assert "or a stack of such sets" in capsys.readouterr().err
    assert main(["quantize", "mlp", "--calibrate", str(calib)]) == 1
    assert "--activations int8" in capsys.readouterr().err
    assert main(["quantize", "mlp", "--weights", "int4", "--activations", "int8"]) == 1
    assert "weights only" in capsys.readouterr().err


def test_bfloat16_weights_halve_the_bytes_and_stay_within_bfloat16_rounding(tmp_path, rng):
    graph = _two_layers(rng)
    quantized, layers = hexir.quantize(graph, weights="bf16")
    assert len(layers) == 2 and all(layer.weight_error <= 2**-8 for layer in layers)
    assert any(op.result.type.dtype == "bfloat16" for op in quantized.ops if op.kind == "constant")
    x = [rng.standard_normal((8, 96)).astype(np.float32)]
    want = evaluate(graph, x)[0]
    got = hexir.compile(quantized).run(x)[0]
    np.testing.assert_allclose(got, evaluate(quantized, x)[0], rtol=1e-5, atol=1e-5)
    assert 0 < np.abs(got - want).max() < 2**-6 * np.abs(want).max()
    with pytest.raises(HexirError, match="no calibration"):
        hexir.quantize(graph, weights="bfloat16", activations="static", calibration=[x])
    out = tmp_path / "bf.hexir"
    assert main(["quantize", "mlp", "-o", str(out), "--weights", "bf16"]) == 0
    loaded = hexir.load_model(str(out))  # its bfloat16 constants read back from the .npz
    assert any(op.result.type.dtype == "bfloat16" for op in loaded.ops)
    assert main(["run", str(out), "--check"]) == 0


def _numpy_int4(w: np.ndarray) -> np.ndarray:
    """The int4 scheme in numpy, dequantized: each 32 rows of a column [K, N] share a scale,
    max|w| / 7, the values rounded into -7..7."""
    k, n = w.shape
    top = np.abs(w).reshape(k // 32, 32, n).max(axis=1)
    scale = np.repeat(np.where(top > 0, top / 7, 1).astype(np.float32), 32, axis=0)
    return np.clip(np.rint(w / scale), -7, 7).astype(np.float32) * scale


@pytest.mark.parametrize("rows", [1, 8])
def test_int4_weights_compute_the_numpy_dequantized_product(rows, rng):
    # One row: the int4 kernel, weight and scales in column panels (8 bytes a weight of
    # float32's 32 read); eight rows: the weight dequantized at compile time, a matmul.
    w = rng.standard_normal((96, 160)).astype(np.float32)
    graph = _dense_graph(w, rows)
    quantized, layers = hexir.quantize(graph, weights="int4")
    assert [layer.shape for layer in layers] == [(160, 96)]
    (op,) = [op for op in quantized.ops if op.kind == "matmul_int4"]
    assert op.operands[1].type.shape == (80, 96) and op.operands[1].type.dtype == "uint8"
    assert op.operands[2].type.shape == (5, 96) and op.attr("group") == 32
    x = rng.standard_normal((rows, 160)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ _numpy_int4(w.T), 0)
    module = hexir.compile(quantized)
    kernels = {op.kind for op in module.graph.ops}
    assert ("matmul_int4" in kernels) == (rows == 1) and ("matmul" in kernels) == (rows > 1)
    for got in (evaluate(quantized, [x])[0], module.run([x])[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    exact = np.maximum(x @ w.T, 0)  # a few steps of 1/14 of a group's range away
    assert 0 < np.abs(want - exact).max() < 0.25 * np.abs(exact).max()
    assert layers[0].weight_error <= 1 / 14 + 1e-6


@pytest.mark.slow
def test_cli_quantize_int4_writes_a_model_an_eighth_the_size_that_runs(tmp_path, capsys):
    out = tmp_path / "decode-int4.hexir"
    assert main(["quantize", "gpt2-decode", "-o", str(out), "--weights", "int4"]) == 0
    report = capsys.readouterr().out
    assert "4 linear layers in int4, weights 27.00 -> 4.22 MiB" in report
    assert "float32 (weight-only)" in report
    loaded = hexir.load_model(str(out))
    assert sum(op.kind == "matmul_int4" for op in loaded.ops) == 4
    assert main(["run", str(out), "--check"]) == 0
