"""Fixtures and checks shared by the schedule tests (STYLE.md's primitive idiom).

before = parse(ADD_1D)
sch = Schedule(before, seed=0)
...apply primitives...
assert sch.func == parse(EXPECTED)
check(sch, before)          # verify, text and trace round trips, replay, numerics
raises_unchanged(sch, lambda: sch.parallel(k))
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import numpy as np
import pytest
from seeding import current_rng

from hexir.errors import ScheduleError
from hexir.ir.dtype import numpy_dtype
from hexir.ir.tir import PrimFunc
from hexir.ir.verify import verify
from hexir.ops.parse import parse
from hexir.runtime.build import build
from hexir.schedule import Schedule, Trace

ADD_1D = """\
hextir.func @add(%A: buffer<1000xf32>, %B: buffer<1000xf32>, %C: buffer<1000xf32>) {
  for %i in 0..1000 serial {
    block @add(vi = spatial(1000) %i) reads(%A[vi], %B[vi]) writes(%C[vi]) {
      %C[vi] = %A[vi] + %B[vi]
    }
  }
}"""

# B is read transposed: unit stride in %i, stride 64 in %j.
ADD_2D = """\
hextir.func @add(%A: buffer<64x48xf32>, %B: buffer<48x64xf32>, %C: buffer<64x48xf32>) {
  for %i in 0..64 serial {
    for %j in 0..48 serial {
      block @add(vi = spatial(64) %i, vj = spatial(48) %j) reads(%A[vi, vj], %B[vj, vi]) writes(%C[vi, vj]) {
        %C[vi, vj] = %A[vi, vj] + %B[vj, vi]
      }
    }
  }
}"""  # noqa: E501

MATMUL = """\
hextir.func @matmul(%A: buffer<64x32xf32>, %B: buffer<32x48xf32>, %C: buffer<64x48xf32>) {
  for %i in 0..64 serial {
    for %j in 0..48 serial {
      for %k in 0..32 serial {
        block @matmul(vi = spatial(64) %i, vj = spatial(48) %j, vk = reduce(32) %k) reads(%A[vi, vk], %B[vk, vj]) writes(%C[vi, vj]) {
          init {
            %C[vi, vj] = 0.0
          }
          %C[vi, vj] = %C[vi, vj] + %A[vi, vk] * %B[vk, vj]
        }
      }
    }
  }
}"""  # noqa: E501

# Two blocks under one loop: %i holds more than %j, so %j cannot move out past it.
TWO_STAGE = """\
hextir.func @two(%A: buffer<16x8xf32>, %C: buffer<16x8xf32>) {
  alloc %T: buffer<16x8xf32>
  for %i in 0..16 serial {
    for %j in 0..8 serial {
      block @scale(vi = spatial(16) %i, vj = spatial(8) %j) reads(%A[vi, vj]) writes(%T[vi, vj]) {
        %T[vi, vj] = %A[vi, vj] * 2.0
      }
    }
    for %j2 in 0..8 serial {
      block @shift(vi2 = spatial(16) %i, vj2 = spatial(8) %j2) reads(%T[vi2, vj2]) writes(%C[vi2, vj2]) {
        %C[vi2, vj2] = %T[vi2, vj2] + 1.0
      }
    }
  }
}"""  # noqa: E501


def func(text: str) -> PrimFunc:
    parsed = parse(text)
    assert isinstance(parsed, PrimFunc)
    return parsed


def check(sch: Schedule, before: PrimFunc, *, numerics: bool = True) -> None:
    """The scheduled function verifies and round-trips as text; the trace round-trips through
    JSON and through its printed Python, and replays to an equal function; it computes what
    the unscheduled function computes."""
    after = sch.func
    verify_scheduled(after)
    assert parse(str(after)) == after
    trace = sch.trace
    assert Trace.from_json(trace.to_json()) == trace
    assert trace.apply(before).func == after
    fresh = Schedule(before, seed=0)
    exec(str(trace), {"sch": fresh})  # the printed trace is Python that rebuilds the schedule
    assert fresh.func == after and fresh.trace == trace
    if numerics:
        assert_same_numerics(before, after)


def verify_scheduled(f: PrimFunc) -> None:
    """verify(f): split predicates over the loop vars are part of the verifier's contract."""
    verify(f)


def assert_same_numerics(before: PrimFunc, after: PrimFunc) -> None:
    """On the running test's seeded inputs (seeding.current_rng())."""
    inputs = [_random(current_rng(), b.shape, numpy_dtype(b.dtype)) for b in before.inputs]
    outs = []
    for f in (before, after):
        # Poisoned outputs: anything a kernel forgets to write shows.
        out = [_poison(b.shape, numpy_dtype(b.dtype)) for b in f.outputs]
        build(f)(*inputs, *out)
        outs.append(out)
    for want, got in zip(*outs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(-50, 50, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _poison(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "f":
        return np.full(shape, np.nan, dtype)
    return np.full(shape, np.iinfo(dtype).min if dtype.kind in "iu" else True, dtype)


def raises_unchanged(sch: Schedule, fn: Callable[[], object], match: str = "") -> ScheduleError:
    """`fn` raises a ScheduleError and leaves the schedule as it was."""
    func, trace = sch.func, sch.trace
    with pytest.raises(ScheduleError, match=match) as info:
        fn()
    assert sch.func is func and sch.trace == trace
    err = info.value
    assert err.primitive and "\n" not in err.brief()
    assert str(pickle.loads(pickle.dumps(err))) == str(err)
    return err
