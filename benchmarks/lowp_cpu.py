"""Narrow types on the CPU: Hexir's float32, bfloat16 and int8 GEMMs of one shape beside numpy's
float32 (OpenBLAS, AVX-512 where the CPU has it) and ONNX Runtime's int8 MatMulInteger, in one
run.

    python benchmarks/lowp_cpu.py [--rounds 3] [--shapes 1024x1024x1024,2048x2048x2048]

For each shape M x K x N, an activation [M, K] times a constant weight [K, N], each through
`hexir.compile` with its default schedule:

- float32: float32 operands;
- bfloat16: bfloat16 operands into float32 (a CPU with AVX512_BF16 lays the weight out in pairs
  and runs vdpbf16ps, one with AMX tdpbf16ps on tiles: `sch.tensorize`,
  hexir/schedule/tensorize.py);
- int8: uint8 x int8 into int32 (MatMulInteger's import; VNNI's vpdpbusd, or AMX's tdpbusd,
  where the CPU has it), with ONNX Runtime running the same ONNX file beside it
  (benchmarks/int8_cpu.py's model).

numpy's float32 matmul of the shape runs in a fresh process (benchmarks/quiet.py). Times are
medians over `--rounds` rounds that alternate the runtimes, each a median of repeats for about
a second; bf16 / f32 and int8 / f32 are Hexir's float32 time over the narrow one (the issue's
bars: bfloat16 >= 1.6, int8 >= 2.5). The bfloat16 result is checked against float64 products
of the same bfloat16 values (relative error printed), the int8 one against ONNX Runtime's
(equal). numpy's matmul 1024^3 is printed first and last: quote a run only when both are at
the machine's quiet level.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from int8_cpu import (
    Shape,
    matmul_integer_model,
    max_diff,
    onnxruntime_version,
    operands,
    parse_shapes,
)
from models_cpu import THREADS, ms, onnxruntime_file, ratio, time_module
from quiet import has_avx512, numpy_matmul_line, numpy_matmul_seconds

import hexir
from hexir.runtime.target import Target

SHAPES: tuple[Shape, ...] = (
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (128, 768, 768),
    (128, 768, 3072),
    (197, 768, 3072),
    (1, 768, 3072),
)


@dataclass(frozen=True)
class Row:
    shape: Shape
    numpy: float  # seconds
    float32: float
    bfloat16: float
    bf16_error: float  # largest |hexir - float64 product| / largest |product|
    int8: float
    int8_ort: float | None
    int8_diff: int | None


def _float_module(x: np.ndarray, w: np.ndarray) -> hexir.Module:
    b = hexir.GraphBuilder("matmul")
    return hexir.compile(b.build(b.matmul(b.input("x", x.shape, x.dtype.name), b.constant(w))))


def bench(shape: Shape, rounds: int, peer: bool, folder: Path) -> Row:
    m, k, n = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    xb, wb = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)
    f32, bf16 = _float_module(x, w), _float_module(xb, wb)
    exact = xb.astype(np.float64) @ wb.astype(np.float64)
    error = float(np.abs(bf16.run([xb])[0] - exact).max() / np.abs(exact).max())
    ops = operands(shape)
    int8 = hexir.compile(hexir.import_onnx(matmul_integer_model(ops)))
    onnx.save(matmul_integer_model(ops), folder / "int8.onnx")
    feed = folder / "inputs.npz"
    np.savez(feed, a=ops.a)
    ours = int8.run([ops.a])[0]
    times: dict[str, list[float]] = {k: [] for k in ("numpy", "f32", "bf16", "int8", "ort")}
    diff = None
    for _ in range(rounds):  # alternating, so that a noisy spell hits every column
        coretype = "SkylakeX" if has_avx512() else None
        times["numpy"].append(numpy_matmul_seconds(m, n, k, coretype))
        if peer:
            seconds, (theirs,), _ = onnxruntime_file(folder / "int8.onnx", feed, folder)
            times["ort"].append(seconds)
            diff = max_diff(ours, theirs)
        times["f32"].append(time_module(f32, [x]))
        times["bf16"].append(time_module(bf16, [xb]))
        times["int8"].append(time_module(int8, [ops.a]))
    med = {key: statistics.median(t) if t else None for key, t in times.items()}
    return Row(shape, med["numpy"], med["f32"], med["bf16"], error, med["int8"], med["ort"], diff)


def print_table(rows: list[Row], version: str) -> None:
    target = Target("cpu")
    print(
        f"\nfloat32, bfloat16 and int8 GEMMs, default schedules ({target.key}; bf16 dot "
        f"{'on' if target.bf16_dot else 'off'}, int8 dot {'on' if target.int8_dot else 'off'}, "
        f"AMX bf16 {'on' if target.amx_bf16 else 'off'}, "
        f"int8 {'on' if target.amx_int8 else 'off'}; "
        f"ms, medians; ORT {THREADS} threads, ONNX Runtime {version}); G = GFLOP/s or GOP/s"
    )
    print(
        f"{'M x K x N':>16} {'numpy':>8} {'f32':>8} {'G':>5} {'bf16':>8} {'G':>5} "
        f"{'bf16/f32':>8} {'rel err':>8} {'int8':>8} {'G':>5} {'int8/f32':>8} "
        f"{'ORT int8':>9} {'x ORT':>6} {'|diff|':>6}"
    )
    for r in rows:
        m, k, n = r.shape
        work = 2 * m * k * n / 1e9
        print(
            f"{f'{m} x {k} x {n}':>16} {ms(r.numpy):>8} {ms(r.float32):>8} "
            f"{work / r.float32:>5.0f} {ms(r.bfloat16):>8} {work / r.bfloat16:>5.0f} "
            f"{r.float32 / r.bfloat16:>8.2f} {r.bf16_error:>8.1e} {ms(r.int8):>8} "
            f"{work / r.int8:>5.0f} {r.float32 / r.int8:>8.2f} {ms(r.int8_ort):>9} "
            f"{ratio(r.int8_ort, r.int8):>6} {'-' if r.int8_diff is None else r.int8_diff:>6}"
        )
    bf16 = sum(r.float32 / r.bfloat16 >= 1.6 for r in rows if r.shape[0] > 1)
    int8 = sum(r.float32 / r.int8 >= 2.5 for r in rows if r.shape[0] > 1)
    gemms = sum(r.shape[0] > 1 for r in rows)
    print(
        f"bars (GEMMs, M > 1): bf16 >= 1.6x f32 {bf16} of {gemms}; int8 >= 2.5x {int8} of {gemms}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    parser.add_argument(
        "--shapes", type=parse_shapes, default=SHAPES, help="M x K x N, e.g. 1024x1024x1024"
    )
    args = parser.parse_args()
    print(numpy_matmul_line(), flush=True)
    version = onnxruntime_version()
    rows = []
    for shape in args.shapes:
        print(f"{'x'.join(map(str, shape))} ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(bench(shape, args.rounds, version is not None, Path(tmp)))
    print_table(rows, version or "not installed")
    print(numpy_matmul_line())


if __name__ == "__main__":
    main()
