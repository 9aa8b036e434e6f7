"""Targets, the build cache, argument checks and timing of CPU kernels."""

from __future__ import annotations

import ctypes
import pickle
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import hexir
from hexir import knobs
from hexir.errors import BuildError, HexirError, TargetError
from hexir.ir.tir import Binary, Buffer, BufferStore, FloatImm, For, PrimFunc, Var
from hexir.runtime import build as build_module
from hexir.runtime import build_cache, cc
from hexir.runtime import target as target_module
from hexir.runtime.build import build, build_all
from hexir.runtime.target import Target, host_key

# -- targets ------------------------------------------------------------------------------


def test_cpu_target():
    t = Target("cpu")
    assert t.kind == "cpu" and str(t) == "cpu" and Target(str(t)) == t
    assert t.features == tuple(sorted(t.features))
    assert t.vector_width == (16 if "avx512f" in t.features else 8 if "avx2" in t.features else 4)
    assert t.num_cores >= 1
    assert t.max_threads_per_block is None and t.warp_size is None  # no GPU limits on a CPU
    assert f"-march={t.arch}" in t.cflags
    assert re.fullmatch(r"cpu(-[a-z0-9_]+)+", t.key)
    assert socket.gethostname() not in t.key


def test_target_key_is_stable():
    assert Target("cpu").key == Target("cpu").key == Target.of("cpu").key
    assert Target("cuda -arch=sm_90").key == "cuda-sm_90"
    assert Target("  cuda   -arch=sm_86 ").key == "cuda-sm_86"


@pytest.mark.parametrize(
    "arch,optin", [("sm_80", 163), ("sm_86", 99), ("sm_89", 99), ("sm_90", 227)]
)
def test_cuda_targets(arch, optin):
    t = Target(f"cuda -arch={arch}")
    assert (t.kind, t.arch, str(t)) == ("cuda", arch, f"cuda -arch={arch}")
    assert Target(str(t)) == t and hash(Target(str(t))) == hash(t)
    assert t.max_threads_per_block == 1024 and t.warp_size == 32 and t.vector_width == 4
    assert t.max_shared_memory_per_block == 48 * 1024
    assert t.max_shared_memory_per_block_optin == optin * 1024
    assert t.max_registers_per_thread == 255


def test_plain_cuda_names_an_arch():
    t = Target("cuda")
    assert re.fullmatch(r"cuda -arch=sm_\d\d", str(t)) and Target(str(t)) == t


def test_target_pickles_and_of():
    t = Target("cuda -arch=sm_80")
    assert pickle.loads(pickle.dumps(t)) == t
    assert Target.of(t) is t


@pytest.mark.parametrize(
    "text",
    [
        "gpu", "", "cuda -arch=sm_70", "cuda -arch", "cuda sm_90", "cpu -mcpu=x", "CPU",
        "cpu -cores=4", "cpu -features=sse4", "cpu -features", "cpu -features=avx2 -cores=0",
        "cpu -features=avx2 -features=fma", "cpu -features=avx2 -cores=many",
    ],
)  # fmt: skip
def test_bad_target_strings(text):
    with pytest.raises(TargetError, match=r'valid targets are "cpu", "cuda"'):
        Target(text)


def another_cpu() -> Target:
    """A described CPU that is not this machine's (an ARM one here, an x86 one on ARM)."""
    other = "avx2,fma" if "neon" in Target("cpu").features else "neon"
    return Target(f"cpu -features={other} -cores=64")


def test_a_described_cpu_is_a_plain_value_never_probed(monkeypatch):
    def probe() -> None:
        raise AssertionError("a described CPU was probed")

    monkeypatch.setattr(target_module, "cpu_features", probe)
    monkeypatch.setattr(target_module, "_num_cores", probe)
    t = Target("cpu  -features=fma,avx512f,avx2 -cores=32")
    assert str(t) == "cpu -features=avx2,avx512f,fma -cores=32" and t.key == "cpu-avx2-avx512f-fma"
    assert (t.kind, t.arch, t.features) == ("cpu", "native", ("avx2", "avx512f", "fma"))
    assert (t.vector_width, t.vector_registers, t.num_cores) == (16, 32, 32)
    assert Target(str(t)) == t and hash(Target(str(t))) == hash(t)
    assert pickle.loads(pickle.dumps(t)) == t
    plain = Target("cpu -features=none")
    assert (str(plain), plain.key, plain.vector_width, plain.num_cores) == (
        "cpu -features=none -cores=1",
        "cpu-generic",
        4,
        1,
    )
    assert Target("cpu -features=") == plain


def test_a_target_crosses_to_another_machine_as_the_value_it_is(monkeypatch):
    here = Target("cpu")
    wire = pickle.dumps(here)
    # On a machine of another CPU, a fresh Target("cpu") probes that one; the one read from
    # the wire still describes the machine it was made on.
    monkeypatch.setattr(target_module, "cpu_features", lambda: ("neon",))
    there = pickle.loads(wire)
    assert there == here and there.key == here.key
    assert Target("cpu").key == host_key("cpu") == "cpu-neon" != here.key


def test_code_for_another_cpu_is_not_built_here(cache):
    other = another_cpu()
    assert other.key != host_key("cpu")
    with pytest.raises(TargetError, match=rf"{other.key}\) is another CPU than this machine"):
        build(axpy(), target=other)
    assert [p for p in cache.rglob("*") if p.is_file()] == []
    same = Target(f"cpu -features={','.join(Target('cpu').features) or 'none'} -cores=2")
    assert same.key == host_key("cpu") and build(axpy(), target=same).path.exists()


# -- build, cache ---------------------------------------------------------------------------

i = Var("i")


def axpy(n: int = 16, name: str = "axpy") -> PrimFunc:
    X, Y, Z = Buffer("X", (n,)), Buffer("Y", (n,)), Buffer("Z", (n,))
    body = BufferStore(Z, (i,), Binary("+", X[i] * FloatImm(2.0), Y[i]))
    return PrimFunc(name, (X, Y, Z), For(i, n, "parallel", body))


@pytest.fixture
def cache(tmp_path):
    with knobs.scope(cache_dir=str(tmp_path)):
        yield tmp_path


def test_build_runs_and_exposes_source(cache, rng):
    kernel = hexir.build(axpy(), target=hexir.Target("cpu"))
    x, y = rng.standard_normal(16, dtype=np.float32), rng.standard_normal(16, dtype=np.float32)
    z = np.full(16, np.nan, np.float32)
    kernel(x, y, z)
    np.testing.assert_allclose(z, 2 * x + y, rtol=1e-6)
    assert "void axpy(float* restrict X" in kernel.source
    assert kernel.func == axpy() and kernel.target == Target("cpu")


def test_second_build_hits_the_cache(cache, monkeypatch):
    first = build(axpy())
    libraries = sorted(p.name for p in (cache / "cc").iterdir())
    assert len(libraries) == 2  # the library and its source

    def no_compiler(command):
        raise AssertionError(f"the compiler ran again: {command}")

    monkeypatch.setattr(cc, "_invoke", no_compiler)
    second = build(axpy(), target="cpu")
    assert second.path == first.path
    assert sorted(p.name for p in (cache / "cc").iterdir()) == libraries


# SSE's min, in every x86-64 CPU: a source that includes <immintrin.h>.
MIN_SOURCE = """#include <immintrin.h>
__attribute__((visibility("default"))) void {name}(const float* a, const float* b, float* out) {{
  _mm_storeu_ps(out, _mm_min_ps(_mm_loadu_ps(a), _mm_loadu_ps(b)));
}}
"""


def _text(library: Path) -> bytes:
    """A library's machine code (its .text section)."""
    out = library.with_suffix(".text")
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.text", library, out], check=True)
    return out.read_bytes()


def test_sources_of_one_set_of_headers_share_one_precompiled_copy(cache, monkeypatch, rng):
    commands = []
    real_invoke = cc._invoke
    monkeypatch.setattr(
        cc, "_invoke", lambda command: commands.append(command) or real_invoke(command)
    )
    paths = [cc.compile_c(MIN_SOURCE.format(name=f"vmin{i}"), Target("cpu")) for i in range(2)]
    precompiles = [c for c in commands if "c-header" in c]
    assert len(precompiles) == 1  # the second source found the first one's copy
    builds = [c for c in commands if "c-header" not in c and c[-1].endswith(".c")]
    assert len(builds) == 2 and all("-include" in c for c in builds)
    for n in (8, 16):  # a kernel's headers (math.h, ...): another copy, for both
        build(axpy(n, f"axpy{n}"))
    assert sum("c-header" in c for c in commands) == 2 and "-include" in commands[-1]
    assert sorted(p.name for p in (cache / "pch").iterdir()) == sorted(
        {Path(c[-1]).parent.name for c in commands if "c-header" in c}
    )

    a, b = (rng.standard_normal(4).astype(np.float32) for _ in range(2))
    out = np.full(4, np.nan, np.float32)
    library = ctypes.CDLL(str(paths[1]))
    library.vmin1(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, out)))
    np.testing.assert_array_equal(out, np.minimum(a, b))

    # The same machine code as GCC makes reading the header itself.
    monkeypatch.setattr(cc, "_precompiled_flags", lambda *args: [])
    with knobs.scope(cache_dir=str(cache / "plain")):
        plain = cc.compile_c(MIN_SOURCE.format(name="vmin1"), Target("cpu"))
    assert "-include" not in commands[-1]
    assert _text(plain) == _text(paths[1])


def test_cache_key_covers_flags(cache):
    first = build(axpy())
    with knobs.scope(cflags="-O2"):
        second = build(axpy())
    assert first.path != second.path and first.source == second.source


def test_failing_compile_raises_and_leaves_no_file(cache):
    source = "void broken(float* A) { A[0] = ; }\n"
    with pytest.raises(BuildError) as info:
        cc.compile_c(source, Target("cpu"))
    error = info.value
    assert error.source == source and "error" in error.log
    assert "A[0] = ;" in str(error)
    assert [p for p in cache.rglob("*") if p.is_file()] == []
    again = pickle.loads(pickle.dumps(error))
    assert again.source == source and again.log == error.log


def test_build_all_runs_the_compiles_side_by_side_in_order(cache, monkeypatch, rng):
    running, most = 0, 0
    lock = threading.Lock()
    real_invoke = cc._invoke

    def counting(command):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            time.sleep(0.2)  # long enough for the other worker to start its compile
            return real_invoke(command)
        finally:
            with lock:
                running -= 1

    cc.compiler_version(knobs.get().cc), cc.native_signature(knobs.get().cc)  # cached first
    monkeypatch.setattr(cc, "_invoke", counting)
    funcs = [axpy(n, f"axpy{n}") for n in (8, 16, 24, 32)]
    with knobs.scope(build_workers=2):
        kernels = build_all(funcs)
    assert most == 2
    assert [k.func for k in kernels] == funcs
    for n, kernel in zip((8, 16, 24, 32), kernels, strict=True):
        x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        z = np.full(n, np.nan, np.float32)
        kernel(x, y, z)
        np.testing.assert_allclose(z, 2 * x + y, rtol=1e-6)


def test_build_all_raises_the_failure(cache, monkeypatch):
    real_invoke = cc._invoke

    def failing_one(command):
        if any("planted" in Path(part).read_text() for part in command if part.endswith(".c")):
            return subprocess.CompletedProcess(command, 1, "", "error: planted")
        return real_invoke(command)

    cc.compiler_version(knobs.get().cc), cc.native_signature(knobs.get().cc)
    monkeypatch.setattr(cc, "_invoke", failing_one)
    funcs = [axpy(8, "ok"), axpy(8, "planted"), axpy(16, "ok2")]
    with knobs.scope(build_workers=2), pytest.raises(BuildError, match="compiler failed"):
        build_all(funcs)


def test_build_all_raises_the_first_failure_in_order_a_printing_one_too(cache, monkeypatch):
    real_invoke, real_print = cc._invoke, build_module.c_source

    def failing_compile(command):
        if any("planted" in Path(part).read_text() for part in command if part.endswith(".c")):
            return subprocess.CompletedProcess(command, 1, "", "error: planted")
        return real_invoke(command)

    def failing_print(func, target="cpu", max_lines=None):
        if func.name == "unprintable":
            raise HexirError("planted: cannot print")
        return real_print(func, target, max_lines)

    cc.compiler_version(knobs.get().cc), cc.native_signature(knobs.get().cc)
    monkeypatch.setattr(cc, "_invoke", failing_compile)
    monkeypatch.setattr(build_module, "c_source", failing_print)
    with knobs.scope(build_workers=2):
        with pytest.raises(HexirError, match="cannot print"):
            build_all([axpy(8, "ok"), axpy(8, "unprintable"), axpy(8, "planted")])
        with pytest.raises(BuildError, match="compiler failed"):  # the compile before it
            build_all([axpy(16, "planted"), axpy(8, "unprintable")])


def test_a_build_again_reads_the_c_it_printed_from_the_cache(cache, monkeypatch, rng):
    printed: list[str] = []
    real_print = build_module.c_source

    def counting(func, target="cpu", max_lines=None):
        printed.append(func.name)
        return real_print(func, target, max_lines)

    monkeypatch.setattr(build_module, "c_source", counting)
    funcs = [axpy(8, "a8"), axpy(16, "a16")]
    with knobs.scope(build_workers=2):
        first = build_all(funcs)
        again = build_all(funcs)
        assert printed == ["a8", "a16"]  # the second build printed nothing
        assert [k.source for k in again] == [k.source for k in first]
        x, y = rng.standard_normal(16, dtype=np.float32), rng.standard_normal(16, dtype=np.float32)
        z = np.full(16, np.nan, np.float32)
        again[1](x, y, z)
        np.testing.assert_allclose(z, 2 * x + y, rtol=1e-6)
        # Another function of the same name, other knobs, other code: printed anew.
        X, Y, Z = Buffer("X", (8,)), Buffer("Y", (8,)), Buffer("Z", (8,))
        minus = PrimFunc("a8", (X, Y, Z), For(i, 8, "parallel", BufferStore(Z, (i,), X[i] - Y[i])))
        (kernel,) = build_all([minus])
        assert printed[2:] == ["a8"] and " - " in kernel.source
    with knobs.scope(build_workers=1):  # one at a time: the same cache
        assert [k.source for k in build_all(funcs)] == [k.source for k in first]
    with knobs.scope(build_workers=2):
        with knobs.scope(vector_math=not knobs.get().vector_math):
            build_all(funcs)
        assert printed[3:] == ["a8", "a16"]
        monkeypatch.setattr(build_cache, "_code_digest", lambda: "other code")
        build_all(funcs)
        assert printed[5:] == ["a8", "a16"]


def test_cuda_target_builds_a_cuda_kernel(cache):
    kernel = build(axpy(), target="cuda -arch=sm_90")  # NVRTC: no GPU needed to build
    assert type(kernel).__name__ == "CudaKernel" and "__global__" in kernel.source
    assert kernel.target == Target("cuda -arch=sm_90") and kernel.func == axpy()


# -- calls ------------------------------------------------------------------------------------


@pytest.fixture
def kernel(cache):
    return build(axpy())


@pytest.fixture
def arrays(rng):
    return [rng.standard_normal(16, dtype=np.float32) for _ in range(3)]


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: a[:2], r"takes 3 arrays \(X, Y, Z\), got 2"),
        (lambda a: [a[0], a[1].astype(np.float64), a[2]], r"parameter Y .* got a float64"),
        (lambda a: [a[0], a[1], np.empty(17, np.float32)], r"parameter Z .*shape \(16,\)"),
        (lambda a: [list(a[0]), a[1], a[2]], r"parameter X .* got a list"),
        (lambda a: [np.empty(32, np.float32)[::2], a[1], a[2]], r"parameter X .*non-contiguous"),
        (lambda a: [a[0], a[1], a[1]], r"output Z shares memory with parameter Y"),
    ],
)
def test_argument_errors_name_the_parameter(kernel, arrays, change, match):
    with pytest.raises(HexirError, match=match):
        kernel(*change(arrays))


def test_read_only_output(kernel, arrays):
    arrays[2].flags.writeable = False
    with pytest.raises(HexirError, match="output Z is read-only"):
        kernel(*arrays)


def test_time_returns_a_positive_median(kernel, arrays):
    with knobs.scope(timing_warmup=1, timing_repeats=3, timing_min_seconds=0.001):
        seconds = kernel.time(*arrays)
    assert seconds > 0
    np.testing.assert_allclose(arrays[2], 2 * arrays[0] + arrays[1], rtol=1e-6)


def test_thread_count_knob(kernel, arrays):
    for threads in (1, 2, 0):
        with knobs.scope(num_threads=threads):
            arrays[2][:] = 0
            kernel(*arrays)
            np.testing.assert_allclose(arrays[2], 2 * arrays[0] + arrays[1], rtol=1e-6)


def test_kernel_pickles(kernel, arrays):
    again = pickle.loads(pickle.dumps(kernel))
    again(*arrays)
    np.testing.assert_allclose(arrays[2], 2 * arrays[0] + arrays[1], rtol=1e-6)
    assert again.source == kernel.source and again.func == kernel.func


def test_a_compile_past_its_time_limit_is_a_build_error(tmp_path):
    """HEXIR_CC_TIMEOUT bounds every compile; a tuning build gets the (shorter) measurement
    build timeout, and a candidate that slow to compile is an error result, not a wait."""
    from hexir.schedule import Schedule
    from hexir.search.builders import CpuBuilder
    from hexir.search.measure import Candidate

    func = hexir.workload("matmul", M=8, N=8, K=8)
    with knobs.scope(cache_dir=str(tmp_path), cc_timeout=0.001):
        with pytest.raises(BuildError, match="HEXIR_CC_TIMEOUT"):
            build(func, "cpu")
    candidate = Candidate.from_schedule(func, Schedule(func, seed=0), Target("cpu"))
    with knobs.scope(cache_dir=str(tmp_path), measure_build_timeout=0.001):
        (result,) = CpuBuilder(workers=1).build([candidate])
    assert not result.ok and "took more than" in result.error_message
