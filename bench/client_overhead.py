"""What the Python client costs over the service call it makes: admissions per second, side by side.

Run it with ``python -m bench.client_overhead``.  One SQLite store file, a
registered definition, and rounds that alternate, in the same process:

- ``service.run(...)``: the bare operation (one admission transaction);
- ``client.run("purchase-approval", ...)``: the same admission through the
  front door, which first checks every argument, loads the registered
  definition, checks the input, reads whether the id is taken and asks the
  policy, all before the admission writes (``adapters/client.py``, rules).

It prints every round, the median of each side and the client's rate as a
fraction of the bare one.  The client's extra reads are the price of
"bad input writes nothing"; this shows what that price is.  Compare the
fraction between machines, not the absolute rates.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import fencekeeper
from fencekeeper.adapters import examples, service

PURCHASE = Path(__file__).resolve().parent.parent / "adapters" / "workflows" / "purchase_approval.toml"
ORDER = {"amount": 10, "order_id": "o-1", "order_revision": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=200, help="admissions per side per round")
    args = parser.parse_args()
    policy = examples.grants("default", "user:operator")
    with tempfile.TemporaryDirectory() as directory:
        client = fencekeeper.connect(str(Path(directory) / "bench.db"), policy=policy, handler=None)
        client.register(PURCHASE)
        bare: list[float] = []
        front: list[float] = []
        for number in range(1, args.rounds + 1):
            started = time.perf_counter()
            for n in range(args.batch):
                service.run(
                    client.store,
                    policy,
                    business_id="default",
                    principal_id="user:operator",
                    definition_id="purchase-approval",
                    input=ORDER,
                    execution_id=f"s-{number}-{n}",
                )
            bare.append(args.batch / (time.perf_counter() - started))
            started = time.perf_counter()
            for n in range(args.batch):
                client.run("purchase-approval", ORDER, execution_id=f"c-{number}-{n}")
            front.append(args.batch / (time.perf_counter() - started))
            print(f"round {number}: service.run {bare[-1]:8.1f}/s   client.run {front[-1]:8.1f}/s")
        client.close()
    b, f = statistics.median(bare), statistics.median(front)
    print(f"median: service.run {b:.1f} admissions/s, client.run {f:.1f} admissions/s: the client runs at {f / b:.0%}")


if __name__ == "__main__":
    main()
