"""The execution journal's chaos run: appender processes killed, stopped and cut off, then a full audit.

Run as ``python -m tests.chaos.journal --store sqlite|postgres|both --seconds N --seed S``
(``make chaos`` runs both stores after the executions' and the operations'
runs).  It exits 0 when the audit prints ``violations: 0`` and 1 otherwise.
Rules of the run:

- **The appenders** are ``tests/chaos/journal_appender.py`` processes (four by
  default), each a long-lived writer of the same few journals (three by
  default) through a journal store object, logging every request before it
  makes it and its answer after.  What they ask is in that module.
- **The opening**, before any fault: the appenders started first load the
  first journal and, at one signal, all send its next step expecting the
  head they loaded (``Appender.opening``).  One is appended, every other is
  refused ``stale_head``, and the one appended is sent again: every run,
  however short and however busy the machine, has writers racing for one
  head and an idempotent repeat for the audit to check, besides those its
  timing gives.  The faults' clock starts when the opening is done (or
  after a minute, whatever it has done).
- **The faults**, at random moments chosen by the seed: SIGKILL of an
  appender (another is started in its place, which first sends again the
  request the killed one was cut off in), SIGSTOP of an appender for 1.5 to
  2.5 seconds and then SIGCONT (on SQLite, inside a write it holds the
  file's write lock), and on PostgreSQL ``pg_terminate_backend`` of the
  appenders' connections, one's or all of them.
- **The end**: the appenders are stopped (SIGTERM, SIGKILL after 10 s); no
  recovery: a journal has nothing to recover, its head row moves only with
  its events.
- **The audit** (:func:`audit`) reads the stored bytes, the appenders' logs
  and the answers of the real command line (``fencekeeper journal verify``)
  and of a fresh store object, and prints each check with its counts, every
  violation, and ``violations: N``.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from fencekeeper.adapters.journal_store import StoredChain, replay_stored
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.journal_codes import JournalError
from tests.chaos.journal_appender import new_journal, open_store
from tests.chaos.operations import Rows, fencekeeper_command, postgres_rows, sqlite_rows
from tests.chaos.run import (
    DEFAULT_PG_DSN,
    Crew,
    PostgresTarget,
    RunOutcome,
    SqliteTarget,
    Target,
    add_run_arguments,
    finish_run,
    print_report_end,
    run_stores,
)

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "chaos-ja"
APPLICATION_PREFIX = "fkj-"


@attrs.define
class Config:
    store: str
    seconds: float
    seed: int
    appenders: int = 4
    journals: int = 3
    lease: float = 1.0
    """Stops last 1.5 to 2.5 of these (``Crew.sigstop_one``): there is no lease here, only a pause."""
    dsn: str = DEFAULT_PG_DSN
    keep: Path | None = None
    quiet: bool = False


def say(config: Config, text: str) -> None:
    if not config.quiet:
        print(text, flush=True)


def journal_ids(count: int) -> list[str]:
    return [f"jc-{n}" for n in range(1, count + 1)]


class AppenderCrew(Crew):
    """The executions' crew (kill, stop and resume, stop all), starting appenders; a replacement resumes a killed one."""

    def __init__(
        self, config: Config, target: Target, directory: Path, rng: random.Random, journals: list[str]
    ) -> None:
        super().__init__(config, target, directory, rng)  # type: ignore[arg-type]
        self.journals = journals
        self.orphans: list[str] = []
        self.opening: Path | None = None
        """Given to the appenders started while it is set (``--opening``)."""

    def start(self, *, final: bool = False) -> str:
        self.generation += 1
        name = f"{PREFIX}{self.generation}"
        resume = self.orphans.pop(0) if self.orphans else None
        command = [
            sys.executable, "-m", "tests.chaos.journal_appender", "--db", self.target.url(f"{APPLICATION_PREFIX}{name}"),
            "--name", name, "--seed", str(self.config.seed), "--log", str(self.directory / f"{name}.jsonl"),
            "--journals", ",".join(self.journals),
            *(["--resume", str(self.directory / f"{resume}.jsonl")] if resume else []),
            *(["--opening", str(self.opening)] if self.opening is not None else []),
        ]  # fmt: skip
        with (self.directory / f"{name}.err").open("w") as stderr:
            proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
        self.running[name] = proc
        self.started.append(name)
        return name

    def sigkill(self, name: str) -> None:
        super().sigkill(name)
        self.orphans.append(name)

    def sigkill_in_request(self) -> bool:
        """SIGKILL an appender, if it can be caught within half a second between logging a request and its answer.

        Most of an appender's time goes to reading the journal again; a kill
        aimed at a request in flight is what leaves an outcome unknown.
        Whether it was caught is only likely: the answer may land between
        the look at the log and the signal.
        """
        candidates = sorted(set(self.running) - set(self.stopped_until))
        if not candidates:
            return False
        name = self.rng.choice(candidates)
        log = self.directory / f"{name}.jsonl"
        give_up = time.monotonic() + 0.5
        caught = False
        while time.monotonic() < give_up and not caught:
            caught = log.exists() and last_line(log).startswith('{"appender"') and '"kind": "request"' in last_line(log)
            if not caught:
                time.sleep(0.002)
        self.sigkill(name)
        self.start()
        return caught


OPENING_WAIT = 60.0
"""The longest the run waits for each step of the opening: far past an appender's start on a busy machine."""


def open_with_contention(crew: AppenderCrew, config: Config) -> None:
    """Start the appenders, all contending for the first journal's head at one signal (``Appender.opening``)."""
    crew.opening = crew.directory / "opening"
    for _ in range(config.appenders):
        crew.start()
    crew.opening, opening = None, crew.opening
    names = list(crew.started)

    def wait_for(suffix: str) -> None:
        # An appender that died is replaced (without the opening) and waited for no longer.
        give_up = time.monotonic() + OPENING_WAIT
        while time.monotonic() < give_up:
            crew.reap()
            if all(Path(f"{opening}.{n}.{suffix}").exists() or n not in crew.running for n in names):
                return
            time.sleep(0.01)

    wait_for("ready")
    opening.touch()
    wait_for("opened")


def last_line(path: Path) -> str:
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 65536))
        lines = handle.read().splitlines()
    return lines[-1].decode("utf-8", errors="replace") if lines else ""


def run_one(config: Config, kind: str) -> RunOutcome:
    started = time.monotonic()
    rng = random.Random(f"{config.seed}-{kind}-journal")
    directory = Path(tempfile.mkdtemp(prefix=f"fencekeeper-jchaos-{kind}-"))
    target: Target = SqliteTarget(directory) if kind == "sqlite" else PostgresTarget(config.dsn)
    say(config, f"journal chaos: {kind}, {config.seconds:.0f} s of faults, seed {config.seed}, files in {directory}")
    journals = journal_ids(config.journals)
    setup = open_store(target.url(f"{APPLICATION_PREFIX}setup"))
    for execution_id in journals:
        setup.create(new_journal(execution_id))
    setup.close()
    rows: Rows = sqlite_rows(directory / "chaos.db") if isinstance(target, SqliteTarget) else postgres_rows(target)  # type: ignore[arg-type]
    crew = AppenderCrew(config, target, directory, rng, journals)
    faults: collections.Counter[str] = collections.Counter()
    completed = False
    try:
        open_with_contention(crew, config)
        end = time.monotonic() + config.seconds
        next_kill = time.monotonic() + rng.uniform(1, 3)
        next_stop = time.monotonic() + rng.uniform(1, 2)
        next_cut = time.monotonic() + rng.uniform(0.5, 1.5)
        while time.monotonic() < end:
            now = time.monotonic()
            crew.reap()
            crew.resume_due()
            if now >= next_kill:
                if rng.random() < 0.6:
                    caught = crew.sigkill_in_request()
                    faults["appenders SIGKILLed (and replaced) while a request was likely in flight"] += caught
                    faults["appenders SIGKILLed (and replaced) at another moment"] += not caught
                else:
                    crew.sigkill_one(set())
                    faults["appenders SIGKILLed (and replaced) at another moment"] += 1
                next_kill = now + rng.uniform(1, 2.5)
            if now >= next_stop:
                if crew.sigstop_one(set()):
                    faults["appenders SIGSTOPped, then SIGCONTed"] += 1
                next_stop = now + rng.uniform(1.5, 3)
            if isinstance(target, PostgresTarget) and now >= next_cut:
                one = rng.random() < 0.5 and crew.running
                pattern = (
                    f"{APPLICATION_PREFIX}{rng.choice(sorted(crew.running))}"
                    if one
                    else f"{APPLICATION_PREFIX}{PREFIX}%"
                )
                faults["backends terminated (pg_terminate_backend)"] += target.kill_backends(pattern)
                next_cut = now + rng.uniform(0.5, 1.5)
            time.sleep(0.05)
        chaos_seconds = time.monotonic() - started
        crew.stop_all()
        completed = True
    finally:
        crew.abort()
        if not completed and isinstance(target, PostgresTarget):
            target.close(drop=config.keep is None)
    (directory / "appenders.json").write_text(
        json.dumps({"exits": dict(crew.exits), "started": crew.started, "killed": sorted(crew.sigkilled)}, indent=1)
    )
    audit_started = time.monotonic()
    violations, checks, stats = audit(rows, directory, target.url(f"{APPLICATION_PREFIX}audit"))
    report: dict[str, Any] = {
        "faults": dict(faults),
        "requests": stats,
        "checks": checks,
        "seconds": {"chaos": round(chaos_seconds, 1), "audit": round(time.monotonic() - audit_started, 1)},
    }
    return finish_run(
        kind, started, target=target, directory=directory, keep=config.keep, violations=violations, report=report
    )


# --- the audit -----------------------------------------------------------------------------------------


@attrs.frozen
class Group:
    """The run of consecutive events one request wrote."""

    first: int
    count: int
    digest: str
    previous: str
    last: str


@attrs.frozen
class Stored:
    """What the audit reads of an event record: enough to follow requests and the chain, even in a record that fails."""

    ordinal: int
    previous: str
    digest: str
    request_id: str
    request_digest: str

    @classmethod
    def of(cls, record: bytes) -> Stored:
        try:
            value = json.loads(record)
            request = value["request"]
            return cls(int(value["ordinal"]), str(value["previous"]), str(value["digest"]), str(request["id"]),
                       str(request["digest"]))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return cls(0, "", "", "", "")  # no request's: replay names what is wrong with it


def read_logs(directory: Path) -> list[dict[str, Any]]:
    """Every request of every appender, with its answer merged in; a request with none is ``lost`` (killed in it)."""
    entries: list[dict[str, Any]] = []
    for path in sorted(directory.glob(f"{PREFIX}*.jsonl")):
        requests: dict[int, dict[str, Any]] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line a kill cut: the request after it was never made
            if value["kind"] == "request":
                requests[value["n"]] = {**value, "outcome": "lost"}
            elif value["n"] in requests:
                requests[value["n"]].update({k: v for k, v in value.items() if k not in ("kind", "t")})
        entries.extend(requests[n] for n in sorted(requests))
    return entries


def built(command: dict[str, Any], previous: str | None) -> tuple[j.Command, str]:
    """A logged command as the store was given it (a later one of a batch expects ``previous``), and its digest."""
    value = j.command_from_json(command, previous)
    return value, j.request_digest(value)


def audit(
    rows: Rows, directory: Path, url: str, *, command_line: bool = True
) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """Every check, over the stored rows, the appenders' logs in ``directory``, and the store at ``url``.

    ``command_line=False`` leaves out ``journal verify`` (the replay it runs
    is still done here): for checking again files whose chain the run's own
    checks already ran it on.
    """
    checks: dict[str, str] = {}
    violations: list[str] = []

    def check(name: str, summary: str, problems: list[str]) -> None:
        checks[name] = f"{summary}; {len(problems)} violations"
        violations.extend(f"{name}: {problem}" for problem in problems)

    headers = {r["execution_id"]: r for r in rows("SELECT * FROM journal_headers ORDER BY execution_id")}
    heads = {r["execution_id"]: r for r in rows("SELECT * FROM journal_heads ORDER BY execution_id")}
    stored: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows("SELECT execution_id, ordinal, digest, record FROM journal_events ORDER BY execution_id, ordinal"):
        stored[r["execution_id"]].append({**r, "record": bytes(r["record"])})
    entries = read_logs(directory)

    check_chains(headers, heads, stored, url, check, command_line=command_line)
    events = {eid: [Stored.of(e["record"]) for e in stored[eid]] for eid in headers}
    groups = check_requests(events, entries, check)
    check_answers(stored, groups, entries, check)
    check_unknown(groups, entries, check)
    check_contention(entries, check)
    check_appenders(directory, check)
    outcomes = collections.Counter(
        f"{e['what']} {e['outcome']}" + (f" ({e['code']})" if e.get("code") else "") for e in entries
    )
    stats = {
        "events": {eid: len(v) for eid, v in sorted(stored.items())},
        "requests": len(entries),
        "commands": sum(len(e["commands"]) for e in entries),
        "answers": dict(sorted(outcomes.items())),
    }
    return violations, checks, stats


def check_chains(
    headers: dict[str, dict[str, Any]],
    heads: dict[str, dict[str, Any]],
    stored: dict[str, list[dict[str, Any]]],
    url: str,
    check: Callable[[str, str, list[str]], None],
    *,
    command_line: bool = True,
) -> dict[str, j.Journal]:
    """Each ordinal one event, the head row the chain's end; every journal replays, verifies, and loads again the same."""
    problems: list[str] = []
    for eid in sorted(stored.keys() - headers.keys()):
        problems.append(f"{eid}: {len(stored[eid])} events and no header")
    total = 0
    for eid, header in sorted(headers.items()):
        mine = stored.get(eid, [])
        total += len(mine)
        ordinals = [e["ordinal"] for e in mine]
        if ordinals != list(range(1, len(mine) + 1)):
            repeated = sorted(o for o, n in collections.Counter(ordinals).items() if n > 1)
            missing = sorted(set(range(1, max(ordinals, default=0) + 1)) - set(ordinals))
            problems.append(f"{eid}: ordinals held twice {repeated[:5]}, missing {missing[:5]}, of {len(mine)} events")
        head = heads.get(eid)
        end = mine[-1]["digest"] if mine else header["digest"]
        if head is None or (head["head"], head["length"]) != (end, len(mine)):
            problems.append(
                f"{eid}: the head row is {None if head is None else (head['head'], head['length'])}, "
                f"the events end at {end} after {len(mine)}"
            )
    check("each ordinal holds exactly one event", f"{len(headers)} journals, {total} events", problems)

    problems = []
    replayed: dict[str, j.Journal] = {}
    # The command line as an operator runs it, on every journal at once (each is a process of its own).
    verifying = {
        eid: subprocess.Popen(
            [*fencekeeper_command(), "journal", "verify", eid, "--db", url, "--json"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for eid in (sorted(headers) if command_line else [])
    }
    for eid, header in sorted(headers.items()):
        head = heads.get(eid)
        chain = StoredChain(
            execution_id=eid, header=bytes(header["header"]), events=tuple(e["record"] for e in stored.get(eid, [])),
            workflow=bytes(header["workflow"]), policy=bytes(header["policy"]),
            head=str(head["head"]) if head else "", length=int(head["length"]) if head else -1,
            header_digest=str(header["digest"]), event_digests=tuple(str(e["digest"]) for e in stored.get(eid, [])),
            event_ordinals=tuple(int(e["ordinal"]) for e in stored.get(eid, [])),
        )  # fmt: skip
        try:
            replayed[eid] = replay_stored(chain)
        except JournalError as exc:
            problems.append(f"{eid}: does not replay: the first bad record is {exc.ordinal}: [{exc.code}] {exc.detail}")
    for eid, proc in verifying.items():
        out, err = proc.communicate(timeout=120)
        try:
            said = json.loads(out)
        except json.JSONDecodeError:
            said = {"ok": False, "message": (out + err).strip()[-300:]}
        if not said.get("ok") or proc.returncode != 0:
            problems.append(f"{eid}: journal verify exits {proc.returncode}: {said}")
        elif eid in replayed and (said["head"], said["events"]) != (replayed[eid].head, len(replayed[eid].events)):
            problems.append(f"{eid}: journal verify says head {said['head']} after {said['events']}, replay another")
    check(
        "every stored journal replays and journal verify says it is whole",
        f"{len(replayed)} of {len(headers)} replayed, "
        + ("journal verify run on each" if command_line else "journal verify not run"),
        problems,
    )

    problems = []
    fresh = open_store(url)
    try:
        for eid, journal in sorted(replayed.items()):
            loaded = fresh.load(eid)
            if loaded is None:
                problems.append(f"{eid}: a fresh store finds no journal")
                continue
            ours = (journal.head, len(journal.events), dict(journal.states), dict(journal.attempts))
            theirs = (loaded.head, len(loaded.events), dict(loaded.states), dict(loaded.attempts))
            if ours != theirs:
                problems.append(f"{eid}: a fresh store loads head {loaded.head} after {len(loaded.events)} events and "
                                f"states {dict(loaded.states)}; the stored bytes replay to {journal.head} after "
                                f"{len(journal.events)}, {dict(journal.states)}")  # fmt: skip
    finally:
        fresh.close()
    check(
        "a restart loads each journal to the head and states its bytes replay to",
        f"{len(replayed)} journals loaded by a fresh store object",
        problems,
    )
    return replayed


def stored_groups(events: list[Stored]) -> tuple[dict[str, list[Group]], list[str]]:
    """Each request id's runs of events; problems: a run whose events disagree on the request digest."""
    groups: dict[str, list[Group]] = collections.defaultdict(list)
    problems: list[str] = []
    index = 0
    while index < len(events):
        first = events[index]
        end = index + 1
        while end < len(events) and events[end].request_id == first.request_id:
            end += 1
        run = events[index:end]
        if len({e.request_digest for e in run}) > 1:
            problems.append(f"request {first.request_id} at {first.ordinal}: events with different request digests")
        groups[first.request_id].append(
            Group(first.ordinal, len(run), first.request_digest, first.previous, run[-1].digest)
        )
        index = end
    return groups, problems


def asked(entries: list[dict[str, Any]], groups: dict[str, dict[str, list[Group]]]) -> dict[tuple[str, str], set[str]]:
    """(journal, request id) -> the digests of the commands sent with it whose outcome was not a refusal.

    A later command of a batch is rebuilt on the head the event before its
    request's events names, as the store built it.
    """
    found: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for entry in entries:
        if entry["outcome"] == "refused":
            continue
        for index, command in enumerate(entry["commands"]):
            previous = None
            if index > 0:
                runs = groups[entry["journal"]].get(command["request"], [])
                if not runs:
                    continue
                previous = runs[0].previous
            found[(entry["journal"], command["request"])].add(built(command, previous)[1])
    return found


def check_requests(
    events: dict[str, list[Stored]], entries: list[dict[str, Any]], check: Callable[[str, str, list[str]], None]
) -> dict[str, dict[str, list[Group]]]:
    """One request id, one set of events, with the digest of a request an appender made and was not refused."""
    problems: list[str] = []
    groups: dict[str, dict[str, list[Group]]] = {}
    for eid, mine in sorted(events.items()):
        groups[eid], found = stored_groups(mine)
        problems.extend(f"{eid}: {p}" for p in found)
    made = asked(entries, groups)
    ids = 0
    for eid, by_id in sorted(groups.items()):
        for request, runs in sorted(by_id.items()):
            ids += 1
            if len(runs) > 1:
                problems.append(
                    f"{eid}: request {request} wrote {len(runs)} sets of events, at {[g.first for g in runs]}"
                )
            for run in runs:
                if run.digest not in made.get((eid, request), set()):
                    problems.append(
                        f"{eid}: request {request} at {run.first} has digest {run.digest}, which no appender sent "
                        "and was not refused"
                    )
    appended: dict[tuple[str, str], int] = collections.Counter()
    for entry in entries:
        for command, result in zip(entry["commands"], entry.get("results", []), strict=False):
            if result["outcome"] == "appended":
                appended[(entry["journal"], command["request"])] += 1
    for (eid, request), n in sorted(appended.items()):
        if n > 1:
            problems.append(f"{eid}: request {request} was answered appended {n} times")
    check(
        "no request id names two sets of events or two digests",
        f"{ids} request ids stored, {sum(appended.values())} answered appended",
        problems,
    )
    return groups


def check_answers(
    stored: dict[str, list[dict[str, Any]]],
    groups: dict[str, dict[str, list[Group]]],
    entries: list[dict[str, Any]],
    check: Callable[[str, str, list[str]], None],
) -> None:
    """Every answer appended or unchanged is stored as answered, never rebased; every refusal left nothing."""
    problems: list[str] = []
    rebased: list[str] = []
    refused_problems: list[str] = []
    wrong: list[str] = []
    acknowledged = refusals = 0
    accepted_once: set[tuple[str, str]] = set()
    # Where each head is in its chain (the header's digest is 0): a stale refusal names a later one.
    positions = {eid: {r["digest"]: r["ordinal"] for r in chain} for eid, chain in stored.items()}
    for eid, chain in stored.items():
        if chain:
            positions[eid][Stored.of(chain[0]["record"]).previous] = 0
    not_refused: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for number, entry in enumerate(entries):
        if entry["outcome"] != "refused":
            for command in entry["commands"]:
                not_refused[(entry["journal"], command["request"])].append(number)
    for number, entry in enumerate(entries):
        eid = entry["journal"]
        chain = stored.get(eid, [])
        who = f"{entry['appender']} request {entry['n']} ({entry['what']}, {eid})"
        if entry["outcome"] in ("appended", "unchanged"):
            acknowledged += 1
            previous: str | None = None
            for index, (command, result) in enumerate(zip(entry["commands"], entry["results"], strict=False)):
                expected = None if index == 0 else previous
                _, digest = built(command, expected)
                first_expected = command.get("expected_head", expected)
                records = [r.encode() for r in result["records"]]
                decoded = [Stored.of(r) for r in records]
                for record, event in zip(records, decoded, strict=True):
                    at = chain[event.ordinal - 1]["record"] if 0 < event.ordinal <= len(chain) else None
                    if at != record:
                        problems.append(f"{who}: {command['request']} answered {result['outcome']} with event "
                                        f"{event.ordinal}, which the chain holds {'otherwise' if at else 'not at all'}")  # fmt: skip
                if decoded and decoded[-1].digest != result["head"]:
                    problems.append(f"{who}: answered head {result['head']}, its last event is {decoded[-1].digest}")
                if any(e.request_id != command["request"] or e.request_digest != digest for e in decoded):
                    problems.append(f"{who}: {command['request']} answered with events of another request")
                if result["outcome"] == "appended" and decoded and decoded[0].previous != first_expected:
                    rebased.append(f"{who}: {command['request']} expected head {first_expected}, "
                                   f"its events were appended after {decoded[0].previous}")  # fmt: skip
                key = (eid, command["request"])
                if result["outcome"] == "appended":
                    accepted_once.add(key)
                previous = result["head"]
        elif entry["outcome"] == "refused":
            refusals += 1
            earned = refusal_earned(entry, positions.get(eid, {}), groups.get(eid, {}))
            if earned is not None:
                wrong.append(f"{who}: {earned}")
            for command in entry["commands"]:
                runs = groups.get(eid, {}).get(command["request"], [])
                if not runs:
                    continue
                # Explained only by another request under that id that was not refused; which digest it
                # stored is checked with every stored request (no request id names two ... digests).
                if not [n for n in not_refused.get((eid, command["request"]), []) if n != number]:
                    refused_problems.append(f"{who}: refused [{entry['code']}], yet {command['request']} is stored at "
                                            f"{[r.first for r in runs]}")  # fmt: skip
    # Answers that must be what they are: a repeat of an acknowledged request is unchanged; a conflict is refused.
    answered: dict[tuple[str, str], str] = {}
    for entry in entries:
        key = (entry["journal"], json.dumps(entry["commands"], sort_keys=True))
        repeated = entry["what"] in ("repeat", "resend") and answered.get(key) in ("appended", "unchanged")
        if repeated and entry["outcome"] not in ("unchanged", "unknown", "lost"):
            wrong.append(f"{entry['appender']} request {entry['n']}: a repeat of an acknowledged request was "
                             f"answered {entry['outcome']} {entry.get('code') or ''}")  # fmt: skip
        answer = (entry["outcome"], entry.get("code"))
        if (
            entry["what"] == "conflict"
            and entry["outcome"] not in ("unknown", "lost")
            and answer != ("refused", "conflicting_request")
        ):
            wrong.append(f"{entry['appender']} request {entry['n']}: another request under an acknowledged id "
                             f"was answered {entry['outcome']} {entry.get('code') or ''}")  # fmt: skip
        if entry["outcome"] in ("appended", "unchanged"):
            answered[key] = entry["outcome"]
    check("every append answered appended or unchanged is stored as answered",
          f"{acknowledged} requests answered appended or unchanged", problems)  # fmt: skip
    check("no writer was rebased", f"{len(accepted_once)} commands appended, each after the head it expected", rebased)
    check("every refused request left nothing", f"{refusals} refusals", refused_problems)
    check("every answer was the right one",
          "repeats of acknowledged requests unchanged, conflicting reuse refused, every refusal earned", wrong)  # fmt: skip


_NAMED_HEAD = re.compile(
    r"expected head (sha256:[0-9a-f]{64}), but (?:the head is|another writer moved it to) (sha256:[0-9a-f]{64})"
)


def refusal_earned(entry: dict[str, Any], positions: dict[str, int], groups: dict[str, list[Group]]) -> str | None:
    """Why a refusal was not the one the stored journal earns, or None.

    ``stale_head``: the head it names is one the chain passed through after
    the one the command expected.  ``conflicting_request``: the refused
    command's id is stored, from another request.  No other refusal is
    earned by a command built on the journal as its appender saw it.
    """
    code, message = entry["code"], entry.get("message", "")
    if code == "stale_head":
        named = _NAMED_HEAD.search(message)
        if named is None:
            return None  # "moved to a newer head": moved twice while the append ran, a head not named
        expected, head = positions.get(named[1]), positions.get(named[2])
        if expected is None or head is None or head <= expected:
            return (f"refused stale_head, expecting the head at {expected} while the head was the one at {head} "
                    f"(None: not in the chain): {message}")  # fmt: skip
        return None
    if code == "conflicting_request":
        command = entry["commands"][int(entry.get("at", 1)) - 1]
        if not groups.get(command["request"]):
            return f"refused conflicting_request, but no request {command['request']} is stored"
        return None
    return f"a command built on the journal as last seen was refused [{code}] {message}"


def check_unknown(
    groups: dict[str, dict[str, list[Group]]],
    entries: list[dict[str, Any]],
    check: Callable[[str, str, list[str]], None],
) -> None:
    """A request whose answer was lost or never came is wholly stored, its events in order, or wholly absent."""
    problems: list[str] = []
    tally: collections.Counter[str] = collections.Counter()
    for entry in entries:
        if entry["outcome"] not in ("unknown", "lost"):
            continue
        eid = entry["journal"]
        present: list[bool] = []
        previous: str | None = None
        for index, command in enumerate(entry["commands"]):
            runs = groups.get(eid, {}).get(command["request"], [])
            if index > 0 and previous is None:
                # The command before it is not stored: this one counts as stored if its id is, at all.
                present.append(bool(runs))
                continue
            _, digest = built(command, previous if index > 0 else None)
            expected = command.get("expected_head", previous)
            match = [r for r in runs if r.digest == digest and r.previous == expected]
            present.append(bool(match))
            previous = match[0].last if match else None
        if all(present):
            tally[f"{entry['outcome']}, wholly stored"] += 1
        elif not any(present):
            tally[f"{entry['outcome']}, wholly absent"] += 1
        else:
            problems.append(f"{entry['appender']} request {entry['n']} ({entry['what']}, {eid}, answer "
                            f"{entry['outcome']}): of its {len(present)} commands, stored {present}")  # fmt: skip
    check(
        "requests of unknown outcome are wholly present or wholly absent",
        ", ".join(f"{n} {k}" for k, n in sorted(tally.items())) or "none",
        problems,
    )


def check_contention(entries: list[dict[str, Any]], check: Callable[[str, str, list[str]], None]) -> None:
    """Of requests expecting the same head, at most one was appended after it; the others were refused, never merged."""
    problems: list[str] = []
    contenders: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    winners: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for entry in entries:
        first = entry["commands"][0]
        key = (entry["journal"], first["expected_head"])
        contenders[key].add(first["request"])
        results = entry.get("results", [])
        if results and results[0]["outcome"] == "appended":
            winners[key].add(first["request"])
    for (eid, head), won in sorted(winners.items()):
        if len(won) > 1:
            problems.append(f"{eid}: {sorted(won)} were all appended after head {head}")
    contested = [k for k, v in contenders.items() if len(v) > 1]
    check(
        "of writers expecting the same head, one appended",
        f"{len(contested)} heads expected by two or more requests, {sum(1 for k in contested if winners.get(k))} "
        "of them taken by one",
        problems,
    )


def check_appenders(directory: Path, check: Callable[[str, str, list[str]], None]) -> None:
    """Every appender kept appending until it was killed or stopped: a cut connection is waited out, not fatal."""
    problems: list[str] = []
    for path in sorted(directory.glob(f"{PREFIX}*.err")):
        lines = path.read_text(errors="replace").strip().splitlines()
        if any(line.startswith("Traceback") for line in lines):
            # The exception and the frame it was raised in: which call let it through.
            frames = [line.strip() for line in lines if line.lstrip().startswith('File "')]
            where = f" (raised at {frames[-1]})" if frames else ""
            problems.append(f"{path.stem}: {lines[-1][:200]}{where}")
    record = json.loads((directory / "appenders.json").read_text()) if (directory / "appenders.json").exists() else {}
    exits = record.get("exits", {})
    problems.extend(f"{what} ({n} appenders)" for what, n in sorted(exits.items()) if "on its own" in what)
    check(
        "every appender kept appending until it was stopped",
        f"{len(record.get('started', []))} appenders started, {len(record.get('killed', []))} killed; exits: "
        + (", ".join(f"{w} {n}" for w, n in sorted(exits.items())) or "none"),
        problems,
    )


def print_outcome(outcome: RunOutcome) -> None:
    report = outcome.report
    print(f"\n== journal chaos audit: {outcome.store}, {outcome.seconds:.0f} s ==")
    print("faults: " + (", ".join(f"{k} {v}" for k, v in report["faults"].items()) or "none"))
    stats = report["requests"]
    print("journals: " + ", ".join(f"{k} {v} events" for k, v in stats["events"].items()))
    print(f"requests: {stats['requests']} ({stats['commands']} commands); answers: "
          + ", ".join(f"{k} {v}" for k, v in stats["answers"].items()))  # fmt: skip
    for name, summary in report["checks"].items():
        print(f"  {name}: {summary}")
    print_report_end(report, outcome.violations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.journal", description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, seconds=20.0)
    parser.add_argument("--appenders", type=int, default=4, help="appender processes (default 4)")
    parser.add_argument("--journals", type=int, default=3, help="journals they share (default 3)")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    config = Config(args.store, args.seconds, args.seed, args.appenders, args.journals, dsn=args.dsn, keep=args.keep)

    def run(kind: str) -> list[str]:
        outcome = run_one(config, kind)
        print_outcome(outcome)
        return outcome.violations

    return run_stores(args.store, run)


if __name__ == "__main__":
    raise SystemExit(main())
