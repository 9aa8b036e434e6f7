"""Fit the polynomials of the C backend's vector math (hexir/codegen/c_math.py).

    python scripts/fit_math.py        # prints each polynomial's float32 coefficients

Each is a minimax fit by the Remez exchange, in float64 (ample for float32 results), of the
part of a function left once the leading terms are exact: the coefficients print lowest
degree first, as c_math.py writes them, with the fit's own error in float32 ulp (the error
of the float32 evaluation comes on top; tests/codegen/test_c_math.py measures the whole).
Needs numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

Fn = Callable[[np.ndarray], np.ndarray]
ULP1 = 2.0**-24  # the ulp of float32 values in [0.5, 1)


def remez(f: Fn, a: float, b: float, degree: int, weight: Fn, grid: int = 40000) -> np.ndarray:
    """Coefficients c (lowest first) minimizing max |weight(x) (f(x) - sum c_k x^k)| on
    [a, b], and the error reached, by the exchange algorithm on a dense grid."""
    n = degree + 1
    nodes = (a + b) / 2 - (b - a) / 2 * np.cos(np.pi * np.arange(n + 1) / n)
    xs = np.linspace(a, b, grid)
    fx, wx, vx = f(xs), weight(xs), np.vander(xs, n, increasing=True)
    for _ in range(60):
        signs = (-1.0) ** np.arange(n + 1) / weight(nodes)
        system = np.hstack([np.vander(nodes, n, increasing=True), signs[:, None]])
        coeffs = np.linalg.solve(system, f(nodes))[:-1]
        err = wx * (fx - vx @ coeffs)
        extrema = _alternating_extrema(err)
        if len(extrema) < n + 1:
            break
        nodes = xs[extrema[: n + 1]] if len(extrema) == n + 1 else xs[_trim(err, extrema, n + 1)]
    return coeffs, float(np.max(np.abs(err)))


def _alternating_extrema(err: np.ndarray) -> np.ndarray:
    """The index of the largest |err| in each run of one sign."""
    change = np.flatnonzero(np.diff(np.sign(err)) != 0) + 1
    runs = np.split(np.arange(len(err)), change)
    return np.array([run[np.argmax(np.abs(err[run]))] for run in runs])


def _trim(err: np.ndarray, extrema: np.ndarray, keep: int) -> np.ndarray:
    """Drop the smaller end extremum until `keep` remain (they still alternate)."""
    extrema = list(extrema)
    while len(extrema) > keep:
        extrema.pop(0 if abs(err[extrema[0]]) < abs(err[extrema[-1]]) else -1)
    return np.array(extrema)


def show(name: str, coeffs: np.ndarray, error: float) -> None:
    text = ", ".join(str(np.float32(c)) + "f" for c in coeffs)
    print(f"{name}: fit error {error / ULP1:.3f} ulp\n  {{{text}}}")


def exp_fit() -> None:
    # exp(r) = 1 + r + r^2 P(r) for |r| <= ln2/2; relative error of exp.
    h = math.log(2) / 2
    p = _series(lambda r: (np.exp(r) - 1 - r) / r**2, lambda r: 1 / 2 + r / 6 + r**2 / 24)
    show("exp P(r)", *remez(p, -h, h, 5, lambda r: r**2 / np.exp(r)))


def log_fit() -> None:
    # log1p(f) = f - f^2/2 + f^3 P(f) for f in [sqrt(1/2) - 1, sqrt(2) - 1]; relative error.
    p = _series(lambda f: (np.log1p(f) - f + f**2 / 2) / f**3, lambda f: 1 / 3 - f / 4 + f**2 / 5)
    lo, hi = math.sqrt(0.5) - 1, math.sqrt(2) - 1
    show("log P(f)", *remez(p, lo, hi, 8, lambda f: np.abs(f**3 / np.log1p(f))))


def tanh_fit() -> None:
    # tanh(x) = x + x^3 P(x^2) for |x| < 0.625; relative error of tanh, in z = x^2.
    def p(z: np.ndarray) -> np.ndarray:
        x = np.sqrt(z)
        return (np.tanh(x) - x) / (x * z)

    show("tanh P(z)", *remez(p, 1e-8, 0.625**2, 4, lambda z: np.sqrt(z) * z / np.tanh(np.sqrt(z))))


def erf_fit() -> None:
    erf, erfc = np.vectorize(math.erf), np.vectorize(math.erfc)

    # |x| < 0.875: erf(x) = x + x P(x^2) (x exact, so the small x P(x^2) carries the error);
    # relative error, in z = x^2.
    def p(z: np.ndarray) -> np.ndarray:
        x = np.sqrt(z)
        return erf(x) / x - 1

    show("erf small P(z)", *remez(p, 1e-8, 0.875**2, 5, lambda z: 1 / (1 + p(z))))
    # Beyond: erf(x) = 1 - Q(|x| - c), Q fit to erfc with absolute error (erf is in [0.78, 1),
    # ulp 2^-24 throughout); the shift by c keeps the float32 evaluation well conditioned.
    for lo, hi, c in ((0.875, 2.25, 1.5), (2.25, 3.92, 3.0)):
        q = remez(lambda t, c=c: erfc(t + c), lo - c, hi - c, 10, lambda t: 1 + 0 * t)
        show(f"erfc on [{lo}, {hi}) Q(|x| - {c})", *q)
    # Where erf rounds to 1 in float32: erfc(x) < 2^-25 (half the ulp below 1).
    x = np.float32(3.9)
    while math.erfc(float(x)) >= 2.0**-25:
        x = np.nextafter(x, np.float32(np.inf))
    print(f"erf(x) rounds to 1 from x = {x!r} ({x.view(np.uint32):#x})")


def _series(exact: Fn, near_zero: Fn) -> Fn:
    """`exact`, with its Taylor series where the cancellation in it loses precision."""
    return lambda x: np.where(np.abs(x) < 1e-3, near_zero(x), exact(np.where(x == 0, 1, x)))


if __name__ == "__main__":
    exp_fit()
    log_fit()
    tanh_fit()
    erf_fit()
