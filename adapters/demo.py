"""``fencekeeper demo``: a short walk through the machines, driven by the real kernel.

Nothing here is scripted output: every line is what the kernel answered.
"""

from __future__ import annotations

from typing import TextIO

from fencekeeper.kernel.errors import IllegalTransition
from fencekeeper.kernel.machines import EXECUTION, MACHINES, ExecutionEvent, ExecutionState, dispatch_state_of

_HAPPY_PATH = (
    ExecutionEvent.CLAIM,
    ExecutionEvent.RECORD_STEP,
    ExecutionEvent.FINALIZE_WAITING,
    ExecutionEvent.WAKE,
    ExecutionEvent.CLAIM,
    ExecutionEvent.FINALIZE_SUCCEEDED,
)


def run(out: TextIO) -> None:
    out.write("fencekeeper: the machines\n\n")
    for machine in MACHINES.values():
        spec = machine.spec
        out.write(
            f"  {spec.name:<10} {len(spec.states)} states, {len(spec.transitions):>2} transitions"
            f"  (initial {', '.join(spec.initial)}; terminal {', '.join(spec.terminal)})\n"
        )
    out.write("\nAn execution and its dispatch row, one event at a time:\n\n")
    state = EXECUTION.initial[0]
    for event in _HAPPY_PATH:
        target = EXECUTION.step(state, event)
        out.write(
            f"  {state.value:<12} --{event.value:-<20}> {target.value:<12}"
            f" dispatch: {dispatch_state_of(target).value}\n"
        )
        state = target
    out.write("\nA terminal state is absorbing; the kernel refuses and nothing changes:\n\n")
    try:
        EXECUTION.step(ExecutionState.SUCCEEDED, ExecutionEvent.CLAIM)
    except IllegalTransition as exc:
        out.write(f"  refused [{exc.code}]: {exc}\n")
    out.write("\nSee each machine: fencekeeper diagram execution\n")
