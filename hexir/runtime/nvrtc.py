"""Build CUDA C into a CUBIN with NVRTC, cached on disk, with ptxas's resource report.

    binary = compile_cuda(source, Target("cuda -arch=sm_90"), "matmul")
    binary.cubin                  # the device image, for cuModuleLoadData
    binary.resources              # {"registers": 64, "spill_bytes": 0, "shared_bytes": 8192, ...}

NVRTC comes from the `cuda-bindings` package and the `nvidia-cuda-nvrtc` wheel, so kernels
compile on any machine, GPU or not. ptxas reports each entry function's registers, spills and
static shared memory in NVRTC's log (`--ptxas-options=-v`); that report is parsed into
`resources`. Builds are cached under `<cache_dir>/nvrtc`, keyed by the source, every option
and NVRTC's version; each file is written to a temporary name and renamed into place, so a
failed or concurrent build never leaves a half-written file under a final name.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hexir import knobs
from hexir.errors import BuildError
from hexir.runtime.build_cache import write_atomic
from hexir.runtime.target import Target

# ptxas optimizes at -O3 by default; saying it keeps the intent visible in the options (and the
# cache key). NVRTC itself has no -O flag: device optimization (-dopt) is on unless -G is given.
BASE_OPTIONS = ("--std=c++17", "--ptxas-options=-O3", "--ptxas-options=-v")
FAST_MATH = "--use_fast_math"

_INSTALL = (
    "NVRTC compiles CUDA kernels and needs no GPU: install the `cuda-bindings` package and the "
    "NVRTC library wheel that matches its major version, e.g. "
    "`pip install 'cuda-bindings>=12.6,<14' 'nvidia-cuda-nvrtc>=12.6,<14'` "
    "(both are dependencies of hexir; a CUDA toolkit on the library path works too)."
)


@dataclass(frozen=True)
class CudaBinary:
    """One compiled CUDA translation unit: the CUBIN and what ptxas said about its kernel.

    `resources` holds `registers` (per thread), `spill_bytes` (spill stores per thread),
    `shared_bytes` (static shared memory per block) and `stack_bytes` (local memory frame).
    """

    cubin: bytes
    ptx: str | None
    log: str
    resources: dict[str, int] = field(hash=False)
    arch: str
    options: tuple[str, ...] = ()


def compile_cuda(
    source: str,
    target: Target,
    name: str,
    options: Sequence[str] = (),
    keep_ptx: bool | None = None,
) -> CudaBinary:
    """Compile `source` for `target`'s arch into a CUBIN whose entry `name` is reported on.

    Options: ours (`-arch=sm_XX`, ptxas at -O3 and verbose), `--use_fast_math` when the
    `cuda_fast_math` knob is on, then `options`. The PTX is kept when `keep_ptx` (default:
    the `cuda_keep_ptx` knob). Raises BuildError with the source and NVRTC's log on failure.
    """
    if target.kind != "cuda":
        raise BuildError(f"NVRTC builds for CUDA targets; {str(target)!r} is not one")
    k = knobs.get()
    keep = k.cuda_keep_ptx if keep_ptx is None else keep_ptx
    flags = (f"-arch={target.arch}", *BASE_OPTIONS, *((FAST_MATH,) if k.cuda_fast_math else ()))
    flags = (*flags, *options)
    digest = cache_key(source, name, flags)
    directory = Path(k.cache_dir).expanduser() / "nvrtc"
    cached = _load(directory, digest)
    if cached is None:
        cubin, ptx, log = _invoke(source, name, flags)
        resources = parse_resources(log, name) or cubin_resources(cubin, name)
        if resources is None:
            raise BuildError(
                f"NVRTC built no kernel named {name!r} (neither ptxas's report nor the CUBIN "
                f"has it): "
                f'check the source\'s `extern "C" __global__` name',
                source=source,
                log=log,
            )
        cached = CudaBinary(cubin, ptx, log, resources, target.arch, flags)
        _store(directory, digest, source, cached)
    return cached if keep or cached.ptx is None else _without_ptx(cached)


def _without_ptx(binary: CudaBinary) -> CudaBinary:
    return CudaBinary(binary.cubin, None, binary.log, binary.resources, binary.arch, binary.options)


def cache_key(source: str, name: str, options: Sequence[str]) -> str:
    """The digest a build is cached under: source, entry name, options, NVRTC's version."""
    digest = hashlib.sha256()
    for part in (source, name, "\0".join(options), nvrtc_version()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


@functools.cache
def nvrtc_version() -> str:
    """NVRTC's `major.minor`, once per process; BuildError saying what to install without it."""
    nvrtc = _nvrtc()
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # noqa: BLE001 - the bindings raise several kinds when the .so is absent
        raise BuildError(f"the NVRTC library could not be loaded ({e}). {_INSTALL}") from e
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


# "ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, 400 bytes cmem[0]"
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_resources(log: str, name: str) -> dict[str, int] | None:
    """The ptxas report for entry function `name` in an NVRTC log, or None when it is absent."""
    sections = _ENTRY.split(log)
    # split gives [preamble, name1, text1, name2, text2, ...]
    reports = dict(zip(sections[1::2], sections[2::2], strict=True))
    text = reports.get(name)
    if text is None:
        return None
    stack = _STACK.search(text)
    used = _USED.search(text)
    smem = _SMEM.search(text)
    return {
        "registers": int(used.group(1)) if used else 0,
        "spill_bytes": int(stack.group(2)) if stack else 0,
        "shared_bytes": int(smem.group(1)) if smem else 0,
        "stack_bytes": int(stack.group(1)) if stack else 0,
    }


# The CUBIN's ELF: per-function attributes in the .nv.info section, each (format, attribute,
# then a u16 value, or for format 4 a u16 size and that many bytes); REGCOUNT and FRAME_SIZE
# hold (symbol index u32, value u32). On sm_90 a block's reserved shared memory (1 KB) is
# counted into .nv.shared.<name> where the image has a .nv.shared.reserved section.
_EIFMT_SVAL, _EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE = 4, 0x2F, 0x11
_RESERVED_SHARED = 1024


def cubin_resources(cubin: bytes, name: str) -> dict[str, int] | None:
    """The resources of entry function `name` read from the CUBIN itself, or None when the
    image has no such function: the fallback where NVRTC's log lacks ptxas's report (seen with
    NVRTC 13.0 on an H200 machine, where a program compiled a second time in one process logged
    nothing). The image does not record spill stores: `spill_bytes` is the stack frame there,
    zero exactly when the kernel uses no local memory."""
    try:
        sections = _elf_sections(cubin)
        symbols = _elf_symbols(cubin, sections)
    except (struct.error, ValueError, KeyError):
        return None
    if name not in symbols or f".text.{name}" not in sections:
        return None
    values: dict[int, int] = {}
    offset, size = sections.get(".nv.info", (0, 0))
    end = offset + size
    while offset + 4 <= end:
        fmt, attribute, length = struct.unpack_from("<BBH", cubin, offset)
        if fmt == _EIFMT_SVAL:
            if length == 8:
                symbol, value = struct.unpack_from("<II", cubin, offset + 4)
                if symbol == symbols[name] and attribute in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE):
                    values[attribute] = value
            offset += 4 + length
        else:
            offset += 4
    shared = sections.get(f".nv.shared.{name}", (0, 0))[1]
    if ".nv.shared.reserved.0" in sections and shared >= _RESERVED_SHARED:
        shared -= _RESERVED_SHARED
    frame = values.get(_EIATTR_FRAME_SIZE, 0)
    return {
        "registers": values.get(_EIATTR_REGCOUNT, 0),
        "spill_bytes": frame,
        "shared_bytes": shared,
        "stack_bytes": frame,
    }


def _elf_sections(elf: bytes) -> dict[str, tuple[int, int]]:
    """Each section of a 64-bit little-endian ELF image by name: (offset, size)."""
    if elf[:5] != b"\x7fELF\x02":
        raise ValueError("not a 64-bit ELF image")
    (table,) = struct.unpack_from("<Q", elf, 0x28)
    entry, count, names = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, table + i * entry) for i in range(count)]
    strings = headers[names][4]
    return {_string(elf, strings + h[0]): (h[4], h[5]) for h in headers}


def _elf_symbols(elf: bytes, sections: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Each symbol's index in .symtab, by name (names in .strtab)."""
    offset, size = sections[".symtab"]
    strings = sections[".strtab"][0]
    symbols = {}
    for index in range(size // 24):  # Elf64_Sym: name u32, info, other, shndx, value, size
        (name,) = struct.unpack_from("<I", elf, offset + 24 * index)
        symbols[_string(elf, strings + name)] = index
    return symbols


def _string(elf: bytes, start: int) -> str:
    return elf[start : elf.index(b"\0", start)].decode(errors="replace")


def _nvrtc():  # -> the cuda.bindings.nvrtc module
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise BuildError(f"the cuda-bindings package is not installed ({e}). {_INSTALL}") from e
    return nvrtc


def _check(err: object, call: str, log: str = "", source: str = "") -> None:
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        raise BuildError(f"NVRTC {call} failed: {text.decode()}", source=source, log=log)


def _invoke(source: str, name: str, options: Sequence[str]) -> tuple[bytes, str, str]:
    """Run NVRTC: (cubin, ptx, log). Tests replace this to count or forbid compiler runs."""
    nvrtc = _nvrtc()
    nvrtc_version()  # a missing library fails here, with what to install
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram", source=source)
    try:
        encoded = [o.encode() for o in options]
        (result,) = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        log = _read(nvrtc, program, "ProgramLog").decode(errors="replace").rstrip("\0")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, text = nvrtc.nvrtcGetErrorString(result)
            raise BuildError(
                f"NVRTC failed ({text.decode()}) with options {' '.join(options)}",
                source=source,
                log=log,
            )
        cubin = _read(nvrtc, program, "CUBIN")
        ptx = _read(nvrtc, program, "PTX").decode(errors="replace").rstrip("\0")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return cubin, ptx, log


def _read(nvrtc, program, what: str) -> bytes:  # noqa: ANN001 - NVRTC's own handle types
    """One of the program's outputs (ProgramLog, CUBIN, PTX) through its Size/Get pair."""
    err, size = getattr(nvrtc, f"nvrtcGet{what}Size")(program)
    _check(err, f"nvrtcGet{what}Size")
    buffer = b" " * size
    (err,) = getattr(nvrtc, f"nvrtcGet{what}")(program, buffer)
    _check(err, f"nvrtcGet{what}")
    return buffer


def _load(directory: Path, digest: str) -> CudaBinary | None:
    """The cached build, or None. The .json is written last: without it there is no entry."""
    meta_path, cubin_path = directory / f"{digest}.json", directory / f"{digest}.cubin"
    try:
        meta = json.loads(meta_path.read_text())
        cubin = cubin_path.read_bytes()
    except (OSError, ValueError):
        return None
    return CudaBinary(
        cubin,
        meta["ptx"],
        meta["log"],
        dict(meta["resources"]),
        meta["arch"],
        tuple(meta["options"]),
    )


def _store(directory: Path, digest: str, source: str, binary: CudaBinary) -> None:
    meta = {
        "arch": binary.arch,
        "options": list(binary.options),
        "log": binary.log,
        "resources": binary.resources,
        "ptx": binary.ptx,
    }
    directory.mkdir(parents=True, exist_ok=True)
    # The source beside the image, to read and to rebuild by hand; the .json last, as the entry.
    write_atomic(directory / f"{digest}.cu", source.encode())
    write_atomic(directory / f"{digest}.cubin", binary.cubin)
    write_atomic(directory / f"{digest}.json", json.dumps(meta).encode())
