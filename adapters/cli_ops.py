"""The ``fencekeeper op`` commands (durable operations, seed 001) and the operations part of ``modelcheck``.

Registered from ``cli.py``; the error and exit-code conventions are the
command line's own (``cli.py`` module header).
"""

from __future__ import annotations

import time

from fencekeeper.kernel import opsmodel

EXIT_OK = 0
EXIT_PROBLEM = 1


def modelcheck_operations() -> int:
    """Run the operation model checker's standard configurations; print as ``modelcheck`` does."""
    for title, bounds in opsmodel.STANDARD:
        started = time.perf_counter()
        result = opsmodel.explore(bounds)
        seconds = time.perf_counter() - started
        scope = "complete" if result.complete else f"to depth {result.depth}"
        print(
            f"{title}: {bounds.workers} workers, {bounds.submitters} submitters, {bounds.max_claims} claims, "
            f"ticks 0-{bounds.max_tick}: {result.states:,} states explored, {result.transitions:,} decisions, "
            f"{scope}, {seconds:.1f}s"
        )
        if result.violation is not None:
            print(f"VIOLATION {result.violation.invariant.value}: {result.violation.message}")
            print("shortest trace:")
            for number, label in enumerate(result.violation.trace, start=1):
                print(f"  {number:>2}. {label}")
            return EXIT_PROBLEM
        if not result.complete and bounds.max_depth is None:
            print(f"stopped at {bounds.max_states:,} states before the bounds were exhausted")
            return EXIT_PROBLEM
    print("every invariant of specs/operations.md held in every explored state and write")
    return EXIT_OK
