"""Every distinct convolution of ResNet-18 and ResNet-50 on the CPU: Hexir's default schedule
against im2col + numpy's matmul, side by side in one run.

    python benchmarks/conv_cpu.py [--models resnet18 resnet50] [--rounds 3]

For each distinct conv2d of the models (input shape, weight shape, stride, padding; batch
norm folded, every conv in its direct form), it times the conv2d workload
(`hexir.workload("conv2d", ...)`, no epilogue) with the default schedule, and the fused kernel
the model compiles it into (with its bias, residual add and relu); it prints GFLOP/s, the
fraction of the target's peak (`Target.peak()`), and im2col + numpy (the window view copied
into columns, then one matmul) timed in a subprocess (OpenBLAS's spinning threads slow
whatever runs next in-process). For a stride-1 3x3 conv it also times the one-conv graph
conv -> bias -> relu compiled whole in both forms, direct and Winograd F(m, 3) (m: the
layout pass's rule, or 2 where the rule keeps it direct), every kernel of each form; "wino
x" is the direct graph's time over the Winograd graph's (above 1: Winograd is faster).
Medians over `--rounds` alternating rounds; numpy's matmul 1024^3 is printed first and last:
quote a run only when both are at the machine's quiet level.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import Counter

import numpy as np
from quiet import numpy_matmul_line

import hexir
from hexir import knobs
from hexir.graph.fusion import fused_kernels
from hexir.graph.layout import WINOGRAD_MIN_TILES
from hexir.ops import op_flops
from hexir.ops.nn import conv_weight_shape
from hexir.runtime.default_schedule import default_schedule

NUMPY_CHILD = """
import json, statistics, sys, time
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
rng = np.random.default_rng(0)
results = []
for (n, c, h, w), (k, _, r, s), stride, pad in json.loads(sys.argv[1]):
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((k, c * r * s), dtype=np.float32)
    def conv():
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        win = sliding_window_view(xp, (r, s), axis=(2, 3))[:, :, ::stride, ::stride]
        cols = np.ascontiguousarray(win.transpose(1, 4, 5, 0, 2, 3)).reshape(c * r * s, -1)
        return wt @ cols
    conv(); conv()
    times = []
    while len(times) < 10 or sum(times) < 0.2:
        t = time.perf_counter(); conv(); times.append(time.perf_counter() - t)
    results.append(statistics.median(times))
print(json.dumps(results))
"""


def distinct_convs(models: list[str]) -> tuple[list[tuple], dict[tuple, object], Counter]:
    """The distinct convs (x shape, KCRS w shape, stride, padding) of the models, the fused
    kernel (func), its FLOPs and the conv's weight block where each first appears, and how
    many times each occurs."""
    convs: list[tuple] = []
    kernels: dict[tuple, object] = {}
    count: Counter = Counter()
    for name in models:
        with knobs.scope(winograd="0"):  # every conv direct: one conv2d kernel each
            _, groups = fused_kernels(hexir.load_model(name))
        for group, func in groups:
            for op in group.ops:
                if op.kind != "conv2d" or op.attr("groups") != 1:
                    continue
                x = op.operands[0].type.shape
                w = conv_weight_shape(op.operands[1].type.shape)  # KCRS, even if blocked
                key = (tuple(x), tuple(w), op.attr("stride")[0], op.attr("padding")[0])
                count[key] += 1
                if key not in kernels:
                    convs.append(key)
                    kernels[key] = (func, op_flops(op), op.attr("weight_block") or 0)
    return convs, kernels, count


def conv_workload(x: tuple, w: tuple, stride: int, pad: int, block: int) -> hexir.PrimFunc:
    """The plain conv2d (no epilogue) of input shape `x` and KCRS weight shape `w`, its
    weight in blocks of `block` filters as the model compiles it (0: KCRS)."""
    if block:
        k, c, r, s = w
        shapes = [x, (k // block, c, r, s, block)]
        return hexir.workload("conv2d", shapes=shapes, stride=stride, padding=pad,
                              weight_block=block)  # fmt: skip
    n, c, h, wd = x
    return hexir.workload("conv2d", N=n, C=c, H=h, W=wd, K=w[0], R=w[2], S=w[3],
                          stride=stride, padding=pad)  # fmt: skip


def time_func(func: hexir.PrimFunc, rng: np.random.Generator) -> float:
    kernel = hexir.build(default_schedule(func, "cpu").func)
    arrays = [rng.standard_normal(b.shape).astype(b.dtype) for b in func.params]
    kernel(*arrays)
    return kernel.time(*arrays)


def conv_graph(x: tuple, w: tuple, pad: int, rng: np.random.Generator) -> hexir.Graph:
    """conv (stride 1) -> bias -> relu of input shape `x`, KCRS weight shape `w`."""
    b = hexir.GraphBuilder("conv")
    weight = (rng.standard_normal(w) / np.sqrt(np.prod(w[1:]))).astype(np.float32)
    y = b.conv2d(b.input("x", x), b.constant(weight), padding=pad)
    bias = b.constant(rng.standard_normal(w[0]).astype(np.float32))
    return b.build(b.relu(b.bias_add(y, bias, axis=1)))


def winograd_tile_of(x: tuple, w: tuple, stride: int) -> int:
    """The tile a conv takes in its Winograd form here (0: none): the rule's, else F(2, 3)."""
    if w[2:] != (3, 3) or stride != 1 or x[1] != w[1]:
        return 0
    n, _, h, wd = x
    for m in (4, 2):
        if n * -(-h // m) * -(-wd // m) >= WINOGRAD_MIN_TILES:
            return m
    return 2


def time_module(graph: hexir.Graph, winograd: str, rng: np.random.Generator) -> float:
    with knobs.scope(winograd=winograd):
        module = hexir.compile(graph)
    x = rng.standard_normal(graph.inputs[0].type.shape).astype(np.float32)
    module.run([x])
    times = []
    while len(times) < 10 or sum(times) < 0.2:
        start = time.perf_counter()
        module.run([x])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(numpy_matmul_line(), flush=True)
    convs, kernels, count = distinct_convs(args.models)
    rng = np.random.default_rng(0)
    plain = {key: conv_workload(*key, kernels[key][2]) for key in convs}
    ours: dict[tuple, list[float]] = {key: [] for key in convs}
    fused: dict[tuple, list[float]] = {key: [] for key in convs}
    peer: dict[tuple, list[float]] = {key: [] for key in convs}
    tiles = {key: winograd_tile_of(key[0], key[1], key[2]) for key in convs}
    graphs = {key: conv_graph(key[0], key[1], key[3], rng) for key in convs if tiles[key]}
    direct: dict[tuple, list[float]] = {key: [] for key in graphs}
    winograd: dict[tuple, list[float]] = {key: [] for key in graphs}
    for _ in range(args.rounds):
        done = subprocess.run(
            [sys.executable, "-c", NUMPY_CHILD, json.dumps(convs)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        for key, seconds in zip(convs, json.loads(done.stdout), strict=True):
            peer[key].append(seconds)
        for key in convs:
            ours[key].append(time_func(plain[key], rng))
            fused[key].append(time_func(kernels[key][0], rng))
            if key in graphs:
                direct[key].append(time_module(graphs[key], "0", rng))
                winograd[key].append(time_module(graphs[key], str(tiles[key]), rng))
    peak = hexir.Target("cpu").peak()
    print(f"\nconv2d, float32, batch 1, default schedules; peak {peak.flops / 1e9:.1f} GFLOP/s")
    print(
        f"{'input':>16} {'weight':>16} {'s':>2} {'p':>2} {'x':>3} | {'ms':>7} {'GFLOP/s':>8} "
        f"{'of peak':>8} | {'fused kernel':>28} {'ms':>7} {'of peak':>8} | "
        f"{'im2col+numpy':>12} {'x numpy':>8} | {'graph ms':>8} {'wino':>6} {'ms':>7} "
        f"{'wino x':>6}"
    )
    for key in convs:
        x, w, stride, pad = key
        func, flops, _ = kernels[key]
        t, tf, tp = (statistics.median(d[key]) for d in (ours, fused, peer))
        g, gf = flops / t / 1e9, flops / tf / 1e9
        of, off = g * 1e9 / peak.flops, gf * 1e9 / peak.flops
        print(
            f"{'x'.join(map(str, x)):>16} {'x'.join(map(str, w)):>16} {stride:>2} {pad:>2} "
            f"{count[key]:>3} | {t * 1e3:7.3f} {g:8.1f} {of:8.0%} | "
            f"{func.name.removeprefix('fused_'):>28} {tf * 1e3:7.3f} {off:8.0%} | "
            f"{tp * 1e3:12.3f} {tp / t:8.2f} | {wino_columns(key, tiles, direct, winograd)}"
        )
    print(numpy_matmul_line())


def wino_columns(key: tuple, tiles: dict, direct: dict, winograd: dict) -> str:
    if key not in direct:
        return f"{'-':>8} {'-':>6} {'-':>7} {'-':>6}"
    td, tw = statistics.median(direct[key]), statistics.median(winograd[key])
    return f"{td * 1e3:8.3f} {'F(' + str(tiles[key]) + ',3)':>6} {tw * 1e3:7.3f} {td / tw:6.2f}"


if __name__ == "__main__":
    main()
