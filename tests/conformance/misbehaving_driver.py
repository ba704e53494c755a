"""A driver that answers every case right but misbehaves once, the way real drivers break.

``python misbehaving_driver.py MODE [N] [--echo]``: answers the ``machines`` and
``store``-less kernel layers from the committed expectations, and at the
N-th case (default 5) does what MODE says: ``crash`` (closes its
output, exits 3 a moment later), ``exit0`` (exits 0), ``garbage`` (a line that is not JSON), ``bytes`` (a line that is
not UTF-8), ``huge`` (a 100 kB line), ``silent`` (never answers), ``twice`` (answers it twice), ``stray``
(writes a JSON line of its own first, as a debug print to stdout would), ``unsupported`` (answers it and every
later case ``unsupported``); with ``--echo`` every answer carries its request's ``seq`` (protocol 1.2);
``unflushed`` never flushes its output at all; ``closein`` closes its
input once it has read ``hello``, answers it and exits 4; ``nobye``
exits 1 at ``bye`` instead of answering it, ``ignorebye`` never answers it, ``byecrash`` answers it and
then exits 5.  It imports nothing of fencekeeper:
it stands for an implementation in another language.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

CASES = Path(__file__).resolve().parents[2] / "specs" / "conformance"


def main() -> None:
    echo = "--echo" in sys.argv
    argv = [arg for arg in sys.argv if arg != "--echo"]
    mode = argv[1]
    at = int(argv[2]) if len(argv) > 2 else 5
    hello: object = {"protocol": 1, "implementation": "misbehaving", "layers": ["machines"]}
    if mode.startswith("hello="):
        hello = json.loads(mode.removeprefix("hello="))
    expected = {c["id"]: c["expected"] for c in json.loads((CASES / "machines.json").read_text("utf-8"))["cases"]}
    seen = 0
    unflushed: list[str] = []
    for line in sys.stdin:
        request = json.loads(line)
        response: object = {"ok": True}
        extra: list[str] = []
        if request["op"] == "bye" and mode == "nobye":
            sys.exit(1)
        if request["op"] == "bye" and mode == "ignorebye":
            continue
        if request["op"] == "hello":
            response = hello
            if mode == "closein":
                os.close(0)
                print(json.dumps(response), flush=True)
                time.sleep(0.3)
                sys.exit(4)
        elif request["op"] in ("reset", "store"):
            response = {"unsupported": True}  # no store behind it
        elif request["op"] == "case":
            seen += 1
            response = {"output": expected[request["id"]]}
            if seen == at:
                if mode == "crash":
                    # As a process does that cleans up after its output is gone: the exit comes a moment later.
                    sys.stdout.flush()
                    os.close(1)
                    time.sleep(0.3)
                    sys.exit(3)
                if mode == "exit0":
                    sys.exit(0)
                if mode == "garbage":
                    response = "panic: index out of range"
                if mode == "bytes":
                    sys.stdout.flush()
                    sys.stdout.buffer.write(b'{"output": "\xff\xfe"}\n')
                    sys.stdout.buffer.flush()
                    continue
                if mode == "huge":
                    response = json.dumps({"output": {"target": "x" * 100_000}})
                if mode == "silent":
                    time.sleep(60)
                if mode == "twice":
                    extra = [json.dumps(response)]
                if mode == "stray":
                    sys.stdout.write(json.dumps({"debug": f"answering {request['id']}"}) + "\n")
            if seen >= at and mode == "unsupported":
                response = {"unsupported": True}
        if echo and isinstance(response, dict):
            response = {**response, "seq": request["seq"]}
            extra = [json.dumps(response) for _ in extra]
        text = "".join(f"{item}\n" for item in [response if isinstance(response, str) else json.dumps(response), *extra])
        if mode == "unflushed":
            # As a block buffer does (whatever PYTHONUNBUFFERED says): the answers come out when input ends.
            unflushed.append(text)
            continue
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.stdout.write("".join(unflushed))
    if mode == "byecrash":
        sys.exit(5)


if __name__ == "__main__":
    main()
