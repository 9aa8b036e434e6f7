"""The knobs of a small search with quick timing, for the tests of the tuning plumbing (not its
speed): a tiny population, rounds of four, three short repeats, and no second measurement of
a time the calibration kernel finds loaded (tests/search/test_calibration.py tests that)."""

SMALL_SEARCH = dict(
    search_population=24,
    search_generations=2,
    search_measure_per_round=4,
    timing_repeats=3,
    timing_min_seconds=0.002,
    measure_calibration_threshold=0.0,
)


def as_environment(knobs: dict[str, object]) -> dict[str, str]:
    """The same knobs as the environment variables `hexir` reads (HEXIR_ and the name)."""
    return {f"HEXIR_{name.upper()}": str(value) for name, value in knobs.items()}


def reading_executor(read):  # noqa: ANN001, ANN202 - a test helper
    """A LocalExecutor class whose every result, alone and in turn, is `read(candidate,
    result)`: what a tune reads where the host did something else."""
    from hexir.search.executor import LocalExecutor

    class Reading(LocalExecutor):
        def measure_each(self, candidates):
            for c, r in zip(candidates, super().measure_each(candidates), strict=True):
                yield read(c, r)

        def measure_in_turn(self, candidates):
            results = super().measure_in_turn(candidates)
            return [read(c, r) for c, r in zip(candidates, results, strict=True)]

    return Reading
