"""The native command runner: a CPU module's whole command list in one C call.

    runner = NativeRunner(calls, num_bound, runner_library(target))  # once per module
    runner.bound[i] = array.ctypes.data     # per run: each input's and output's pointer
    runner.run()                            # every command, in order, from C
    seconds = runner.run(timed=True)        # the same, with each command's seconds

A module's commands are data: for each, the kernel's entry point and its argument pointers,
which the memory plan fixes once (the storages, the constants, each intermediate's offset in
its storage). The runner holds them in C arrays and one generated C function
(`hexir_run_commands`) walks them, calling each kernel through its entry point; per run, only
the graph's inputs and returned outputs (`bound`, the arrays a caller hands in and gets back)
are patched into their argument slots, in C, from one pointer array that Python fills. So a
run costs one ctypes call however many commands the module has, where a call per command
from Python costs about a microsecond plus a fraction per argument.

The runner is one shared library per target, built once from RUNNER_SOURCE through the build
cache (an artifact carries its image, so loading one needs no compiler). It calls a kernel of
n arguments through a pointer of type void (*)(void *, ..., void *) with n arguments: every
kernel takes only pointers (hexir/codegen/c.py), which the C calling conventions pass alike.
A kernel with more than MAX_ARGUMENTS arguments keeps its module on the per-command path.

With `seconds`, the runner reads the monotonic clock between commands and writes each
command's seconds: a profile's per-command times with no Python between the kernels.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path

from hexir.runtime.target import Target

__all__ = ["MAX_ARGUMENTS", "RUNNER_SOURCE", "NativeRunner", "runner_library"]

MAX_ARGUMENTS = 64
_ENTRY = "hexir_run_commands"


def _runner_source() -> str:
    cases = []
    for n in range(MAX_ARGUMENTS + 1):
        params = ", ".join(["void *"] * n) or "void"
        args = ", ".join(f"a[{i}]" for i in range(n))
        cases.append(f"    case {n}: ((void (*)({params}))fn)({args}); break;")
    return "\n".join(
        [
            "/* Hexir's native command runner (hexir/runtime/native.py). */",
            "#include <stdint.h>",
            "#include <time.h>",
            "",
            "static void call(void *fn, int64_t n, void *const *a) {",
            "  switch (n) {",
            *cases,
            "  }",
            "}",
            "",
            "static double now(void) {",
            "  struct timespec t;",
            "  clock_gettime(CLOCK_MONOTONIC, &t);",
            "  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;",
            "}",
            "",
            "/* Run `n` commands: command i calls fns[i] with arity[i] arguments, read in order",
            "   from `args`. First, slot patch_at[j] of `args` takes bound[patch_of[j]] (the",
            "   run's inputs and outputs). With `seconds`, each command's time is written. */",
            '__attribute__((visibility("default")))',
            f"void {_ENTRY}(int64_t n, void *const *fns, const int64_t *arity, void **args,",
            "                        int64_t patches, const int64_t *patch_at,",
            "                        const int64_t *patch_of, void *const *bound,",
            "                        double *seconds) {",
            "  for (int64_t j = 0; j < patches; ++j) args[patch_at[j]] = bound[patch_of[j]];",
            "  void *const *a = args;",
            "  double start = seconds ? now() : 0.0;",
            "  for (int64_t i = 0; i < n; ++i) {",
            "    call(fns[i], arity[i], a);",
            "    a += arity[i];",
            "    if (seconds) {",
            "      double end = now();",
            "      seconds[i] = end - start;",
            "      start = end;",
            "    }",
            "  }",
            "}",
            "",
        ]
    )


RUNNER_SOURCE = _runner_source()


def runner_library(target: Target) -> Path:
    """The runner's shared library for `target`, built once through the build cache."""
    from hexir.runtime.cc import compile_c

    return compile_c(RUNNER_SOURCE, target)


@functools.cache
def _entry(path: Path) -> ctypes._CFuncPtr:
    fn = getattr(ctypes.CDLL(str(path)), _ENTRY)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [i64, p, p, p, i64, p, p, p, p]
    fn.restype = None
    return fn


class NativeRunner:
    """A command list as C arrays, run in one call. `calls`: per command, its kernel's ctypes
    entry point, its argument pointers (0 where a bound value goes) and its bound slots, as
    (argument position, index into the per-run `bound` pointers)."""

    def __init__(
        self,
        calls: Sequence[tuple[ctypes._CFuncPtr, Sequence[int], Sequence[tuple[int, int]]]],
        num_bound: int,
        library: Path,
    ):
        self.num_commands = len(calls)
        flat: list[int] = []
        patch_at: list[int] = []
        patch_of: list[int] = []
        for _, pointers, slots in calls:
            patch_at.extend(len(flat) + position for position, _ in slots)
            patch_of.extend(index for _, index in slots)
            flat.extend(pointers)
        self._fns = (ctypes.c_void_p * len(calls))(
            *(ctypes.cast(fn, ctypes.c_void_p).value for fn, _, _ in calls)
        )
        self._arity = (ctypes.c_int64 * len(calls))(*(len(p) for _, p, _ in calls))
        self._args = (ctypes.c_void_p * max(len(flat), 1))(*flat)
        self._patch_at = (ctypes.c_int64 * max(len(patch_at), 1))(*patch_at)
        self._patch_of = (ctypes.c_int64 * max(len(patch_of), 1))(*patch_of)
        self._num_patches = len(patch_at)
        self.bound = (ctypes.c_void_p * max(num_bound, 1))()
        self._seconds = (ctypes.c_double * max(len(calls), 1))()
        self._entry = _entry(library)
        # The call's arguments, converted once: ctypes would convert each array per call.
        arrays = (self._fns, self._arity, self._args)
        patches = (self._patch_at, self._patch_of, self.bound)
        pointer = ctypes.c_void_p
        self._call = (
            ctypes.c_int64(self.num_commands),
            *(pointer(ctypes.addressof(a)) for a in arrays),
            ctypes.c_int64(self._num_patches),
            *(pointer(ctypes.addressof(a)) for a in patches),
        )
        self._timed = pointer(ctypes.addressof(self._seconds))
        self._untimed = pointer(None)

    def run(self, timed: bool = False) -> list[float] | None:
        """Every command, with `bound` (filled by the caller) patched in; with `timed`, each
        command's seconds."""
        self._entry(*self._call, self._timed if timed else self._untimed)
        return self.seconds() if timed else None

    def seconds(self) -> list[float]:
        """Each command's seconds in the last timed run."""
        return list(self._seconds[: self.num_commands])

    def call_addresses(self) -> dict:
        """What a caller in C needs to call the runner itself (the binder, binder.py): the
        entry point's address, its first seven arguments (the count, the command arrays and
        the patches, as integers), and the addresses of `bound` and of the seconds."""
        value = ctypes.c_void_p
        return {
            "entry": ctypes.cast(self._entry, value).value,
            "args": tuple(a.value or 0 for a in self._call[:7]),
            "bound": ctypes.addressof(self.bound),
            "seconds": ctypes.addressof(self._seconds),
        }

    @staticmethod
    def fits(arities: Sequence[int]) -> bool:
        """Whether every command's kernel takes few enough arguments for the runner."""
        return all(n <= MAX_ARGUMENTS for n in arities)
