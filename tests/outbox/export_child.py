"""A child process for the exporter's crash test: exports a SQLite store slowly, one fsynced line per message.

``python -m tests.outbox.export_child DB OUT``.  Each message is written and
fsynced before the next is sent, so whatever the parent's SIGKILL
interrupts, every line in OUT was delivered; the batch it was in was not yet
marked exported.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.outbox import ExportedMessage, JsonLinesSink, OutboxExporter


class SlowFileSink(JsonLinesSink):
    def send(self, message: ExportedMessage) -> None:
        super().send(message)
        self.flush()
        time.sleep(0.01)


def main() -> None:
    db, out = sys.argv[1], sys.argv[2]
    store = SQLiteOperationStore(db)
    exporter = OutboxExporter(store, SlowFileSink(out), batch_size=25, lease=timedelta(seconds=1))
    print("ready", flush=True)
    exporter.run(until_idle=True)


if __name__ == "__main__":
    main()
