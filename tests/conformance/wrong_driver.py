"""A driver that is wrong on purpose, to prove the runner never reports a wrong or absent answer as passed.

- ``machines``: one case (execution, eligible, claim) answered with the wrong target;
- ``protocol``: declared, but every case answered ``unsupported``;
- ``expressions``: not declared at all;
- everything else: answered by the real kernel.
"""

from __future__ import annotations

import json
import sys

from fencekeeper.adapters.conformance.driver import KERNEL_LAYERS, kernel_answer


def main() -> None:
    declared = [layer for layer in KERNEL_LAYERS if layer != "expressions"]
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        response: object
        if op == "hello":
            response = {"protocol": 1, "implementation": "wrong-on-purpose", "layers": declared}
        elif op == "case" and request["layer"] == "protocol":
            response = {"unsupported": True}
        elif op == "case" and request["layer"] in declared:
            output = kernel_answer(request["layer"], request["input"])
            if request["id"] == "execution/eligible/claim":
                output = {"target": "waiting"}
            response = {"output": output}
        else:
            response = {"unsupported": True} if op in ("case", "reset", "store") else {"ok": True}
        sys.stdout.write(json.dumps(response) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
