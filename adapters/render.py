"""How the command line shows things: rich on a terminal, plain text in a pipe, JSON when asked.

Rules of this module:

- Data goes to stdout, everything else (notes, progress, errors) to stderr,
  so that ``fencekeeper list --json | jq`` and ``ID=$(fencekeeper run ...)``
  see data alone.  With ``--json`` stdout holds exactly one JSON document.
- On a terminal, tables are rich tables and states are coloured (``NO_COLOR``
  turns colour off).  When the stream is not a terminal the same content is
  plain text: columns separated by two spaces, no colour codes, no box
  drawing, no trailing spaces and no wrapping, so that scripts and tests see
  stable lines whatever the terminal width.
- Text is built as :class:`rich.text.Text`, never as markup, so a reason or
  an identifier containing ``[`` is shown as it is.
- Stored values are shown, never obeyed: every string that reaches a line or
  a table goes through :func:`printable`, which spells control characters
  (C0, DEL, C1, so also terminal escape sequences), line and paragraph
  separators, bidirectional overrides and lone surrogates as ``\\xNN`` or
  ``\\uNNNN``, so a value cannot move the cursor, recolour the terminal,
  reorder what follows it or break a line in two.  ``--json`` is the exact
  form: JSON escapes control characters itself, and a lone surrogate is
  written as its ``\\uNNNN`` escape, which reads back as the same string.
- Nothing here decides anything: it shows values the kernel and the stores
  returned, and :func:`jsonable` turns them into JSON without losing a field.
"""

from __future__ import annotations

import enum
import json
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import IO, TYPE_CHECKING, Any, TextIO

import attrs

from fencekeeper.kernel import approvals, attempts
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.evidence import Evidence

from .store import ExecutionView

# rich is imported where something is drawn for a person, not here: a command
# that prints JSON (every worker a deployment runs) starts without it.
if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

STATE_STYLES: Mapping[str, str] = {
    "eligible": "cyan",
    "claimed": "blue",
    "running": "blue",
    "waiting": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "suspended": "magenta",
    "reconciliation_required": "bold red",
    # evidence states
    "pending": "yellow",
    "completed": "green",
    "approved": "green",
    "rejected": "red",
    "accepted": "green",
    "rejected_conflict": "yellow",
    "unknown": "bold red",
    "quarantined": "bold red",
    "issued": "blue",
}
REFUSED_STYLE = "bold red"
DIM = "dim"
TOKEN_PREFIX = 8
"""How much of a lease token is shown: enough to tell two claims apart, not enough to present."""


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _spelled(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: str) -> str:
    """``value`` with everything a terminal would obey rather than show spelled as an escape."""
    return _UNPRINTABLE.sub(_spelled, value)


def make_console(stream: TextIO) -> Console:
    """A console that is rich exactly when ``stream`` is a terminal."""
    return _console(stream, terminal=_isatty(stream))


def _console(stream: TextIO, *, terminal: bool) -> Console:
    from rich.console import Console  # noqa: PLC0415 - see TYPE_CHECKING above

    return Console(
        file=stream,
        force_terminal=terminal,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=True,
    )


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Output:
    """Where a command writes: data on stdout (or one JSON document), notes on stderr.

    Its two consoles are made when first used, so that a run that only writes
    JSON never imports rich; whether each stream is a terminal is decided
    here, when the Output is made, as making the console did.
    """

    def __init__(self, *, json_mode: bool = False, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self.json_mode = json_mode
        self._stdout = stdout or sys.stdout
        self._stderr = stderr or sys.stderr
        self._stdout_terminal = _isatty(self._stdout)
        self._stderr_terminal = _isatty(self._stderr)
        self._out: Console | None = None
        self._err: Console | None = None
        # Worker threads write notes: each stream gets exactly one console, whose lock keeps their lines whole.
        self._making = threading.Lock()

    @property
    def out(self) -> Console:
        """The console on stdout."""
        if self._out is None:
            with self._making:
                if self._out is None:
                    self._out = _console(self._stdout, terminal=self._stdout_terminal)
        return self._out

    @property
    def err(self) -> Console:
        """The console on stderr."""
        if self._err is None:
            with self._making:
                if self._err is None:
                    self._err = _console(self._stderr, terminal=self._stderr_terminal)
        return self._err

    @property
    def terminal(self) -> bool:
        """Whether stdout is a terminal (``out.is_terminal``, without making the console)."""
        return self._stdout_terminal

    @property
    def err_terminal(self) -> bool:
        """Whether stderr is a terminal (``err.is_terminal``, without making the console)."""
        return self._stderr_terminal

    def data(self, value: object) -> None:
        """The one JSON document of a ``--json`` run."""
        text = json.dumps(jsonable(value), indent=2, ensure_ascii=False)
        # A lone surrogate has no UTF-8 form; its JSON escape reads back as the same string.
        text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
        file = self._data_file()
        file.write(text + "\n")
        file.flush()

    def _data_file(self) -> IO[str]:
        """The file ``out.file`` is, found without making the console while it is not made yet."""
        if self._out is None and self._stdout:
            # As rich's Console.file chooses it: a stream rich redirected stands for the file it wraps.
            return getattr(self._stdout, "rich_proxied_file", self._stdout)
        return self.out.file

    def line(self, *parts: str | Text | tuple[str, str]) -> None:
        """One line of data on stdout (never in JSON mode)."""
        if not self.json_mode:
            self.out.print(text(*parts))

    def note(self, *parts: str | Text | tuple[str, str]) -> None:
        """One line for the person at the terminal, on stderr."""
        self.err.print(text(*parts))

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[str | Text]], *, title: str | None = None) -> None:
        if self.json_mode:
            return
        render_table(self.out, columns, rows, title=title)


def text(*parts: str | Text | tuple[str, str]) -> Text:
    """A Text from plain strings, Texts and ``(string, style)`` pairs."""
    from rich.text import Text  # noqa: PLC0415 - see TYPE_CHECKING above

    result = Text()
    for part in parts:
        if isinstance(part, tuple):
            result.append(printable(part[0]), style=part[1])
        elif isinstance(part, str):
            result.append(printable(part))
        else:
            result.append(part)
    return result


def render_table(
    console: Console, columns: Sequence[str], rows: Iterable[Sequence[str | Text]], *, title: str | None = None
) -> None:
    """A rich table on a terminal wide enough for it; aligned columns (coloured on a terminal) otherwise."""
    from rich.measure import Measurement  # noqa: PLC0415 - see TYPE_CHECKING above
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    cells = [[cell if isinstance(cell, Text) else Text(printable(cell)) for cell in row] for row in rows]
    if console.is_terminal:
        table = Table(title=title, title_justify="left", header_style="bold", show_edge=False)
        for column in columns:
            table.add_column(column, no_wrap=True)
        for row in cells:
            table.add_row(*row)
        # Measured without the console's limit: a table that does not fit would squeeze its columns.
        natural = Measurement.get(console, console.options.update_width(1_000_000), table).maximum
        if natural <= console.width:
            console.print(table)
            return
    header = [Text(c, style="bold" if console.is_terminal else "") for c in columns]
    lines = [header, *cells]
    widths = [max(cell.cell_len for cell in column) for column in zip(*lines, strict=True)]
    if title:
        console.print(Text(title, style="bold" if console.is_terminal else ""))
    for line in lines:
        joined = Text()
        for cell, width in zip(line, widths, strict=True):
            joined.append_text(cell)
            joined.append(" " * (width - cell.cell_len + 2))
        joined.rstrip()
        console.print(joined)


def state(value: str | enum.Enum | None) -> Text:
    """A state, coloured by what it means."""
    from rich.text import Text  # noqa: PLC0415 - see TYPE_CHECKING above

    name = "-" if value is None else value.value if isinstance(value, enum.Enum) else str(value)
    return Text(printable(name), style=STATE_STYLES.get(name, ""))


def token(value: str | None) -> str:
    return "-" if not value else value[:TOKEN_PREFIX]


def when(moment: datetime | None) -> str:
    """A UTC time to the millisecond."""
    if moment is None:
        return "-"
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def compact(value: object, *, nested: bool = False) -> str:
    """A short, exact, one-line spelling of a JSON-like value (``key=value ...``; nested objects in braces)."""
    if isinstance(value, Mapping):
        inner = " ".join(f"{k}={compact(v, nested=True)}" for k, v in value.items())
        return "{" + inner + "}" if nested else inner
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(compact(v, nested=True) for v in value) + "]"
    if isinstance(value, str):
        return value if value and " " not in value and "=" not in value else json.dumps(value, ensure_ascii=False)
    return json.dumps(jsonable(value), ensure_ascii=False)


def jsonable(value: Any) -> Any:
    """Kernel and store values as JSON: attrs classes as objects, enums by value, times in ISO 8601 UTC."""
    if attrs.has(type(value)):
        return {field.name: jsonable(getattr(value, field.name)) for field in attrs.fields(type(value))}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return value


def outcome_json(outcome: object) -> dict[str, Any]:
    """A kernel outcome as ``{"outcome": decision|refused|unchanged|recorded, ...}``."""
    if isinstance(outcome, p.Refusal):
        return {"outcome": "refused", "code": outcome.code.value, "message": outcome.message, "field": outcome.field}
    if isinstance(outcome, p.Unchanged):
        return {"outcome": "unchanged", "code": outcome.code.value, "message": outcome.message}
    if isinstance(outcome, approvals.Recorded):
        return {"outcome": "recorded", "message": outcome.message, "evidence": jsonable(outcome.evidence)}
    if isinstance(outcome, p.Decision):
        return {
            "outcome": "decision",
            "execution": jsonable(outcome.execution),
            "transitions": jsonable(outcome.evidence),
        }
    return {"outcome": type(outcome).__name__, "value": jsonable(outcome)}


# --- inspect ------------------------------------------------------------------------------------


@attrs.frozen
class Row:
    """One line of an execution's timeline."""

    time: str
    revision: str
    who: str
    token: str
    fence: str
    what: Text
    detail: str


TIMELINE_COLUMNS = ("time (UTC)", "rev", "who", "token", "fence", "what", "detail")


def _revisions_by_object(view: ExecutionView) -> dict[str, list[Evidence]]:
    found: dict[str, list[Evidence]] = {}
    for item in view.evidence_revisions or view.evidence:
        found.setdefault(item.object_id, []).append(item)
    return found


def _owner(object_id: str, execution_id: str) -> str | None:
    """The attempt an evidence object belongs to (``x/a3`` for ``x/a3/approval/decision/d1``)."""
    prefix = f"{execution_id}/"
    if not object_id.startswith(prefix):
        return None
    head = object_id[len(prefix) :].split("/", 1)[0]
    return f"{prefix}{head}"


def _changes(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> str:
    """What a revision added or changed, excluding the state it is shown with."""
    skip = {"status", "state"}
    if before is None:
        return ""
    changed = {k: v for k, v in after.items() if k not in skip and before.get(k) != v}
    return compact(changed)


def timeline(view: ExecutionView) -> list[Row]:
    """Every transition record, and under the revision a visit started at, everything that visit created.

    A visit that starts at execution revision *n* is attempt ``<id>/a<n>``;
    its Command, approval request, decisions and wait registration are shown
    with it, each with every revision it went through.
    """
    execution_id = view.execution.execution_id
    objects = _revisions_by_object(view)
    by_owner: dict[str, list[str]] = {}
    unowned: list[str] = []
    for object_id in objects:
        owner = _owner(object_id, execution_id)
        if owner is None or owner == f"{execution_id}/input":
            unowned.append(object_id)
        else:
            by_owner.setdefault(owner, []).append(object_id)
    registrations = {r.key.attempt_id: r for r in view.registrations}
    recoveries = {r.resulting_revision: r for r in view.recoveries}
    rows: list[Row] = []
    shown: set[str] = set()

    def sub(what: Text, detail: str = "", time: str = "", who: str = "", fence: str = "") -> None:
        rows.append(Row(time, "", who, "", fence, what, detail))

    for record in view.history:
        recovery = recoveries.get(record.revision)
        if record.event is not None:
            event = record.event.value
        elif recovery is not None:
            event = recovery.kind.value  # a recovery that changes no state has no machine event
        else:
            event = "admit" if record.from_state is None else "-"
        move = text(
            f"{event}: ",
            state(record.from_state) if record.from_state else "",
            " -> " if record.from_state else "-> ",
            state(record.to_state),
        )
        rows.append(
            Row(
                when(record.at),
                str(record.revision),
                record.actor,
                token(record.lease_token),
                str(record.fence),
                move,
                record.reason,
            )
        )
        if recovery is not None:
            sub(
                text("  recovery ", recovery.kind.value),
                f"command {recovery.command_id}: revision {recovery.expected_revision} -> "
                f"{recovery.resulting_revision} ({recovery.resulting_state.value})",
            )
        if record.revision == 1:
            for object_id in unowned:
                if object_id.endswith("/input"):
                    _object_rows(objects[object_id], sub)
                    shown.add(object_id)
        attempt_id = attempts.attempt_id(attrs.evolve(view.execution, revision=record.revision))
        for object_id in by_owner.get(attempt_id, []):
            _object_rows(objects[object_id], sub)
            shown.add(object_id)
            registration = registrations.get(object_id)
            if registration is not None:
                _registration_rows(registration, sub)
    for object_id in objects:
        if object_id not in shown:
            _object_rows(objects[object_id], sub)
    return rows


def _object_rows(revisions: list[Evidence], sub: Callable[..., None]) -> None:
    first = revisions[0]
    body = first.body
    kind = first.kind
    if kind == attempts.STEP_ATTEMPT:
        started = body.get("started_at")
        at = when(datetime.fromisoformat(started)) if isinstance(started, str) else ""
        sub(
            text(f"  attempt {first.object_id} ", (str(body.get("node_id")), "bold"), f" ({body.get('node_kind')})"),
            f"step {body.get('step')}, inputs {compact(body.get('inputs', {})) or '-'}",
            time=at,
            who=str(body.get("worker_id", "")),
            fence=str(body.get("fence", "")),
        )
    elif kind == i.COMMAND:
        sub(
            text(f"  command {first.object_id} ", (str(body.get("operation")), "bold")),
            f"as {body.get('principal_id')} on {compact(body.get('targets'))}, "
            f"payload {compact(body.get('payload', {})) or '-'}",
        )
    elif kind == approvals.APPROVAL_REQUEST:
        binding = body.get("binding", {})
        sub(
            text(f"  approval request {first.object_id} ", (str(binding.get("operation")), "bold")),
            f"targets {compact(binding.get('targets'))}, policies {compact(binding.get('policies'))}, "
            f"reviewers {', '.join(body.get('reviewers', []))}, requested by {body.get('requester_id')}",
        )
    elif kind == approvals.APPROVAL_DECISION:
        sub(
            text(
                f"  decision {body.get('decision_id')} by {body.get('reviewer_id')}: ",
                state(str(body.get("determination"))),
            ),
            f"on {body.get('request_id')}"
            + (f", rationale {compact(body.get('rationale'))}" if body.get("rationale") else ""),
        )
    elif kind == i.EXECUTION_INPUT:
        sub(text("  input"), f"recorded by {body.get('principal_id')}: {compact(body.get('input', {}))}")
    else:
        sub(text(f"  {kind} {first.object_id}"), compact(body))
    previous: Mapping[str, Any] | None = None
    for revision in revisions:
        sub(text(f"    r{revision.revision} ", state(revision.state)), _changes(previous, revision.body))
        previous = revision.body


def _registration_rows(registration: p.WaitRegistration, sub: Callable[..., None]) -> None:
    spec = registration.spec
    waits = []
    if spec.event_type is not None:
        waits.append(f"{spec.event_type} {compact(dict(spec.correlation))}".strip())
    if spec.wake_at is not None:
        waits.append(f"{'timeout' if spec.timeout else 'wake'} at {when(spec.wake_at)}")
    continues = ", ".join(f"{outcome} -> {node}" for outcome, node in spec.continuations)
    sub(text("  wait registered"), "; ".join(waits) + (f"; continues {continues}" if continues else ""))
    if registration.closed_by is not None:
        sub(text("    closed by ", (registration.closed_by, "bold")), "the execution stopped waiting without a wake")
    elif registration.woken_by is None:
        sub(text("    ", ("not woken yet", "yellow")))
    else:
        reason = registration.wake_reason.value if registration.wake_reason else "?"
        sub(text("    woken by ", (registration.woken_by, "bold")), f"reason {reason}")


def dispatch_rows(view: ExecutionView, *, expired: bool) -> list[tuple[str, str | Text]]:
    d = view.dispatch
    lease: str | Text
    if d.lease_token is None:
        lease = "none"
    else:
        lease = text(
            f"held by {d.leased_by}, token {token(d.lease_token)}, expires {when(d.lease_expires_at)}",
            (" (expired: quarantine takes it)", REFUSED_STYLE) if expired else "",
        )
    return [
        ("dispatch state", state(d.dispatch_state)),
        ("eligible at", when(d.eligible_at)),
        ("lease", lease),
        ("steps", str(d.step_count)),
        ("last error", d.last_error_code or "-"),
    ]


__all__ = [
    "TIMELINE_COLUMNS",
    "Output",
    "Row",
    "compact",
    "dispatch_rows",
    "jsonable",
    "make_console",
    "outcome_json",
    "printable",
    "render_table",
    "state",
    "text",
    "timeline",
    "token",
    "when",
]
