"""NVRTC builds: CUBINs for sm_80 and sm_90, ptxas's resource report, errors and the cache."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from hexir import knobs
from hexir.errors import BuildError
from hexir.runtime import nvrtc
from hexir.runtime.nvrtc import CudaBinary, compile_cuda, parse_resources
from hexir.runtime.target import Target

SCALE = """\
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, int n) {
  __shared__ float tile[128];
  int i = blockIdx.x * 128 + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  if (i < n) y[i] = 2.0f * tile[127 - threadIdx.x];
}
"""

# 48 live accumulators: about 55 registers, so a cap of 24 makes ptxas spill.
SPILL = """\
extern "C" __global__ void spill(const float* __restrict__ a, float* __restrict__ b, int n) {
  float acc[48];
  #pragma unroll
  for (int i = 0; i < 48; ++i) acc[i] = a[threadIdx.x + i * 32];
  for (int k = 0; k < n; ++k) {
    #pragma unroll
    for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + 1) % 48] + a[k];
  }
  float t = 0.0f;
  #pragma unroll
  for (int i = 0; i < 48; ++i) t += acc[i];
  b[threadIdx.x] = t;
}
"""


@pytest.fixture
def cache(tmp_path):
    with knobs.scope(cache_dir=str(tmp_path)):
        yield tmp_path


def _files(path):
    return sorted(p.name for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compiles_a_cubin_for_the_arch(cache, arch):
    binary = compile_cuda(SCALE, Target(f"cuda -arch={arch}"), "scale")
    assert binary.cubin[:4] == b"\x7fELF" and binary.arch == arch
    assert f"-arch={arch}" in binary.options
    assert f"Compiling entry function 'scale' for '{arch}'" in binary.log
    resources = binary.resources
    assert resources["registers"] > 0
    assert resources["spill_bytes"] == 0 and resources["stack_bytes"] == 0
    assert resources["shared_bytes"] == 128 * 4
    assert binary.ptx is None  # not asked for


def test_spilling_kernel_reports_spill_bytes(cache):
    target = Target("cuda -arch=sm_90")
    free = compile_cuda(SPILL, target, "spill")
    capped = compile_cuda(SPILL, target, "spill", options=["--maxrregcount=24"])
    assert free.resources["spill_bytes"] == 0 and free.resources["registers"] > 24
    assert capped.resources["registers"] <= 24
    assert capped.resources["spill_bytes"] > 0 and capped.resources["stack_bytes"] > 0


def test_ptx_is_kept_when_asked(cache):
    target = Target("cuda -arch=sm_80")
    binary = compile_cuda(SCALE, target, "scale", keep_ptx=True)
    assert ".entry scale" in binary.ptx and ".target sm_80" in binary.ptx
    with knobs.scope(cuda_keep_ptx=True):
        assert compile_cuda(SCALE, target, "scale").ptx == binary.ptx
    assert compile_cuda(SCALE, target, "scale").ptx is None


def test_fast_math_knob_changes_the_build(cache):
    target = Target("cuda -arch=sm_90")
    plain = compile_cuda(SCALE, target, "scale")
    with knobs.scope(cuda_fast_math=True):
        fast = compile_cuda(SCALE, target, "scale")
    assert "--use_fast_math" in fast.options and "--use_fast_math" not in plain.options
    assert nvrtc.cache_key(SCALE, "scale", fast.options) != nvrtc.cache_key(
        SCALE, "scale", plain.options
    )


def test_compile_error_has_source_and_log_and_leaves_no_file(cache):
    source = SCALE.replace("2.0f * tile", "2.0f * * tile")
    with pytest.raises(BuildError) as info:
        compile_cuda(source, Target("cuda -arch=sm_90"), "scale")
    error = info.value
    assert error.source == source and "error" in error.log
    assert "2.0f * * tile" in str(error) and "NVRTC_ERROR_COMPILATION" in str(error)
    assert _files(cache) == []
    again = pickle.loads(pickle.dumps(error))
    assert again.source == source and again.log == error.log


def test_wrong_kernel_name_is_a_build_error(cache):
    with pytest.raises(BuildError, match="no kernel named 'scal'"):
        compile_cuda(SCALE, Target("cuda -arch=sm_90"), "scal")
    assert _files(cache) == []


def test_bad_option_is_a_build_error(cache):
    with pytest.raises(BuildError, match="NVRTC_ERROR_INVALID_OPTION"):
        compile_cuda(SCALE, Target("cuda -arch=sm_90"), "scale", options=["--no-such-flag"])


def test_second_build_hits_the_cache(cache, monkeypatch):
    target = Target("cuda -arch=sm_90")
    first = compile_cuda(SCALE, target, "scale")
    files = _files(cache)
    assert len(files) == 3 and {f.rsplit(".", 1)[1] for f in files} == {"cu", "cubin", "json"}

    def no_compiler(*args):
        raise AssertionError("NVRTC ran again")

    monkeypatch.setattr(nvrtc, "_invoke", no_compiler)
    second = compile_cuda(SCALE, target, "scale")
    assert second == first and second.cubin == first.cubin
    assert _files(cache) == files
    with pytest.raises(AssertionError, match="NVRTC ran again"):
        compile_cuda(SCALE, Target("cuda -arch=sm_80"), "scale")  # another arch: a new build


def test_failed_cache_write_leaves_no_half_written_file(cache, monkeypatch):
    """A write that dies mid-way (disk full, killed) leaves no file under a final name, and
    the next build compiles again instead of reading a broken entry."""
    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith(".json"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="No space left"):
        compile_cuda(SCALE, Target("cuda -arch=sm_90"), "scale")
    assert not any(f.endswith(".json") or f.startswith(".") for f in _files(cache))
    monkeypatch.setattr(os, "replace", real_replace)
    assert compile_cuda(SCALE, Target("cuda -arch=sm_90"), "scale").resources["registers"] > 0
    assert len(_files(cache)) == 3


def test_a_cpu_target_is_refused():
    with pytest.raises(BuildError, match="NVRTC builds for CUDA targets"):
        compile_cuda(SCALE, Target("cpu"), "scale")


def test_binary_pickles(cache):
    binary = compile_cuda(SCALE, Target("cuda -arch=sm_80"), "scale")
    assert pickle.loads(pickle.dumps(binary)) == binary
    assert isinstance(binary, CudaBinary)


def test_parse_resources_picks_the_named_entry():
    log = (
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'a' for 'sm_90'\n"
        "ptxas info    : Function properties for a\n"
        "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
        "ptxas info    : Used 32 registers, used 1 barriers, 16 bytes cumulative stack size, "
        "4096 bytes smem\n"
        "ptxas info    : Compiling entry function 'b' for 'sm_90'\n"
        "ptxas info    : Function properties for b\n"
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 12 registers, used 0 barriers\n"
    )
    assert parse_resources(log, "a") == {
        "registers": 32,
        "spill_bytes": 8,
        "shared_bytes": 4096,
        "stack_bytes": 16,
    }
    assert parse_resources(log, "b") == {
        "registers": 12,
        "spill_bytes": 0,
        "shared_bytes": 0,
        "stack_bytes": 0,
    }
    assert parse_resources(log, "c") is None


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(
    "source,name,options",
    [(SCALE, "scale", []), (SPILL, "spill", []), (SPILL, "spill", ["--maxrregcount=24"])],
)
def test_the_cubin_holds_what_ptxas_reports(cache, arch, source, name, options):
    """Registers, shared memory and the stack frame read from the image agree with ptxas's
    report; spills are not in the image, so there they are the frame (zero iff no spills)."""
    binary = compile_cuda(source, Target(f"cuda -arch={arch}"), name, options=options)
    read = nvrtc.cubin_resources(binary.cubin, name)
    reported = binary.resources
    assert read["registers"] == reported["registers"] > 0
    assert read["shared_bytes"] == reported["shared_bytes"]
    assert read["stack_bytes"] == reported["stack_bytes"]
    assert (read["spill_bytes"] > 0) == (reported["spill_bytes"] > 0)
    assert nvrtc.cubin_resources(binary.cubin, "nope") is None
    assert nvrtc.cubin_resources(b"not an image", name) is None


def test_a_build_whose_log_lacks_the_report_reads_the_cubin(cache, monkeypatch):
    real = nvrtc._invoke

    def silent(*args):  # NVRTC 13.0 on a GPU machine: the second build of a program logged nothing
        cubin, ptx, _ = real(*args)
        return cubin, ptx, ""

    monkeypatch.setattr(nvrtc, "_invoke", silent)
    binary = compile_cuda(SCALE, Target("cuda -arch=sm_90"), "scale")
    assert binary.resources == {"registers": binary.resources["registers"], "spill_bytes": 0,
                                "shared_bytes": 128 * 4, "stack_bytes": 0}  # fmt: skip
    assert binary.resources["registers"] > 0
    with pytest.raises(BuildError, match="no kernel named 'scal'"):
        compile_cuda(SCALE, Target("cuda -arch=sm_90"), "scal")


def test_missing_cuda_bindings_says_what_to_install(tmp_path):
    script = (
        "import sys\n"
        "sys.modules['cuda'] = sys.modules['cuda.bindings'] = None  # as if not installed\n"
        "from hexir import knobs\n"
        "from hexir.errors import BuildError\n"
        "from hexir.runtime.nvrtc import compile_cuda\n"
        "from hexir.runtime.target import Target\n"
        f"with knobs.scope(cache_dir={str(tmp_path)!r}):\n"
        "    try:\n"
        "        compile_cuda('', Target('cuda -arch=sm_90'), 'k')\n"
        "    except BuildError as e:\n"
        "        print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    message = result.stdout.strip()
    assert message.startswith("the cuda-bindings package is not installed")
    assert "pip install 'cuda-bindings" in message and "nvidia-cuda-nvrtc" in message
    assert "\n" not in message
