"""int8 on the CPU: Hexir's MatMulInteger and QLinearMatMul against ONNX Runtime running the very
same ONNX models, beside Hexir's own float32 matmul of each shape; then whole models quantized by
ONNX Runtime's quantizer, run by both; in one run.

    python benchmarks/int8_cpu.py [--rounds 3] [--shapes 128x768x768,1x768x3072] [--models mlp]
    python benchmarks/int8_cpu.py --shapes none --models bert-base   # the models part only

For each shape M x K x N (default: bert's projection and MLP at 128 tokens, ViT's MLP at 197,
a decode GEMV, 1024^3) two ONNX models (opset 21) are built with onnx.helper, the weight an
int8 [K, N] initializer and the activation a uint8 [M, K] input:

- MatMulInteger(a, b, a_zero_point) -> int32 [M, N];
- QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, 0, y_scale, y_zero_point) -> uint8.

Hexir imports each (hexir.import_onnx) and compiles it with default schedules; ONNX Runtime
(CPU provider, 2 intra-op threads, all graph optimizations) runs the file in a subprocess of
its own, first, as in models_cpu.py. MatMulInteger's outputs must be equal, QLinearMatMul's
within 1 (the requantization's rounding); the table gives the largest difference, and a
mismatch makes the exit status 1. Hexir's float32 matmul of the shape (an input times a
constant, the dequantized operands) is timed beside them. Times are medians over `--rounds`
rounds that alternate the peer and Hexir, each a median of repeats for about a second; ratios
are the peer's time over Hexir's (above 1: Hexir is faster), and f32 / int8 is Hexir's float32
time over its MatMulInteger time (above 1: int8 is faster). Needs `pip install onnxruntime`
(the `bench` extra; without it, Hexir's columns only).

For each zoo model of `--models` (default: bert-base, gpt2, gpt2-decode, vit, mlp; `none`
skips the part) Hexir's ONNX export of the float32 graph is quantized by onnxruntime's
quantize_static (QDQ; uint8 activations, int8 per-channel weights; MatMul and Gemm only),
calibrated on a few seeded random input sets. ONNX Runtime runs both files; Hexir runs the
float32 graph and its import of the quantized file; rounds alternate as above. The table gives
the largest |Hexir - ONNX Runtime| over the QDQ outputs relative to the largest |float32
output|, and a line warns above 1e-2. A float difference before a QuantizeLinear can move a
value by a quantization step, so the two may differ by a few steps; where they differ more,
onnx's reference evaluator decides (on 2026-12-04, gpt2-decode's present keys: Hexir's
within 1e-7 of the reference, ONNX Runtime's 7e-2 off). QDQ x ORT is ONNX Runtime's QDQ time
over Hexir's, f32 / QDQ Hexir's float32 time over its QDQ time.

Then the same models with int8 weights and dynamically quantized activations (`--dynamic`, the
default; no data needed): Hexir's own `hexir.quantize` of the float32 graph (per-column int8
weights, uint8 activations quantized at every run) beside ONNX Runtime's quantize_dynamic of
the float32 file (the same scheme, MatMul and Gemm), each run by its own runtime, and Hexir's
import of ONNX Runtime's file too. int8 x ORT is ONNX Runtime's dynamic time over Hexir's own
int8 build, f32 / int8 Hexir's float32 time over it; err is each int8 model's largest |output
- float32 output| over the largest |float32 output| on the timed inputs (seed 0; Hexir's own
quantization takes no data, so these are held out by construction).

numpy's matmul 1024^3 is printed first and last (benchmarks/quiet.py): quote a run only when
both are at the machine's quiet level.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import logging
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from models_cpu import THREADS, inputs_of, ms, onnxruntime_file, ratio, save_feed, time_module
from onnx import TensorProto, helper
from quiet import numpy_matmul_line

import hexir
from hexir.frontend.zoo import ZOO
from hexir.runtime.module import Module

Shape = tuple[int, int, int]  # M x K x N
SHAPES: tuple[Shape, ...] = (
    (128, 768, 768),
    (128, 768, 3072),
    (128, 3072, 768),
    (197, 768, 3072),
    (1, 768, 3072),
    (1024, 1024, 1024),
)
OPSET = 21
MODELS = ("bert-base", "gpt2", "gpt2-decode", "vit", "mlp")
CALIBRATION_SETS = 4
TOLERANCE = 1e-2  # largest |Hexir QDQ - ORT QDQ| / largest |float32 output| without a warning


@dataclass(frozen=True)
class Operands:
    a: np.ndarray  # uint8 [M, K]
    b: np.ndarray  # int8 [K, N]
    a_zero: int
    a_scale: float
    b_scale: float
    y_scale: float
    y_zero: int


@dataclass(frozen=True)
class Row:
    shape: Shape
    integer: float  # seconds: Hexir's MatMulInteger
    integer_ort: float | None
    integer_diff: int | None  # largest |hexir - onnxruntime|
    qlinear: float
    qlinear_ort: float | None
    qlinear_diff: int | None
    float32: float


@dataclass(frozen=True)
class ModelRow:
    name: str
    float32: float  # seconds: Hexir on the float32 graph
    float32_ort: float
    qdq: float  # seconds: Hexir on its import of ONNX Runtime's quantized model
    qdq_ort: float
    rel_diff: float  # largest |Hexir QDQ - ORT QDQ| / largest |float32 output|


def parse_shapes(text: str) -> tuple[Shape, ...]:
    """`128x768x768,1x768x3072` as ((128, 768, 768), (1, 768, 3072)); `none` as ()."""
    if text.strip().lower() == "none":
        return ()
    shapes = []
    for item in text.split(","):
        dims = tuple(int(d) for d in item.strip().lower().split("x"))
        if len(dims) != 3:
            raise argparse.ArgumentTypeError(f"{item!r} is not a shape MxKxN")
        shapes.append((dims[0], dims[1], dims[2]))
    return tuple(shapes)


def parse_models(text: str) -> tuple[str, ...]:
    """`bert-base,mlp` as ("bert-base", "mlp"), zoo names; `none` as ()."""
    if text.strip().lower() == "none":
        return ()
    names = tuple(name.strip() for name in text.split(","))
    for name in names:
        if name not in ZOO:
            raise argparse.ArgumentTypeError(f"{name!r} is not a zoo model ({', '.join(ZOO)})")
    return names


def operands(shape: Shape, seed: int = 0) -> Operands:
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    b = rng.integers(-127, 128, (k, n), dtype=np.int8)
    a_scale, b_scale = float(rng.uniform(0.01, 0.05)), float(rng.uniform(0.01, 0.05))
    # The accumulator's spread is about 74 · 73 · sqrt(K) (two uniform bytes, K terms): y_scale
    # puts three of those in 127 steps, so that few outputs saturate and rounding is exercised.
    y_scale = 3 * 74 * 73 * float(np.sqrt(k)) * a_scale * b_scale / 127
    return Operands(a, b, int(rng.integers(120, 136)), a_scale, b_scale, y_scale, 128)


def _model(
    name: str, node: onnx.NodeProto, out: int, ops: Operands, inits: list[onnx.TensorProto]
) -> onnx.ModelProto:
    m, n = ops.a.shape[0], ops.b.shape[1]
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info("a", TensorProto.UINT8, list(ops.a.shape))],
        [helper.make_tensor_value_info("y", out, [m, n])],
        [helper.make_tensor("b", TensorProto.INT8, list(ops.b.shape), ops.b.tobytes(), raw=True)]
        + inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10  # opset 21's; a newer onnx writes one older runtimes refuse
    onnx.checker.check_model(model)
    return model


def matmul_integer_model(ops: Operands) -> onnx.ModelProto:
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zero"], ["y"])
    inits = [helper.make_tensor("a_zero", TensorProto.UINT8, [], [ops.a_zero])]
    return _model("matmul_integer", node, TensorProto.INT32, ops, inits)


def qlinear_matmul_model(ops: Operands) -> onnx.ModelProto:
    names = ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "y_scale", "y_zero"]
    node = helper.make_node("QLinearMatMul", names, ["y"])
    inits = [
        helper.make_tensor("a_scale", TensorProto.FLOAT, [], [ops.a_scale]),
        helper.make_tensor("a_zero", TensorProto.UINT8, [], [ops.a_zero]),
        helper.make_tensor("b_scale", TensorProto.FLOAT, [], [ops.b_scale]),
        helper.make_tensor("b_zero", TensorProto.INT8, [], [0]),
        helper.make_tensor("y_scale", TensorProto.FLOAT, [], [ops.y_scale]),
        helper.make_tensor("y_zero", TensorProto.UINT8, [], [ops.y_zero]),
    ]
    return _model("qlinear_matmul", node, TensorProto.UINT8, ops, inits)


def float_inputs_and_module(ops: Operands) -> tuple[list[np.ndarray], Module]:
    """Hexir's float32 matmul of the dequantized operands: an input times a constant."""
    x = ((ops.a.astype(np.float32) - ops.a_zero) * ops.a_scale).astype(np.float32)
    w = (ops.b.astype(np.float32) * ops.b_scale).astype(np.float32)
    builder = hexir.GraphBuilder("matmul")
    graph = builder.build(builder.matmul(builder.input("x", x.shape), builder.constant(w)))
    return [x], hexir.compile(graph)


def onnxruntime_version() -> str | None:
    try:
        return importlib.metadata.version("onnxruntime")
    except importlib.metadata.PackageNotFoundError:
        return None


def max_diff(ours: np.ndarray, theirs: np.ndarray) -> int:
    return int(np.abs(ours.astype(np.int64) - theirs.astype(np.int64)).max(initial=0))


def _median(times: list[float]) -> float | None:
    return statistics.median(times) if times else None


def bench_shape(shape: Shape, rounds: int, peer: bool, folder: Path) -> Row:
    ops = operands(shape)
    protos = {"integer": matmul_integer_model(ops), "qlinear": qlinear_matmul_model(ops)}
    modules = {kind: hexir.compile(hexir.import_onnx(p)) for kind, p in protos.items()}
    for kind, proto in protos.items():
        onnx.save(proto, folder / f"{kind}.onnx")
    feed = folder / "inputs.npz"
    np.savez(feed, a=ops.a)
    float_in, float_module = float_inputs_and_module(ops)
    ours = {kind: module.run([ops.a])[0] for kind, module in modules.items()}
    hexir_s: dict[str, list[float]] = {kind: [] for kind in [*modules, "float32"]}
    ort_s: dict[str, list[float]] = {kind: [] for kind in modules}
    diffs: dict[str, int] = {}
    # Rounds alternate the peer and Hexir, so that a noisy spell hits both; medians.
    for _ in range(rounds):
        for kind in modules:
            if peer:
                seconds, (theirs,), _ = onnxruntime_file(folder / f"{kind}.onnx", feed, folder)
                ort_s[kind].append(seconds)
                diffs[kind] = max_diff(ours[kind], theirs)
        for kind, module in modules.items():
            hexir_s[kind].append(time_module(module, [ops.a]))
        hexir_s["float32"].append(time_module(float_module, float_in))
    return Row(
        shape,
        statistics.median(hexir_s["integer"]),
        _median(ort_s["integer"]),
        diffs.get("integer"),
        statistics.median(hexir_s["qlinear"]),
        _median(ort_s["qlinear"]),
        diffs.get("qlinear"),
        statistics.median(hexir_s["float32"]),
    )


def _diff(value: int | None) -> str:
    return "-" if value is None else str(value)


def print_table(rows: list[Row], version: str) -> None:
    print(
        f"\nint8 matmul on the CPU ({os.cpu_count()} cores; ms, medians; ORT {THREADS} threads); "
        f"x ORT = ONNX Runtime's time / Hexir's (above 1: Hexir is faster); f32 / int8 = Hexir's "
        f"float32 time / its MatMulInteger time; ONNX Runtime {version}"
    )
    print(
        f"{'':>16} {'MatMulInteger':-^42} {'QLinearMatMul':-^34} {'float32':-^19}\n"
        f"{'M x K x N':>16} {'hexir':>9} {'GOP/s':>7} {'ORT':>9} {'x ORT':>7} {'|diff|':>6} "
        f"{'hexir':>9} {'ORT':>9} {'x ORT':>7} {'|diff|':>6} {'hexir':>9} {'f32/int8':>9}"
    )
    for r in rows:
        m, k, n = r.shape
        gops = 2 * m * k * n / r.integer / 1e9
        print(
            f"{f'{m} x {k} x {n}':>16} {ms(r.integer):>9} {gops:>7.1f} {ms(r.integer_ort):>9} "
            f"{ratio(r.integer_ort, r.integer):>7} {_diff(r.integer_diff):>6} {ms(r.qlinear):>9} "
            f"{ms(r.qlinear_ort):>9} {ratio(r.qlinear_ort, r.qlinear):>7} "
            f"{_diff(r.qlinear_diff):>6} {ms(r.float32):>9} {r.float32 / r.integer:>9.2f}"
        )


def mismatches(rows: list[Row]) -> list[str]:
    """The shapes whose outputs differ from ONNX Runtime's by more than allowed: MatMulInteger
    not at all, QLinearMatMul by at most 1 (the requantization's rounding)."""
    bad = []
    for r in rows:
        name = "x".join(map(str, r.shape))
        if r.integer_diff:
            bad.append(f"{name} MatMulInteger differs by {r.integer_diff}")
        if r.qlinear_diff is not None and r.qlinear_diff > 1:
            bad.append(f"{name} QLinearMatMul differs by {r.qlinear_diff}")
    return bad


class Calibration:
    """Seeded random input sets for quantize_static: a CalibrationDataReader by its get_next
    (that class's subclass hook), so this file imports without onnxruntime."""

    def __init__(self, graph: hexir.Graph, sets: int = CALIBRATION_SETS) -> None:
        names = [v.name for v in graph.inputs]
        # Seeds 1.., apart from the timed inputs' seed 0.
        feeds = [dict(zip(names, inputs_of(graph, s), strict=True)) for s in range(1, sets + 1)]
        self._feeds = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantize(graph: hexir.Graph, f32: Path, q: Path) -> None:
    """ONNX Runtime's static QDQ quantization of the MatMuls and Gemms of `f32` (the export of
    `graph`) into `q`: uint8 activations, int8 per-channel weights."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    with _quiet_root_logger():
        quantize_static(
            str(f32),
            str(q),
            Calibration(graph),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul", "Gemm"],
        )


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """ONNX Runtime's quantizers advise pre-processing the model, on the root logger."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def relative_diff(
    ours: list[np.ndarray], theirs: list[np.ndarray], float32: list[np.ndarray]
) -> float:
    """The largest |ours - theirs| over the outputs, each relative to its largest |float32|."""
    return max(
        float(np.abs(a.astype(np.float64) - b).max(initial=0.0))
        / max(float(np.abs(f).max(initial=0.0)), 1e-30)
        for a, b, f in zip(ours, theirs, float32, strict=True)
    )


def bench_model(name: str, rounds: int, folder: Path) -> ModelRow:
    graph = hexir.load_model(name)
    hexir.export_onnx(graph, folder / "f32.onnx")
    quantize(graph, folder / "f32.onnx", folder / "q.onnx")
    inputs, feed = inputs_of(graph), folder / "inputs.npz"
    save_feed(graph, inputs, feed)
    q_graph = hexir.import_onnx(onnx.load(folder / "q.onnx"))
    modules = {"f32": hexir.compile(graph), "q": hexir.compile(q_graph)}
    # Rounds alternate the peer and Hexir, so that a noisy spell hits both; medians.
    med, ort, theirs = _alternate(modules, ("f32", "q"), inputs, feed, folder, rounds)
    diff = relative_diff(modules["q"].run(inputs), theirs["q"], modules["f32"].run(inputs))
    return ModelRow(name, med["f32"], ort["f32"], med["q"], ort["q"], diff)


@dataclass(frozen=True)
class DynamicRow:
    name: str
    float32: float  # seconds: Hexir on the float32 graph
    float32_ort: float
    int8: float  # Hexir on hexir.quantize's graph
    int8_ort: float  # ONNX Runtime on its quantize_dynamic file
    imported: float  # Hexir on its import of that file
    error: float  # Hexir's int8 outputs against its float32 ones (relative, largest)
    error_ort: float


def bench_dynamic(name: str, rounds: int, folder: Path) -> DynamicRow:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = hexir.load_model(name)
    hexir.export_onnx(graph, folder / "f32.onnx")
    with _quiet_root_logger():
        quantize_dynamic(
            str(folder / "f32.onnx"),
            str(folder / "dyn.onnx"),
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul", "Gemm"],
        )
    inputs, feed = inputs_of(graph), folder / "inputs.npz"
    save_feed(graph, inputs, feed)
    quantized, _ = hexir.quantize(graph)
    modules = {
        "f32": hexir.compile(graph),
        "int8": hexir.compile(quantized),
        "imported": hexir.compile(hexir.import_onnx(onnx.load(folder / "dyn.onnx"))),
    }
    med, ort, theirs = _alternate(modules, ("f32", "dyn"), inputs, feed, folder, rounds)
    f32 = modules["f32"].run(inputs)
    return DynamicRow(
        name,
        med["f32"],
        ort["f32"],
        med["int8"],
        ort["dyn"],
        med["imported"],
        relative_diff(modules["int8"].run(inputs), f32, f32),
        relative_diff(theirs["dyn"], f32, f32),
    )


def _alternate(
    modules: dict[str, hexir.Module],
    files: tuple[str, ...],
    inputs: list[np.ndarray],
    feed: Path,
    folder: Path,
    rounds: int,
) -> tuple[dict[str, float], dict[str, float], dict[str, list[np.ndarray]]]:
    """Hexir's modules and ONNX Runtime on `folder`/<file>.onnx, rounds alternating them so
    that a noisy spell hits both: each side's median seconds by name, and ONNX Runtime's
    outputs."""
    hexir_s: dict[str, list[float]] = {kind: [] for kind in modules}
    ort_s: dict[str, list[float]] = {kind: [] for kind in files}
    theirs: dict[str, list[np.ndarray]] = {}
    for _ in range(rounds):
        for kind in files:
            seconds, theirs[kind], _ = onnxruntime_file(folder / f"{kind}.onnx", feed, folder)
            ort_s[kind].append(seconds)
        for kind, module in modules.items():
            hexir_s[kind].append(time_module(module, inputs))
    med = {kind: statistics.median(t) for kind, t in hexir_s.items()}
    return med, {kind: statistics.median(t) for kind, t in ort_s.items()}, theirs


def print_dynamic(rows: list[DynamicRow], version: str) -> None:
    print(
        f"\nint8 weights, activations quantized at every run: hexir.quantize beside ONNX "
        f"Runtime's quantize_dynamic (per-column int8 weights, MatMul and Gemm) on the CPU "
        f"({os.cpu_count()} cores; ms, medians; ORT {THREADS} threads); int8 x ORT = ONNX "
        f"Runtime's int8 time / Hexir's; f32 / int8 = Hexir's float32 time / its int8 time; "
        f"'ORT file' = Hexir running ONNX Runtime's quantized file; err = largest |int8 - "
        f"float32| / largest |float32| over the outputs; ONNX Runtime {version}"
    )
    print(
        f"{'model':<12} {'hexir f32':>10} {'ORT f32':>10} {'hexir int8':>10} {'ORT int8':>10} "
        f"{'ORT file':>9} {'int8 x ORT':>10} {'f32 / int8':>10} {'err':>8} {'ORT err':>8}"
    )
    for r in rows:
        print(
            f"{r.name:<12} {ms(r.float32):>10} {ms(r.float32_ort):>10} {ms(r.int8):>10} "
            f"{ms(r.int8_ort):>10} {ms(r.imported):>9} {ratio(r.int8_ort, r.int8):>10} "
            f"{r.float32 / r.int8:>10.2f} {r.error:>8.1e} {r.error_ort:>8.1e}"
        )


@dataclass(frozen=True)
class Int4Row:
    name: str
    float32: float  # seconds: Hexir on the float32 graph
    float32_ort: float
    int4: float  # Hexir on hexir.quantize(weights="int4")'s graph
    int4_ort: float  # ONNX Runtime on its MatMulNBits file
    error: float  # Hexir's int4 outputs against its float32 ones (relative, largest)
    error_ort: float


def bench_int4(name: str, rounds: int, folder: Path) -> Int4Row:
    """Weight-only int4, a scale per 32 rows of a column (symmetric) both ways: Hexir's
    matmul_int4 and ONNX Runtime's MatMulNBits (its quantizer's round-to-nearest, block 32,
    its default accuracy level)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from hexir.frontend.quantize import INT4_GROUP

    graph = hexir.load_model(name)
    hexir.export_onnx(graph, folder / "f32.onnx")
    with _quiet_root_logger():
        quantizer = MatMulNBitsQuantizer(
            onnx.load(folder / "f32.onnx"), block_size=INT4_GROUP, is_symmetric=True
        )
        quantizer.process()
        quantizer.model.save_model_to_file(str(folder / "int4.onnx"))
    inputs, feed = inputs_of(graph), folder / "inputs.npz"
    save_feed(graph, inputs, feed)
    quantized, _ = hexir.quantize(graph, weights="int4")
    modules = {"f32": hexir.compile(graph), "int4": hexir.compile(quantized)}
    med, ort, theirs = _alternate(modules, ("f32", "int4"), inputs, feed, folder, rounds)
    f32 = modules["f32"].run(inputs)
    return Int4Row(
        name,
        med["f32"],
        ort["f32"],
        med["int4"],
        ort["int4"],
        relative_diff(modules["int4"].run(inputs), f32, f32),
        relative_diff(theirs["int4"], f32, f32),
    )


def print_int4(rows: list[Int4Row], version: str) -> None:
    print(
        f"\nint4 weights (weight-only, symmetric, a scale per 32 rows of a column): "
        f"hexir.quantize(weights='int4') beside ONNX Runtime's MatMulNBits quantizer (block 32, "
        f"symmetric) on the CPU ({os.cpu_count()} cores; ms, medians; ORT {THREADS} threads); "
        f"int4 x ORT = ONNX Runtime's int4 time / Hexir's; f32 / int4 = Hexir's float32 time / "
        f"its int4 time; err = largest |int4 - float32| / largest |float32| over the outputs; "
        f"ONNX Runtime {version}"
    )
    print(
        f"{'model':<12} {'hexir f32':>10} {'ORT f32':>10} {'hexir int4':>10} {'ORT int4':>10} "
        f"{'int4 x ORT':>10} {'f32 / int4':>10} {'err':>8} {'ORT err':>8}"
    )
    for r in rows:
        print(
            f"{r.name:<12} {ms(r.float32):>10} {ms(r.float32_ort):>10} {ms(r.int4):>10} "
            f"{ms(r.int4_ort):>10} {ratio(r.int4_ort, r.int4):>10} "
            f"{r.float32 / r.int4:>10.2f} {r.error:>8.1e} {r.error_ort:>8.1e}"
        )


def print_models(rows: list[ModelRow], version: str) -> None:
    print(
        f"\nwhole models quantized by ONNX Runtime's quantize_static (QDQ, uint8 activations, int8 "
        f"per-channel weights, MatMul and Gemm) on the CPU ({os.cpu_count()} cores; ms, medians; "
        f"ORT {THREADS} threads); QDQ x ORT = ONNX Runtime's QDQ time / Hexir's (above 1: Hexir "
        f"is faster); f32 / QDQ = Hexir's float32 time / its QDQ time; rel diff = largest "
        f"|Hexir QDQ - ORT QDQ| / largest |float32 output|; ONNX Runtime {version}"
    )
    print(
        f"{'model':<12} {'hexir f32':>10} {'ORT f32':>10} {'hexir QDQ':>10} {'ORT QDQ':>10} "
        f"{'QDQ x ORT':>10} {'f32 / QDQ':>10} {'rel diff':>9}"
    )
    for r in rows:
        print(
            f"{r.name:<12} {ms(r.float32):>10} {ms(r.float32_ort):>10} {ms(r.qdq):>10} "
            f"{ms(r.qdq_ort):>10} {ratio(r.qdq_ort, r.qdq):>10} {r.float32 / r.qdq:>10.2f} "
            f"{r.rel_diff:>9.1e}"
        )
    for r in rows:
        if r.rel_diff > TOLERANCE:
            print(
                f"warning: {r.name}: Hexir's QDQ output differs from ONNX Runtime's by "
                f"{r.rel_diff:.1e} of the largest |float32 output| (above {TOLERANCE:g}): "
                "more than a few quantization steps; compare both with onnx's reference"
            )


def run_shapes(shapes: tuple[Shape, ...], rounds: int, version: str | None) -> list[str]:
    """The matmul part: its table, and its mismatches."""
    rows = []
    for shape in shapes:
        print(f"{'x'.join(map(str, shape))} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(bench_shape(shape, rounds, version is not None, Path(tmp)))
    print_table(rows, version or "not installed")
    bad = mismatches(rows)
    if version is not None:
        print("outputs: " + ("; ".join(bad) if bad else "equal (int32), within 1 (uint8)"))
    return bad


def run_models(names: tuple[str, ...], rounds: int, version: str, schemes: list[str]) -> None:
    parts = {
        "qdq": (bench_model, print_models),
        "dynamic": (bench_dynamic, print_dynamic),
        "int4": (bench_int4, print_int4),
    }
    for scheme in schemes:
        bench, show = parts[scheme]
        rows = []
        for name in names:
            print(f"{name} ({scheme}) ...", flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(bench(name, rounds, Path(tmp)))
        show(rows, version)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    parser.add_argument(
        "--shapes", type=parse_shapes, default=SHAPES, help="M x K x N, e.g. 128x768x768; none"
    )
    parser.add_argument(
        "--models", type=parse_models, default=MODELS, help="zoo models, e.g. bert-base,mlp; none"
    )
    parser.add_argument(
        "--schemes", default="qdq,dynamic",
        help="the whole models' quantizations: qdq (static, ONNX Runtime's), dynamic (int8 "
        "weights: hexir.quantize and ONNX Runtime's quantize_dynamic), int4 (weight-only: "
        "hexir.quantize and ONNX Runtime's MatMulNBits; needs onnx-ir), comma-separated",
    )  # fmt: skip
    args = parser.parse_args()
    schemes = [s for s in args.schemes.split(",") if s]
    if not set(schemes) <= {"qdq", "dynamic", "int4"}:
        parser.error(f"--schemes {args.schemes!r}: qdq, dynamic, int4, comma-separated")

    print(numpy_matmul_line(), flush=True)
    version = onnxruntime_version()
    if version is None:
        print("onnxruntime is not installed (pip install onnxruntime): Hexir's columns only")
    bad = run_shapes(args.shapes, args.rounds, version) if args.shapes else []
    if args.models and version is None:
        print("whole models: skipped (ONNX Runtime's quantizer makes their quantized form)")
    elif args.models:
        run_models(args.models, args.rounds, version, schemes)
    print(numpy_matmul_line())
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
