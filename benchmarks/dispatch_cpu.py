"""What calling the kernels costs: a module's commands from one native call (the native
command runner, hexir/runtime/native.py) with the caller's arrays bound in C (the native
binder, binder.py) or in Python (the `native_bind` knob off), against a call per command
from Python (the `native_run` knob off), side by side in one run.

    python benchmarks/dispatch_cpu.py [--rounds 5] [--models mlp gpt2-decode bert-base]

First an empty-kernel chain: `--chain` relus over 8 floats, unfused, so each command does
almost nothing and a run's time is the cost of calling the kernels; per-command overhead is
that time over the number of commands. Then whole zoo models (default schedules): each
one's end-to-end time (a plain `Module.run`) beside the sum of its kernels' times (the
native runner's clock between commands), both ways. Medians over rounds that alternate the
two ways (and which goes first), each round a median of `--repeats` runs. numpy's matmul
1024^3 is printed first and last (benchmarks/quiet.py): quote a run only when both are at
the machine's quiet level.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from quiet import numpy_matmul_line

import hexir
from hexir import knobs
from hexir.frontend import zoo
from hexir.runtime.module import Module


def chain(length: int) -> hexir.Graph:
    g = hexir.GraphBuilder("chain")
    x = g.input("x", (1, 8))
    for _ in range(length):
        x = g.relu(x)
    return g.build(x)


def both_ways(graph: hexir.Graph) -> dict[str, Module]:
    """The graph compiled once, as three modules that share its kernels: one runs natively
    from the caller's list to the outputs (the native binder, hexir/runtime/binder.py), one
    binds in Python around the native runner (`native_bind` off), one calls each kernel from
    Python (`native_run` off)."""
    native = hexir.compile(graph)
    ways = {"native": native}
    for way, knob in (("runner", "native_bind"), ("python", "native_run")):
        with knobs.scope(**{knob: False}):
            ways[way] = Module(
                native.graph,
                native.target,
                native.kernels,
                native.commands,
                native.constants,
                native.plan,
                native.report,
            )
            ways[way].run(inputs_of(graph))  # its buffers, made with the knob off
    return ways


def inputs_of(graph: hexir.Graph) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(v.type.shape).astype("float32") for v in graph.inputs]


def timings(module: Module, inputs: list[np.ndarray], repeats: int) -> tuple[float, float]:
    """Medians over `repeats`: a plain run's seconds end to end, and the sum of its
    commands' seconds (timed in place)."""
    for _ in range(2):
        module.run(inputs)
    ends, sums = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        module.run(inputs)
        ends.append(time.perf_counter() - start)
        sums.append(sum(module.run_timed(inputs)[1]))
    return statistics.median(ends), statistics.median(sums)


def measure(
    graph: hexir.Graph, rounds: int, repeats: int
) -> tuple[int, dict[str, tuple[float, float]]]:
    """The number of commands, and per way the medians over rounds of (end to end, sum of
    the commands)."""
    modules = both_ways(graph)
    inputs = inputs_of(graph)
    got: dict[str, list[tuple[float, float]]] = {way: [] for way in modules}
    for n in range(rounds):
        # Which way goes first alternates: the first of a pair runs on a colder machine.
        for way, module in sorted(modules.items(), reverse=n % 2 == 1):
            got[way].append(timings(module, inputs, repeats))
    medians = {
        way: (statistics.median(e for e, _ in t), statistics.median(s for _, s in t))
        for way, t in got.items()
    }
    return len(modules["native"].commands), medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--chain", type=int, default=200)
    parser.add_argument("--models", nargs="*", default=["mlp", "gpt2-decode", "bert-base"])
    args = parser.parse_args()
    print(numpy_matmul_line())

    with knobs.scope(fusion=False):
        n, got = measure(chain(args.chain), args.rounds, args.repeats)
    print(f"\nempty-kernel chain: {n} commands (relu over 8 floats, unfused)")
    print(f"{'way':8} {'end to end us':>14} {'per command us':>15}")
    for way, (end, _) in got.items():
        print(f"{way:8} {end * 1e6:14.1f} {end / n * 1e6:15.3f}")
    saved = (got["python"][0] - got["native"][0]) / n
    print(f"the native runner saves {saved * 1e6:.3f} us a command")
    bound = got["runner"][0] - got["native"][0]
    print(f"binding in C (the native binder) saves {bound * 1e6:.1f} us a run")

    print("\nzoo models, default schedules: end to end against the sum of the kernels")
    header = f"{'model':14} {'commands':>8} {'way':8} {'end to end ms':>14} {'kernels ms':>11}"
    print(f"{header} {'kernels / end':>13}")
    for name in args.models:
        commands, got = measure(zoo.zoo_model(name), args.rounds, max(args.repeats // 5, 5))
        for way, (end, kernels) in got.items():
            print(
                f"{name:14} {commands:8} {way:8} {end * 1e3:14.3f} {kernels * 1e3:11.3f} "
                f"{kernels / end:13.2f}"
            )
    print()
    print(numpy_matmul_line())


if __name__ == "__main__":
    main()
