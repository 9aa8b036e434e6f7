"""The static GPU analyzer's table, no GPU needed: each reference schedule's shared-memory bank
conflicts, registers, spills, occupancy and the fraction of FP32 peak (tensor-core peak for
float16: mma.sync) its inner loop's issue mix allows, beside the best of a few sampled
schedules of the search space.

    python benchmarks/gpu_static.py [--arch sm_90] [--samples 32]

Every kernel is compiled with NVRTC (ptxas reports the registers and spills); the model is
hexir/codegen/gpu_analyze.py's (a ceiling of the issue mix, not a time). The last column of a
sampled row is how many of the draws were valid kernels.
"""

from __future__ import annotations

import argparse
import random

import hexir
from hexir.codegen.gpu_analyze import Report, analyze
from hexir.errors import HexirError
from hexir.runtime.target import Target
from hexir.schedule.handwritten import gpu_schedule
from hexir.search.space import SearchSpace

F16 = dict(dtype="float16")
WORKLOADS = [
    ("matmul 4096^3", "matmul", dict(M=4096, N=4096, K=4096)),
    ("matmul 4096^3 f16 (tensor cores)", "matmul", dict(M=4096, N=4096, K=4096, **F16)),
    ("dense BERT FFN f16 (tensor cores)", "dense", dict(M=128, N=3072, K=768, **F16)),
    ("dense 4096^3", "dense", dict(M=4096, N=4096, K=4096)),
    ("dense BERT FFN", "dense", dict(M=128, N=3072, K=768, bias=True)),
    ("batch_matmul 12x128x128x64", "batch_matmul", dict(B=12, M=128, N=128, K=64)),
    ("conv2d ResNet 3x3 64", "conv2d", dict(N=1, C=64, H=56, W=56, K=64, R=3, S=3, padding=1)),
    ("softmax 1536x128", "softmax", dict(M=1536, N=128)),
]


def row(label: str, report: Report, note: str = "") -> str:
    return (
        f"{label:42} {report.worst:6.0f} {report.registers:5d} {report.spill_bytes:6d} "
        f"{report.blocks_per_sm:5d} {report.occupancy:6.0%} {report.predicted:8.0%}  {note}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--samples", type=int, default=32)
    args = parser.parse_args()
    target = Target(f"cuda -arch={args.arch}")
    print(f"static analysis for {target} (no GPU needed)")
    print(f"{'kernel':42} {'confl':>6} {'regs':>5} {'spill':>6} {'blk/SM':>5} {'occup':>6} "
          f"{'of peak':>8}")  # fmt: skip
    for label, name, shape in WORKLOADS:
        func = hexir.workload(name, **shape)
        print(row(f"{label} (reference)", analyze(hexir.build(gpu_schedule(func).func, target))))
        best: Report | None = None
        valid = 0
        rng = random.Random(0)
        for _ in range(args.samples):
            try:
                sch = SearchSpace().sample_schedule(func, target, rng)
                report = analyze(hexir.build(sch.func, target))
            except HexirError:
                continue
            valid += 1
            if report.spill_bytes == 0 and (best is None or report.predicted > best.predicted):
                best = report
        if best is not None:
            print(row(f"{label} (best sampled)", best, f"{valid}/{args.samples} valid"))


if __name__ == "__main__":
    main()
