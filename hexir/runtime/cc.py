"""Build C source into a shared library with the system C compiler, cached on disk.

    path = compile_c(source, target)     # <cache_dir>/cc/<digest>.so, built once

The cache key is a digest of the source, the full command line's flags, the compiler's
`--version` output and what `-march=native` means on this machine (so a cache directory
shared between machines never hands one machine another's instructions). A library is
written to a temporary name and renamed into place: a failed or concurrent build never
leaves a half-written file under the final name.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from hexir import knobs
from hexir.errors import BuildError, TargetError
from hexir.runtime.target import Target, host_key

BASE_FLAGS = ("-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-fvisibility=hidden")
# errno is never read by a kernel; without this GCC will not vectorize sqrtf and friends.
MATH_FLAGS = ("-fno-math-errno",)
# Four of -O3's loop passes, off: a kernel's loops arrive tiled, unrolled and vectorized by its
# schedule, so these find little to do, and on a search's unrolled candidates they cost a
# third of GCC's time (33 conv candidates: 114 s of -O3, 80 s without them). The compiled
# zoo models ran at 0.96-1.05x the time without them (one process, the builds alternating;
# resnet50 1.045 then 1.017, vit 1.033 then 1.003 in a second run): within this host's noise.
# Before the knob's cflags, so that HEXIR_CFLAGS can turn any of them back on.
QUICK_FLAGS = (
    "-fno-tree-loop-distribution",
    "-fno-loop-unroll-and-jam",
    "-fno-predictive-commoning",
    "-fno-tree-partial-pre",
)


# A kernel's headers are compiled once, not in every kernel: a source whose leading includes
# are all PRECOMPILABLE (a kernel's, hexir/codegen/c.py) is compiled with a precompiled copy
# of them, built once for each set of headers, cache directory and flag set, under
# <cache_dir>/pch. GCC takes 0.6-0.7 s to read <immintrin.h> with -march=native (its many
# target pragmas; a 2-core AVX2 EPYC), five times what a small kernel takes in all, and its
# copy (1.4 s to build, 25 MB) is read in 0.07 s; the other headers cost a small kernel 16 of
# its 114 ms (their copy: 0.13 s, 4 MB). The library's machine code is the same; where the
# copy cannot be built or GCC finds it stale, GCC reads the headers themselves.
PRECOMPILABLE = frozenset({"math.h", "stdbool.h", "stdint.h", "stdlib.h", "omp.h", "immintrin.h"})


def compile_flags(target: Target) -> list[str]:
    """The compiler flags for `target`: the passes we leave out, the knobs' cflags, the
    target's, then ours."""
    cflags = shlex.split(knobs.get().cflags)
    return [*QUICK_FLAGS, *cflags, *target.cflags, *MATH_FLAGS, *BASE_FLAGS]


def compile_c(source: str, target: Target, include_dirs: Sequence[str] = ()) -> Path:
    """The path of a shared library built from `source`, from the cache when it is there;
    TargetError where `target` describes another CPU than this machine's. `include_dirs`:
    where headers beyond the system's are (Python's and numpy's, for the binder)."""
    here = host_key("cpu")
    if target.key != here:
        raise TargetError(
            f"target {target} ({target.key}) is another CPU than this machine's ({here}): its "
            "code is compiled with -march=native, so build it on a machine with that CPU"
        )
    cc = knobs.get().cc
    flags = [*compile_flags(target), *(f"-I{d}" for d in include_dirs)]
    digest = cache_key(source, cc, flags)
    directory = Path(knobs.get().cache_dir).expanduser() / "cc"
    path = directory / f"{digest}.so"
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".build-") as tmp:
        c_file = Path(tmp) / f"{digest}.c"
        c_file.write_text(source)
        so_file = Path(tmp) / f"{digest}.so"
        header = _precompiled_flags(cc, flags, directory.parent, _includes(source))
        result = _invoke([cc, *flags, *header, "-o", str(so_file), str(c_file)])
        if result.returncode != 0 or not so_file.exists():
            command = shlex.join([cc, *flags, "-o", f"{digest}.so", f"{digest}.c"])
            raise BuildError(
                f"the C compiler failed (exit {result.returncode}): {command}",
                source=source,
                log=result.stdout + result.stderr,
            )
        # The source beside the library, to read and rebuild by hand.
        os.replace(c_file, directory / f"{digest}.c")
        os.replace(so_file, path)
    return path


def cache_key(source: str, cc: str, flags: list[str]) -> str:
    digest = hashlib.sha256()
    for part in (source, cc, shlex.join(flags), compiler_version(cc), native_signature(cc)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def _includes(source: str) -> str:
    """`source`'s leading `#include` lines, where each names a PRECOMPILABLE header; "" where
    one does not (or there are none)."""
    lines = []
    for line in source.splitlines():
        if not line.startswith("#include <"):
            break
        if line.removeprefix("#include <").removesuffix(">") not in PRECOMPILABLE:
            return ""
        lines.append(line + "\n")
    return "".join(lines)


_precompile_lock = threading.Lock()
_precompile_failed: set[Path] = set()  # tried once in this process, not tried again


def _precompiled_flags(cc: str, flags: list[str], cache_dir: Path, includes: str) -> list[str]:
    """`-include` of a header of `includes`, beside its precompiled copy for this compiler
    and these flags (built here the first time); [] where there are none, the compiler is not
    GCC or the copy does not build."""
    if not includes or "Free Software Foundation" not in compiler_version(cc):  # GCC's format
        return []
    header = cache_dir / "pch" / cache_key(includes, cc, flags) / "hx_includes.h"
    copy = header.with_name(header.name + ".gch")  # where GCC looks for it
    with _precompile_lock:  # the threads of one build wait for one copy
        if (
            not copy.exists()
            and header not in _precompile_failed
            and not _precompile(cc, flags, header, copy, includes)
        ):
            _precompile_failed.add(header)
    return ["-include", str(header)] if copy.exists() else []


def _precompile(cc: str, flags: list[str], header: Path, copy: Path, includes: str) -> bool:
    header.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=header.parent, prefix=".build-") as tmp:
        text, built = Path(tmp) / header.name, Path(tmp) / copy.name
        text.write_text(includes)
        os.replace(text, header)  # whole: another process may be compiling with it
        try:
            result = _invoke([cc, *flags, "-x", "c-header", "-o", str(built), str(header)])
        except BuildError:  # past the compile timeout: the kernel reads the headers itself
            return False
        if result.returncode != 0 or not built.exists():
            return False
        os.replace(built, copy)  # whole, under its final name, or not at all
    return True


@functools.cache
def compiler_version(cc: str) -> str:
    """`cc --version`, once per process."""
    result = _invoke([cc, "--version"])
    if result.returncode != 0:
        raise BuildError(f"the C compiler {cc!r} does not run", log=result.stdout + result.stderr)
    return result.stdout


@functools.cache
def native_signature(cc: str) -> str:
    """What `-march=native` enables here: the compiler's target options, once per process."""
    result = _invoke([cc, "-march=native", "-Q", "--help=target"])
    return result.stdout if result.returncode == 0 else ""


def _invoke(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the compiler (tests replace this to count or forbid compiler runs)."""
    try:
        timeout = knobs.get().cc_timeout
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise BuildError(f"the C compiler {command[0]!r} was not found (set HEXIR_CC)") from e
    except subprocess.TimeoutExpired as e:
        raise BuildError(
            f"the C compiler took more than {timeout:g} s (HEXIR_CC_TIMEOUT): {shlex.join(command)}"
        ) from e
