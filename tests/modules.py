"""A helper for tests that compare a module's ways of running."""

import hexir
from hexir.runtime.module import Module


def fresh_copy(module: Module, **changes: object) -> Module:
    """A new module of `module`'s kernels, commands, constants and plan, its buffers made
    under the knobs `changes` (native_run=False: a call per command from Python;
    native_bind=False: the native runner, bound in Python)."""
    with hexir.knobs.scope(**changes):
        again = Module(
            module.graph,
            module.target,
            module.kernels,
            module.commands,
            module.constants,
            module.plan,
            module.report,
        )
        again._cpu_buffers()
    return again
