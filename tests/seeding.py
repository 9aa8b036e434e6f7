"""The running test's seeded random generator, for helpers that cannot take the `rng` fixture.

    from seeding import current_rng

    def rand(*shape):
        return current_rng().uniform(-1.0, 1.0, shape).astype(np.float32)

`current_rng()` is the same generator the test's `rng` fixture returns: seeded from the
test's node id, or from HEXIR_TEST_SEED when set (tests/conftest.py). Outside a test (at
import time, in a module- or session-scoped fixture) it raises: data shared between tests
would depend on which test ran first, so such data takes a fixed seed, `default_rng(0)`.
"""

from __future__ import annotations

import os
import zlib

import numpy as np

SEED_VARIABLE = "HEXIR_TEST_SEED"


class _Current:
    def __init__(self) -> None:
        self.seed: int | None = None
        self.generator: np.random.Generator | None = None


_current = _Current()


def seed_for(nodeid: str) -> int:
    """HEXIR_TEST_SEED if set, else a stable hash of the node id (never Python's salted hash)."""
    forced = os.environ.get(SEED_VARIABLE)
    if forced is None:
        return zlib.crc32(nodeid.encode())
    try:
        return int(forced)
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE}={forced!r}: expected an integer") from None


def start(seed: int) -> None:
    """Called by conftest before each test: its generator is made on first use."""
    _current.seed, _current.generator = seed, None


def stop() -> None:
    _current.seed, _current.generator = None, None


def current_rng() -> np.random.Generator:
    """The running test's generator, made from its seed on first use."""
    if _current.seed is None:
        raise RuntimeError(
            "current_rng() outside a test: data built at import time or in a module- or "
            "session-scoped fixture takes a fixed seed, np.random.default_rng(0)"
        )
    if _current.generator is None:
        _current.generator = np.random.default_rng(_current.seed)
    return _current.generator


def drawn() -> bool:
    """Whether the running test drew from its generator (then a failure prints its seed)."""
    return _current.generator is not None
