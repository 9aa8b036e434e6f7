"""C identifiers: the exported kernel symbol and unique names for vars and buffers."""

from __future__ import annotations

import re

from hexir.ir.tir import PrimFunc

C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if "
    "inline int long register restrict return short signed sizeof static struct switch typedef "
    "union unsigned void volatile while bool true false main".split()
)
# Library names a kernel's identifiers must not shadow.
LIBRARY_NAMES = frozenset(
    "exp expf log logf sqrt sqrtf tanh tanhf erf erff fabs fabsf floor floorf ceil ceilf sin sinf "
    "cos cosf pow powf fmod fmodf abs llabs div ldiv free malloc exit aligned_alloc INFINITY NAN "
    "round roundf nearbyint nearbyintf rint rintf trunc truncf sign "
    "int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t "
    "omp_get_num_procs hexir_set_num_threads".split()
)


def kernel_symbol(func: PrimFunc) -> str:
    """The exported C name of `func`'s kernel."""
    name = _sanitize(func.name)
    return f"{name}_kernel" if name in C_KEYWORDS or name in LIBRARY_NAMES else name


def _sanitize(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", name) or "v"
    # Leading digits and underscores, and our own hx_ prefix, are not the user's to take.
    return f"v{name}" if name[0].isdigit() or name[0] == "_" or name.startswith("hx_") else name


class Names:
    """Unique C identifiers for vars and buffers (keyed by value: equal nodes share a name)."""

    def __init__(self, reserved: frozenset[str]):
        self._taken = set(reserved)
        self._names: dict[object, str] = {}

    def __call__(self, key: object, hint: str) -> str:
        if key not in self._names:
            base = name = _sanitize(hint)
            n = 1
            while name in self._taken:
                name, n = f"{base}_{n}", n + 1
            self._taken.add(name)
            self._names[key] = name
        return self._names[key]


# The C spelling of hextir's bitwise operators (hexir/ir/tir.py BIT_OPS).
BIT_OPERATORS = {"shl": "<<", "shr": ">>", "bitand": "&", "bitor": "|", "bitxor": "^"}
