"""GPU tests: marked `gpu`, skipped cleanly where CUDA kernels cannot run.

The probe is cheap (import pycuda, initialize the driver, count devices; no context) and runs
once per session. `scripts/gpu_check.sh` runs `pytest -m gpu` after checking the same probe,
so on the GPU machine a skip cannot pass for a success.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _reason() -> str | None:
    from hexir.runtime.cuda_kernel import gpu_unavailable_reason

    return gpu_unavailable_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = _reason() if gpu_items else None
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason.split(". ")[0])
    for item in gpu_items:
        item.add_marker(skip)
