"""One appender of the journal chaos run: a long-lived writer of a few shared journals, with a log of every request.

Run as ``python -m tests.chaos.journal_appender --db URL --name NAME --seed N --log FILE --journals A,B,C``
(``tests/chaos/journal.py`` starts, kills, stops and replaces these).  Rules:

- **It writes through a journal store** (``JournalStoreBase.append_all``, a
  single command as a batch of one), one store object for its whole life,
  as a service would: the store's cached journal falls behind the other
  appenders and is caught up on a stale head, which is the path the run
  means to break.  (The command line opens a store per command; it is run
  on the kept journals by the audit, ``journal verify``.)
- **Every request is logged before it is made** (``{"kind": "request"}``, the
  commands as the command line's JSON), **and its answer after**
  (``{"kind": "answer"}``): appended or unchanged with the events' record
  bytes and the head, refused with the kernel's code, or unknown with the
  store's error.  A request with no answer was cut off by a kill.  Each line
  is flushed before the next step, so a SIGKILL loses at most the line
  being written.
- **What it asks**, on the journal it last saw (a stale one is refused
  ``stale_head`` and read again): the next step of a node (work-started,
  work-blocked and block-cleared cycles, now and then work-failed and
  retry-authorized, a new attempt), sometimes a batch of two to four
  steps; an earlier request again, identically (an idempotent repeat); an
  earlier appended request's id with other content (a conflict); a refused
  request's id on a fresh command (nothing of it was kept, so it may be
  appended); a request whose answer was lost, again, until the store
  answers.  Started with ``--resume LOG`` (a killed appender's log), it
  first sends again the request that appender was killed in.
- **The opening** (``--opening PATH``, given to the appenders the run
  starts first): contention on purpose, before any fault.  It loads the
  first journal, says it is ready (``PATH.NAME.ready``), waits for
  ``PATH`` to exist, then sends the next step expecting the head it
  loaded, as every other opening appender does at the same moment: one is
  appended and every other refused ``stale_head``, however slow the
  machine.  The one appended sends it again (an idempotent repeat), and
  each says it is done (``PATH.NAME.opened``).
- SIGTERM ends it after the request in hand.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fencekeeper.adapters import connect
from fencekeeper.adapters.journal_store import JournalStore, SQLiteJournalStore
from fencekeeper.adapters.store import StoreError
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.canonical import digest_bytes
from fencekeeper.kernel.dag import NodeDefinition, NodeKind, VerifiedWorkflow, WorkflowDefinition, verify_workflow
from fencekeeper.kernel.machines import NodeState

NODES = ("fetch", "parse", "index", "report")
"""Automated roots: each starts ready and can go on cycling for as long as the run lasts."""
ACTOR = "bot"
ROLE = "worker"
EVIDENCE = (j.RecordRef("evidence", "chaos-log", digest_bytes(b"chaos evidence")),)


def authority() -> tuple[VerifiedWorkflow, j.VerifiedPolicy]:
    """The run's workflow (four automated nodes) and its authority policy."""
    workflow = verify_workflow(
        WorkflowDefinition(
            "journal-chaos", tuple(NodeDefinition(n, NodeKind.AUTOMATED, (), (ROLE,), ()) for n in NODES)
        )
    )
    policy = j.verify_policy(
        j.AuthorityPolicy(
            "journal-chaos-policy", "chaos", workflow.digest, "chaos-protocol",
            (j.Assignment(ACTOR, j.ActorKind.AUTOMATION, (ROLE,)), j.Assignment("operator", j.ActorKind.HUMAN, (ROLE,))),
            "operator",
        ),
        workflow,
    )  # fmt: skip
    return workflow, policy


def new_journal(execution_id: str) -> j.Journal:
    workflow, policy = authority()
    header = j.create_header(execution_id, workflow, policy, created_by="operator", now=datetime.now(UTC))
    return j.new_journal(header, workflow, policy)


def open_store(url: str) -> JournalStore:
    location = connect.parse_url(url)
    if location.kind == "sqlite":
        assert location.path is not None
        return SQLiteJournalStore(location.path)
    from fencekeeper.adapters.journal_postgres import PostgresJournalStore  # noqa: PLC0415

    assert location.dsn is not None and location.schema is not None
    return PostgresJournalStore(location.dsn, schema=location.schema)


class NodePlan:
    """A node's state and attempts as the appender believes them, stepped ahead for the commands of a batch."""

    def __init__(self, node: str, journal: j.Journal) -> None:
        self.node = node
        self.state = journal.states[node]
        attempts = journal.attempts.get(node, ())
        self.sequence = len(attempts)
        self.authorized = bool(attempts) and attempts[-1].status is j.AttemptStatus.AUTHORIZED

    def step(self, rng: random.Random) -> dict[str, Any]:
        """The next command for this node (without request id or expected head), and the node moved past it."""
        attempt: tuple[str, int]
        error = None
        if self.state is NodeState.READY:
            if not self.authorized:
                self.sequence += 1
            attempt, event, after = (f"{self.node}-{self.sequence}", self.sequence), "work-started", NodeState.ACTIVE
            self.authorized = False
        elif self.state is NodeState.ACTIVE:
            attempt = (f"{self.node}-{self.sequence}", self.sequence)
            if rng.random() < 0.1:
                event, after, error = "work-failed", NodeState.FAILED, "chaos: the step failed"
            else:
                event, after = "work-blocked", NodeState.BLOCKED
        elif self.state is NodeState.BLOCKED:
            attempt, event, after = (f"{self.node}-{self.sequence}", self.sequence), "block-cleared", NodeState.ACTIVE
        elif self.state is NodeState.FAILED:
            self.sequence += 1
            attempt, event, after = (f"{self.node}-{self.sequence}", self.sequence), "retry-authorized", NodeState.READY
            self.authorized = True
        else:  # pragma: no cover - nothing here completes, invalidates or supersedes a node
            raise AssertionError(f"{self.node} is {self.state.value}")
        command = {
            "command": "transition", "node": self.node, "event": event, "prior_state": self.state.value,
            "actor": ACTOR, "role": ROLE, "rationale": "chaos step", "attempt": {"id": attempt[0], "sequence": attempt[1]},
            "records": [r.to_json() for r in EVIDENCE], "approvals": [], "error": error,
        }  # fmt: skip
        self.state = after
        return command


def record_text(record: bytes) -> str:
    return record.decode("utf-8")


class Appender:
    def __init__(
        self,
        store: JournalStore,
        name: str,
        journals: list[str],
        rng: random.Random,
        log: Path,
        *,
        stop: threading.Event | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.journals = journals
        self.rng = rng
        self.log = log.open("a", encoding="utf-8")
        self.views: dict[str, j.Journal] = {}
        self.sent: list[dict[str, Any]] = []
        """Every request this appender made, with its answer (``outcome``, ``code``)."""
        self.serial = 0
        self.reused: set[str] = set()
        self.stop = stop or threading.Event()

    def write(self, line: dict[str, Any]) -> None:
        self.log.write(json.dumps(line, sort_keys=True) + "\n")
        self.log.flush()

    def view(self, execution_id: str, *, refresh: bool = False) -> j.Journal:
        """The journal as this appender last saw it; ``refresh``: caught up with the store (the events since)."""
        known = self.views.get(execution_id)
        if known is None:
            loaded = self.store.load(execution_id)
            assert loaded is not None, execution_id
            self.views[execution_id] = loaded
        elif refresh:
            chain = self.store.stored(execution_id)
            assert chain is not None, execution_id
            self.views[execution_id] = j.continue_replay(known, chain.events[len(known.events) :])
        return self.views[execution_id]

    def request_id(self) -> str:
        self.serial += 1
        return f"{self.name}-{self.serial}"

    def send(
        self, execution_id: str, what: str, commands: list[dict[str, Any]], of: int | None = None
    ) -> dict[str, Any]:
        """Log the request, make it, log the answer; the entry with its outcome."""
        entry: dict[str, Any] = {
            "kind": "request", "appender": self.name, "n": len(self.sent) + 1, "journal": execution_id, "what": what,
            "commands": commands, "t": time.time(), **({"of": of} if of is not None else {}),
        }  # fmt: skip
        self.write(entry)
        self.sent.append(entry)

        def source(index: int, value: dict[str, Any]) -> Callable[[str | None], j.Command]:
            # The first command names its head; each later one expects the head the one before it left.
            return lambda previous: j.command_from_json(value, None if index == 0 else previous)

        answer: dict[str, Any] = {"kind": "answer", "appender": self.name, "n": entry["n"]}
        try:
            outcomes = self.store.append_all(execution_id, [source(i, c) for i, c in enumerate(commands)])
        except StoreError as exc:
            answer.update(outcome="unknown", code=exc.code, message=str(exc)[:300])
        else:
            last = outcomes[-1]
            if isinstance(last, j.Refusal):
                answer.update(outcome="refused", code=last.code.value, at=len(outcomes), message=last.message[:300])
            else:
                results = []
                for outcome in outcomes:
                    if isinstance(outcome, j.Appended):
                        results.append({
                            "outcome": "appended", "records": [record_text(r) for r in outcome.stored_records()],
                            "head": outcome.journal.head,
                        })  # fmt: skip
                    else:
                        assert isinstance(outcome, j.Unchanged)
                        head = outcome.events[-1].digest if outcome.events else outcome.journal.head
                        results.append({
                            "outcome": "unchanged", "records": [record_text(j.encode_event(e)) for e in outcome.events],
                            "head": head,
                        })  # fmt: skip
                written = [o for o in outcomes if isinstance(o, j.Appended)]
                answer.update(
                    outcome="appended" if written else "unchanged", results=results,
                    head=results[-1]["head"],
                )  # fmt: skip
                if written:
                    self.views[execution_id] = written[-1].journal
        answer["t"] = time.time()
        self.write(answer)
        entry["outcome"], entry["code"] = answer["outcome"], answer.get("code")
        return entry

    # --- what it asks ---------------------------------------------------------------------------------

    def fresh(self, execution_id: str, size: int, request_ids: list[str] | None = None) -> list[dict[str, Any]]:
        """``size`` next steps on the journal as last seen, the first naming its head."""
        journal = self.view(execution_id)
        plans = {n: NodePlan(n, journal) for n in NODES}
        nodes = self.rng.sample(NODES, k=min(len(NODES), self.rng.randint(1, 2)))
        commands = []
        for index in range(size):
            ids = request_ids or []
            command = {
                "request": ids[index] if index < len(ids) else self.request_id(),
                **plans[self.rng.choice(nodes)].step(self.rng),
            }
            if index == 0:
                command["expected_head"] = journal.head
            commands.append(command)
        return commands

    def once(self) -> None:
        execution_id = self.rng.choice(self.journals)
        roll = self.rng.random()
        if roll < 0.1:
            earlier = [e for e in self.sent if e["outcome"] in ("appended", "unchanged", "unknown")]
            if earlier:
                entry = self.rng.choice(earlier[-50:])
                self.settle(entry["journal"], "repeat", entry["commands"], entry["n"])
                return
        elif roll < 0.15:
            earlier = [e for e in self.sent if e["outcome"] == "appended" and len(e["commands"]) == 1]
            if earlier:
                entry = self.rng.choice(earlier[-50:])
                journal = self.view(entry["journal"])
                changed = {**entry["commands"][0], "rationale": "the same request id, other content",
                           "expected_head": journal.head}  # fmt: skip
                self.send(entry["journal"], "conflict", [changed], entry["n"])
                return
        elif roll < 0.2:
            refused = [
                e for e in self.sent
                if e["code"] == "stale_head" and len(e["commands"]) == 1 and e["commands"][0]["request"] not in self.reused
            ]  # fmt: skip
            if refused:
                entry = self.rng.choice(refused[-50:])
                request = entry["commands"][0]["request"]
                self.reused.add(request)
                self.view(entry["journal"], refresh=True)
                self.settle(entry["journal"], "reuse", self.fresh(entry["journal"], 1, [request]), entry["n"])
                return
        size = self.rng.randint(2, 4) if roll > 0.85 else 1
        self.settle(execution_id, "new" if size == 1 else "batch", self.fresh(execution_id, size))

    def opening(self, go: Path) -> None:
        """Contention on purpose: the next step of the first journal, from the head every opening appender loaded.

        The appenders load that head, then wait for ``go`` together, so that
        which of them wins is the store's to decide and that they contend is
        not left to the timing of a busy machine.
        """
        execution_id = self.journals[0]
        # Said even when a read fails (it is the run's to wait for, not to hang on).
        try:
            self.view(execution_id)
        finally:
            Path(f"{go}.{self.name}.ready").touch()
        try:
            while not go.exists():
                if self.stop.wait(0.01):
                    return
            commands = self.fresh(execution_id, 1)
            self.settle(execution_id, "opening", commands)
            last = self.sent[-1]
            if last["outcome"] in ("appended", "unchanged"):
                self.send(execution_id, "repeat", commands, last["n"])
        finally:
            Path(f"{go}.{self.name}.opened").touch()

    def settle(self, execution_id: str, what: str, commands: list[dict[str, Any]], of: int | None = None) -> None:
        """Send; a stale head is read again; an answer lost is asked again, identically, until the store answers."""
        entry = self.send(execution_id, what, commands, of)
        for _ in range(20):
            if entry["outcome"] != "unknown" or self.stop.is_set():
                break
            time.sleep(0.2)
            entry = self.send(execution_id, "resend", commands, entry["n"])
        if entry["outcome"] != "appended":
            try:
                self.view(execution_id, refresh=True)
            except StoreError:
                self.views.pop(execution_id, None)

    def resume(self, log: Path) -> None:
        """The request a killed appender was cut off in, sent again identically, as its client would."""
        requests: dict[int, dict[str, Any]] = {}
        answered: set[int] = set()
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line the kill cut: its request was never made
            if value["kind"] == "request":
                requests[value["n"]] = value
            else:
                answered.add(value["n"])
        lost = [r for n, r in sorted(requests.items()) if n not in answered]
        for value in lost[-1:]:
            self.settle(value["journal"], "resend", value["commands"], None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.journal_appender", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--db", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--journals", required=True, help="execution ids, comma-separated")
    parser.add_argument("--resume", type=Path, help="a killed appender's log: its last request is sent again first")
    parser.add_argument("--opening", type=Path, help="contend for the first journal's head when this file appears")
    args = parser.parse_args(argv)
    # Set from the first moment: a SIGTERM while the store is still being opened stops it too.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    store = None
    for _ in range(50):
        if stop.is_set():
            return 0
        try:
            store = open_store(args.db)
            break
        except StoreError:
            time.sleep(0.2)  # connections are being cut: a supervisor's process keeps trying
    if store is None:
        print(f"{args.name}: cannot open {args.db}", file=sys.stderr)
        return 1
    rng = random.Random(f"{args.seed}-{args.name}")
    appender = Appender(store, args.name, args.journals.split(","), rng, args.log, stop=stop)
    if args.resume is not None and args.resume.exists():
        appender.resume(args.resume)
    if args.opening is not None:
        try:
            appender.opening(args.opening)
        except StoreError:
            appender.views.clear()
    while not stop.is_set():
        try:
            appender.once()
        except StoreError:
            # A read (the journal as last seen) cut off: read it all again next time.
            appender.views.clear()
            time.sleep(0.1)
        time.sleep(appender.rng.uniform(0, 0.02))
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
