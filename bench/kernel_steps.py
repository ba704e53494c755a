"""Kernel steps per second on the execution machine, beside ``transitions`` on the same table.

Run it with ``python -m bench.kernel_steps`` (``make bench``).  One run:

1. builds one long legal random walk of execution events (seeded, so every
   run walks the same path) and restarts it from the initial state whenever
   the walk reaches a state with no way out;
2. checks, untimed, that the kernel and a ``transitions.Machine`` built from
   ``EXECUTION.spec`` pass through exactly the same states on that walk, so
   the two timings below measure the same work;
3. times ``EXECUTION.step(state, event)`` and ``model.trigger(event)`` over the
   whole walk, alternately, for several rounds, and prints both medians and
   their ratio against the target (the kernel at least 20 times faster);
4. when the target is missed (or with ``--profile``) shows where the
   kernel's time goes: an unprofiled breakdown of one step, then a cProfile
   listing.

The reference runs in the same process and the same rounds as the kernel so
that machine load, CPU frequency and interpreter version affect both alike:
only the ratio is meant to be compared between machines.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import platform
import pstats
import random
import statistics
import time
from collections.abc import Callable, Sequence
from importlib import metadata

from transitions import Machine as ReferenceMachine

from fencekeeper.kernel import EXECUTION, ExecutionEvent, ExecutionState

TARGET_RATIO = 20.0
"""The kernel must take at least this many steps for each ``transitions`` trigger."""

Walk = tuple[tuple[ExecutionEvent, ...], ...]
"""Segments of one walk; each segment starts at the initial state."""

NameWalk = tuple[tuple[str, ...], ...]
"""The same walk as event names, the vocabulary ``transitions`` triggers take."""


# --- the walk -------------------------------------------------------------------


def legal_walk(events: int, seed: int) -> Walk:
    """``events`` legal events in segments, each from the initial state to a dead end.

    A segment ends in a terminal state or in a review state with no event out
    of it (``suspended``): both are places a real execution stops, so the
    walk restarts from the initial state there instead of stopping.
    """
    rng = random.Random(seed)
    initial = EXECUTION.initial[0]
    segments: list[tuple[ExecutionEvent, ...]] = []
    current: list[ExecutionEvent] = []
    state = initial
    for _ in range(events):
        event = rng.choice(EXECUTION.events_from(state))
        current.append(event)
        state = EXECUTION.step(state, event)
        if not EXECUTION.events_from(state):
            segments.append(tuple(current))
            current = []
            state = initial
    if current:
        segments.append(tuple(current))
    return tuple(segments)


def event_names(walk: Walk) -> NameWalk:
    return tuple(tuple(str(event.value) for event in segment) for segment in walk)


# --- the two implementations ---------------------------------------------------------


class ReferenceModel:
    """The object ``transitions`` attaches its state and ``trigger`` to."""

    state: str
    trigger: Callable[[str], bool]


def reference_model() -> ReferenceModel:
    """A ``transitions.Machine`` over exactly the kernel's execution table."""
    spec = EXECUTION.spec
    model = ReferenceModel()
    ReferenceMachine(
        model=model,
        states=list(spec.states),
        transitions=[{"trigger": t.event, "source": t.source, "dest": t.target} for t in spec.transitions],
        initial=spec.initial[0],
        # Without this every state would also get a ``to_<state>`` trigger that
        # the kernel's table does not have.
        auto_transitions=False,
    )
    return model


def run_kernel(walk: Walk) -> ExecutionState:
    # Attribute lookups are hoisted out of the loop in both runners alike, so
    # the loops differ only in the call that takes a step.
    step = EXECUTION.step
    initial = EXECUTION.initial[0]
    state = initial
    for segment in walk:
        state = initial
        for event in segment:
            state = step(state, event)
    return state


def run_reference(model: ReferenceModel, walk: NameWalk) -> str:
    trigger = model.trigger
    initial = EXECUTION.spec.initial[0]
    for segment in walk:
        # The restart stores the state name on the model, which is what
        # ``Machine.set_state`` does after looking the name up: the cheapest
        # restart transitions allows, so it does not flatter the ratio.
        model.state = initial
        for event in segment:
            trigger(event)
    return model.state


def check_agreement(walk: Walk, names: NameWalk) -> None:
    """Both implementations pass through the same state after every event of the walk."""
    model = reference_model()
    initial = EXECUTION.initial[0]
    for number, (segment, segment_names) in enumerate(zip(walk, names, strict=True), start=1):
        state = initial
        model.state = str(initial.value)
        for event, name in zip(segment, segment_names, strict=True):
            state = EXECUTION.step(state, event)
            model.trigger(name)
            if model.state != state.value:
                raise SystemExit(
                    f"bench: segment {number}: after {name!r} the kernel is in {state.value!r} "
                    f"but transitions is in {model.state!r}; the timings would not be comparable"
                )


# --- timing -----------------------------------------------------------------------


def timed(run: Callable[[], object]) -> float:
    """Seconds ``run`` takes, with the cyclic garbage collector off (as ``timeit`` does).

    Collections would land in whichever loop happens to be running when a
    threshold is crossed; switching the collector off keeps that noise out
    of both measurements.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    finally:
        if enabled:
            gc.enable()


def measure(walk: Walk, names: NameWalk, rounds: int) -> tuple[list[float], list[float]]:
    """Steps per second of the kernel and of transitions, one pair per round, alternating."""
    steps = sum(len(segment) for segment in walk)
    model = reference_model()
    kernel_rates: list[float] = []
    reference_rates: list[float] = []
    for _ in range(rounds):
        kernel_rates.append(steps / timed(lambda: run_kernel(walk)))
        reference_rates.append(steps / timed(lambda: run_reference(model, names)))
    return kernel_rates, reference_rates


# --- diagnosis --------------------------------------------------------------------


def breakdown(walk: Walk) -> list[tuple[str, float]]:
    """Nanoseconds per step of each layer of ``EXECUTION.step``, unprofiled.

    Read the lines top to bottom: the bare loop, then hashing the two enum
    members alone (``Enum.__hash__`` is a Python function, called twice a
    step), then the table lookup (which includes those hashes), then the
    whole method.  The last line is the same lookup keyed by value strings,
    whose hashes Python computes in C and caches: the difference is what the
    enum hashes cost.
    """
    pairs: list[tuple[ExecutionState, ExecutionEvent]] = []
    for segment in walk:
        state = EXECUTION.initial[0]
        for event in segment:
            pairs.append((state, event))
            state = EXECUTION.step(state, event)
    table = EXECUTION.table
    step = EXECUTION.step
    by_value = {(str(s.value), str(e.value)): t for (s, e), t in table.items()}
    value_pairs = [(str(s.value), str(e.value)) for s, e in pairs]

    def loop_only() -> None:
        for _state, _event in pairs:
            pass

    def hash_both() -> None:
        for state, event in pairs:
            hash(state)
            hash(event)

    def lookup() -> None:
        for state, event in pairs:
            table[(state, event)]

    def full_step() -> None:
        for state, event in pairs:
            step(state, event)

    def lookup_by_value() -> None:
        for key in value_pairs:
            by_value[key]

    layers: Sequence[tuple[str, Callable[[], None]]] = (
        ("loop over (state, event) pairs", loop_only),
        ("hash(state) + hash(event) alone", hash_both),
        ("EXECUTION.table[(state, event)]", lookup),
        ("EXECUTION.step(state, event)", full_step),
        ("same lookup keyed by value strings", lookup_by_value),
    )
    # Best of five: the least disturbed run is the closest to the true cost.
    return [(label, min(timed(run) for _ in range(5)) / len(pairs) * 1e9) for label, run in layers]


def profile(walk: Walk) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(run_kernel, walk)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(8)
    return out.getvalue()


# --- report -----------------------------------------------------------------------


def _rate(value: float) -> str:
    return f"{value:>14,.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kernel_steps", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events in the walk (default 100000)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the walk (default 7)")
    parser.add_argument(
        "--profile", action="store_true", help="show where the kernel's time goes even if the target is met"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    if args.events < 1 or args.rounds < 1:
        parser.error("--events and --rounds must be at least 1")

    walk = legal_walk(args.events, args.seed)
    names = event_names(walk)
    check_agreement(walk, names)
    steps = sum(len(segment) for segment in walk)

    print("fencekeeper bench: kernel steps vs transitions triggers, execution machine")
    print(
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"transitions {metadata.version('transitions')}, attrs {metadata.version('attrs')}"
    )
    print(
        f"walk: {steps:,} legal events in {len(walk):,} segments (seed {args.seed}); "
        "both implementations agree on every state"
    )
    print()

    kernel_rates, reference_rates = measure(walk, names, args.rounds)
    print(f"{'round':>5}  {'kernel steps/s':>14}  {'transitions/s':>14}  {'ratio':>7}")
    for number, (k, r) in enumerate(zip(kernel_rates, reference_rates, strict=True), start=1):
        print(f"{number:>5}  {_rate(k)}  {_rate(r)}  {k / r:>6.1f}x")
    kernel = statistics.median(kernel_rates)
    reference = statistics.median(reference_rates)
    ratio = kernel / reference
    print(f"{'median':>5}  {_rate(kernel)}  {_rate(reference)}  {ratio:>6.1f}x")
    print()
    print(f"kernel: {1e9 / kernel:,.0f} ns a step; transitions: {1e9 / reference:,.0f} ns a trigger")
    met = ratio >= TARGET_RATIO
    verdict = "met" if met else "NOT met"
    print(f"target: kernel at least {TARGET_RATIO:.0f}x faster than transitions: {verdict} ({ratio:.1f}x)")

    if args.profile or not met:
        print()
        print("where a kernel step's time goes (ns a step, best of 5, unprofiled):")
        for label, nanoseconds in breakdown(walk):
            print(f"  {label:<40} {nanoseconds:>7.1f}")
        print()
        print("cProfile of one kernel walk (profiling inflates every Python-level call alike):")
        print(profile(walk))
    return 1 if args.check and not met else 0


if __name__ == "__main__":
    raise SystemExit(main())
