"""The rule a build follows to take a tuned schedule, said once for the tests that check it."""

import hexir
from hexir.database import Database
from hexir.graph.fusion import fused_kernels
from hexir.ir.graph import Graph
from hexir.ir.keys import candidate_key
from hexir.runtime.default_schedule import default_schedule
from hexir.runtime.executor import TUNED_MARGIN


def expected_schedule(db: Database, graph: Graph, workload_key: str, target: str = "cpu"):
    """("tuned" | "default", the best record): a build takes the database's best record of a
    workload unless the default schedule's own records stand within TUNED_MARGIN of it (or
    the best record is the default's)."""
    (best,) = db.best(workload_key, target, k=1)
    func = next(f for _, f in fused_kernels(graph)[1] if hexir.workload_key(f) == workload_key)
    default = db.standing(workload_key, target, candidate_key(default_schedule(func, target).func))
    takes = default is None or default.candidate_key == best.candidate_key
    takes = takes or best.median < (1 - TUNED_MARGIN) * default.median
    return ("tuned" if takes else "default"), best
