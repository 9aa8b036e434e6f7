"""The runtime: targets, builds, kernels, compiled modules and their artifacts.

`hexir.runtime.load(path)` reads a module saved with `module.save(path)`.
"""

from hexir.runtime.artifact import load

__all__ = ["load"]
