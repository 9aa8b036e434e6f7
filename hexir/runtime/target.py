"""Targets: what a kernel is compiled for, the limits a schedule must respect, and the key.

    Target("cpu")                  # this machine's CPU: features, -march, vector width, cores
    Target("cpu -features=avx2,fma -cores=8")   # a CPU described, not probed: another machine's
    Target("cuda")                 # the visible GPU's arch, or sm_90 where none is visible
    Target("cuda -arch=sm_80")
    Target("cpu").key              # "cpu-avx2-avx512f-fma": never a host name
    Target(str(t)) == t            # str() gives back a parsable string
    Target("cpu").peak()           # fp32 peak FLOP/s, and how it was obtained
    host_key("cpu")                # this machine's own key, whatever target is in hand

The key holds only what generated code depends on (DESIGN.md §2, Keys): the CPU's
instruction-set features that matter to codegen, or the CUDA arch.

A Target is a plain value: once made, nothing of it is probed again, so one pickled on the
tuning driver and read on another machine still describes the driver's CPU. "cpu" is the only
form that probes (the features of /proc/cpuinfo, the cores this process may use); a described
CPU names its features (or `none`) and its cores (1 where not given), so that a driver or a
test can hold the target of a machine it is not on. Code for a CPU target is compiled with
`-march=native`, so it is built and timed only on a machine whose key is the target's
(hexir/runtime/cc.py and the executors refuse any other).
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hexir import knobs
from hexir.errors import TargetError

if TYPE_CHECKING:
    from hexir.runtime.peak import Peak

# The instruction-set features that change the code we generate, in key order. Others
# (avx512_vnni: `Target.int8_dot`; avx512_bf16: `Target.bf16_dot`; bmi2, ...) do not change our
# C, so they stay out of the key.
CPU_FEATURES = ("avx2", "avx512f", "fma", "neon", "sve")

# Per CUDA arch: opt-in shared memory per block in bytes (cudaDevAttrMaxSharedMemoryPerBlockOptin).
CUDA_ARCHS: dict[str, int] = {
    "sm_80": 163 * 1024,
    "sm_86": 99 * 1024,
    "sm_89": 99 * 1024,
    "sm_90": 227 * 1024,
}
DEFAULT_CUDA_ARCH = "sm_90"
STATIC_SHARED_BYTES = 48 * 1024

_VALID_FORMS = (
    'valid targets are "cpu", "cuda" (the visible GPU\'s arch, else sm_90), '
    '"cpu -features=F,... -cores=N" (a CPU described, not probed: F of '
    + ", ".join(CPU_FEATURES)
    + ', or none) and "cuda -arch=sm_XX" with sm_XX one of '
    + ", ".join(CUDA_ARCHS)
)


@dataclass(frozen=True)
class Target:
    """A compilation target parsed from its string form; every other field is derived (and
    `text` made canonical: `str()` gives a form that parses back to an equal Target)."""

    text: str = "cpu"
    kind: str = field(init=False)  # "cpu" | "cuda"
    arch: str = field(init=False)  # CUDA: "sm_90"; CPU: the -march value ("native")
    features: tuple[str, ...] = field(init=False)  # sorted; CPU only
    vector_width: int = field(init=False)  # fp32 lanes of one vector
    vector_registers: int = field(init=False)  # CPU: architectural vector registers (CUDA: 0)
    # CPU: VNNI's 8-bit dot product (vpdpbusd), AVX512_BF16's bfloat16 one (vdpbf16ps) on
    # 512-bit vectors; probed, False where described. Not in the key: they decide a layout,
    # so the workload, not a kernel's C.
    int8_dot: bool = field(init=False)
    bf16_dot: bool = field(init=False)
    # CPU: AMX's tile multiplies of bfloat16s (tdpbf16ps) and of 8-bit integers (tdpbusd),
    # where the CPU has them and the kernel lets this process use the tile registers
    # (`amx_permitted`); probed, False where described. Not in the key: they decide a
    # schedule, and where the compiler does not target AMX the tiled nest runs as loops.
    amx_bf16: bool = field(init=False)
    amx_int8: bool = field(init=False)
    num_cores: int = field(init=False)  # CPU cores (CUDA: 0)
    # GPU limits; None on the CPU, where GPU-bound loops run serially and nothing limits them.
    max_threads_per_block: int | None = field(init=False)
    max_shared_memory_per_block: int | None = field(init=False)  # static __shared__ limit
    max_shared_memory_per_block_optin: int | None = field(init=False)
    max_registers_per_thread: int | None = field(init=False)
    warp_size: int | None = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TargetError(f"a target is a string, got {self.text!r}; {_VALID_FORMS}")
        words = self.text.split()
        if words and words[0] == "cpu":
            values = _cpu_fields(self.text, words[1:])
        elif words and words[0] == "cuda":
            values = _cuda_fields(self.text, words[1:])
        else:
            raise TargetError(f"unknown target {self.text!r}; {_VALID_FORMS}")
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, target: Target | str) -> Target:
        """`target` itself, or the Target its string names."""
        return target if isinstance(target, Target) else cls(target)

    @property
    def key(self) -> str:
        """A stable key of what generated code depends on: `cpu-avx2-avx512f-fma`, `cuda-sm_90`."""
        if self.kind == "cuda":
            return f"cuda-{self.arch}"
        return "-".join(("cpu", *self.features)) if self.features else "cpu-generic"

    def peak(self) -> Peak:
        """The fp32 peak FLOP/s and how it was obtained (hexir/runtime/peak.py): on the CPU
        derived from the cores, lanes and a clock measured once per machine (or the
        `cpu_peak_gflops` knob); on CUDA from a reference GPU of the arch."""
        from hexir.runtime.peak import cpu_peak, cuda_peak

        if self.kind == "cuda":
            return cuda_peak(self.arch)
        k = knobs.get()
        return cpu_peak(self, k.cpu_peak_gflops, k.cache_dir)

    @property
    def cflags(self) -> tuple[str, ...]:
        """Flags the C compiler needs for this target (CPU only)."""
        if self.kind != "cpu":
            return ()
        flags = [f"-march={self.arch}"]
        if "avx512f" in self.features:
            # GCC's default tuning often keeps to 256-bit vectors; 512-bit ones double the FMA
            # throughput on the machines we run on (PERFORMANCE.md).
            flags.append("-mprefer-vector-width=512")
        return tuple(flags)

    def __str__(self) -> str:
        return self.text


def _cpu_fields(text: str, options: list[str]) -> dict[str, object]:
    if options:
        features, cores = _described_cpu(text, options)
        text = f"cpu -features={','.join(features) or 'none'} -cores={cores}"
        int8_dot = bf16_dot = amx_bf16 = amx_int8 = False
    else:
        features, cores, text = cpu_features(), _num_cores(), "cpu"
        flags = _host_flags()
        int8_dot = "avx512f" in features and "avx512_vnni" in flags
        bf16_dot = "avx512f" in features and "avx512_bf16" in flags
        tiles = "amx_tile" in flags and amx_permitted()
        amx_bf16, amx_int8 = tiles and "amx_bf16" in flags, tiles and "amx_int8" in flags
    width = 16 if "avx512f" in features else 8 if "avx2" in features else 4
    return dict(
        text=text,
        kind="cpu",
        arch="native",
        features=features,
        vector_width=width,
        vector_registers=32 if "avx512f" in features else 16,  # x86-64: zmm0-31 or ymm/xmm0-15
        int8_dot=int8_dot,
        bf16_dot=bf16_dot,
        amx_bf16=amx_bf16,
        amx_int8=amx_int8,
        num_cores=cores,
        max_threads_per_block=None,
        max_shared_memory_per_block=None,
        max_shared_memory_per_block_optin=None,
        max_registers_per_thread=None,
        warp_size=None,
    )


def _described_cpu(text: str, options: list[str]) -> tuple[tuple[str, ...], int]:
    """The features and cores a "cpu -features=... -cores=N" target names."""
    given: dict[str, str] = {}
    for option in options:
        name, equals, value = option.partition("=")
        if name not in ("-features", "-cores") or not equals:
            raise TargetError(f"unknown target options in {text!r}; {_VALID_FORMS}")
        if name in given:
            raise TargetError(f"{name} is given twice in {text!r}; {_VALID_FORMS}")
        given[name] = value
    if "-features" not in given:
        raise TargetError(f"a described CPU names its features: {text!r}; {_VALID_FORMS}")
    names = given["-features"].split(",") if given["-features"] not in ("", "none") else []
    unknown = sorted(set(names) - set(CPU_FEATURES))
    if unknown:
        raise TargetError(f"unknown CPU features {', '.join(unknown)} in {text!r}; {_VALID_FORMS}")
    cores = given.get("-cores", "1")
    if not cores.isdigit() or int(cores) < 1:
        raise TargetError(f"-cores must be a positive count in {text!r}; {_VALID_FORMS}")
    return tuple(sorted(set(names))), int(cores)


def host_key(kind: str = "cpu") -> str | None:
    """The key of this machine's own target of `kind`, probed here, whatever target is in
    hand: its CPU's, or its visible GPU's (None where no GPU is visible)."""
    if kind == "cuda":
        arch = visible_cuda_arch()
        return None if arch is None else f"cuda-{arch}"
    return Target("cpu").key


def _cuda_fields(text: str, options: list[str]) -> dict[str, object]:
    if not options:
        arch = visible_cuda_arch() or DEFAULT_CUDA_ARCH
    elif len(options) == 1 and options[0].startswith("-arch="):
        arch = options[0].removeprefix("-arch=")
        if arch not in CUDA_ARCHS:
            raise TargetError(f"unknown CUDA arch {arch!r} in target {text!r}; {_VALID_FORMS}")
    else:
        raise TargetError(f"unknown target options in {text!r}; {_VALID_FORMS}")
    return dict(
        text=f"cuda -arch={arch}",
        kind="cuda",
        arch=arch,
        features=(),
        vector_width=4,
        vector_registers=0,
        int8_dot=False,
        bf16_dot=False,
        amx_bf16=False,
        amx_int8=False,
        num_cores=0,
        max_threads_per_block=1024,
        max_shared_memory_per_block=STATIC_SHARED_BYTES,
        max_shared_memory_per_block_optin=CUDA_ARCHS[arch],
        max_registers_per_thread=255,
        warp_size=32,
    )


@functools.cache
def cpu_features() -> tuple[str, ...]:
    """This machine's codegen-relevant CPU features, sorted (from /proc/cpuinfo or the compiler)."""
    return tuple(sorted(f for f in CPU_FEATURES if f in _host_flags()))


# Linux's arch_prctl request for an extended state component (ARCH_REQ_XCOMP_PERM) and AMX's
# tile data component (XFEATURE_XTILEDATA): a process must ask before its first tile
# instruction, which otherwise faults.
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18


@functools.cache
def amx_permitted() -> bool:
    """Whether the kernel lets this process use AMX's tile registers, asking it (once: the
    permission is the whole process's). A kernel with tile instructions asks again itself
    (hexir/codegen/c_amx.py), for a process that never probed."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0


@functools.cache
def _host_flags() -> frozenset[str]:
    """This machine's CPU flags, read once per process: every `Target("cpu")` asks (its
    features and `int8_dot`), and without /proc/cpuinfo the answer runs the compiler."""
    flags = _cpuinfo_flags()
    return frozenset(flags if flags is not None else _compiler_flags(knobs.get().cc))


def _cpuinfo_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    flags = set(value.split())
                    if "asimd" in flags:  # aarch64 spells NEON as asimd
                        flags.add("neon")
                    return flags
    except OSError:
        pass
    return None


def _compiler_flags(cc: str) -> set[str]:
    """Features from the macros `cc -march=native` predefines (where /proc/cpuinfo is missing)."""
    macros = {
        "__AVX2__": "avx2",
        "__AVX512F__": "avx512f",
        "__FMA__": "fma",
        "__ARM_NEON": "neon",
        "__ARM_FEATURE_SVE": "sve",
        "__AVX512VNNI__": "avx512_vnni",
        "__AVX512BF16__": "avx512_bf16",
    }
    try:
        out = subprocess.run(
            [cc, "-march=native", "-dM", "-E", "-"],
            input="",
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    defined = {line.split()[1] for line in out.splitlines() if line.startswith("#define ")}
    return {feature for macro, feature in macros.items() if macro in defined}


def _num_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.cache
def visible_cuda_arch() -> str | None:
    """The arch of GPU 0 through the CUDA driver, or None without a driver or a GPU."""
    try:
        from cuda.bindings import driver

        attr = driver.CUdevice_attribute
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS or count == 0:
            return None
        err, dev = driver.cuDeviceGet(0)
        _, major = driver.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev
        )
        _, minor = driver.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev
        )
    except Exception:  # noqa: BLE001 - no package, no driver or no device: all mean "none"
        return None
    return _supported_arch(f"sm_{major}{minor}")


def _supported_arch(arch: str) -> str:
    if arch in CUDA_ARCHS:
        return arch
    number = int(arch.removeprefix("sm_"))
    known = [a for a in CUDA_ARCHS if int(a.removeprefix("sm_")) <= number]
    if not known:
        raise TargetError(f"the visible GPU is {arch}; Hexir supports {', '.join(CUDA_ARCHS)}")
    # A newer GPU than we know runs the newest arch we know (through PTX).
    return max(known, key=lambda a: int(a.removeprefix("sm_")))
