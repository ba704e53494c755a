"""What an operator sees of a wait that ended without a wake.

``inspect`` of a cancelled waiter shows its registration closed by the
cancellation, not "not woken yet": nothing waits on it any more, and no
timer or Event will ever fire it.
"""

from __future__ import annotations

from pathlib import Path

from .runner import EXAMPLES, ok


def test_inspect_shows_a_cancelled_waiters_registration_as_closed(tmp_path: Path) -> None:
    ok(
        "run", EXAMPLES / "payment_with_timeout.toml", "--db", "t.db", "--id", "pay-1",
        "--input", '{"order_id": "o-1", "amount": 10}', cwd=tmp_path,
    )
    ok("worker", "--db", "t.db", "--until-idle", cwd=tmp_path)
    before = ok("inspect", "pay-1", "--db", "t.db", cwd=tmp_path).stdout
    assert "not woken yet" in before and "closed by" not in before
    ok("cancel", "--db", "t.db", "pay-1", cwd=tmp_path)
    after = ok("inspect", "pay-1", "--db", "t.db", cwd=tmp_path).stdout
    assert "closed by cancel" in after and "not woken yet" not in after, after
