"""docs/choosing.md quotes only what bench/README.md recorded.

Every ratio the page gives (``2.27x``) and every run it names appears in
bench/README.md, where each run is kept with its date, commit and machine:
a figure edited on the page alone, or a run that was never recorded, fails
here.  The page is linked from the README's documentation list.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "choosing.md"
BENCH = ROOT / "bench" / "README.md"


def test_every_ratio_the_page_quotes_was_recorded_by_the_bench() -> None:
    page = PAGE.read_text(encoding="utf-8")
    recorded = set(re.findall(r"\b(\d+\.\d\d)x", BENCH.read_text(encoding="utf-8")))
    quoted = re.findall(r"\b(\d+\.\d\d)x", page)
    assert len(quoted) >= 20
    assert [q for q in quoted if q not in recorded] == []


def test_every_run_the_page_names_is_in_the_bench_record() -> None:
    page = PAGE.read_text(encoding="utf-8")
    bench = BENCH.read_text(encoding="utf-8")
    runs = {int(n) for n in re.findall(r"\bruns? (\d+)", page)} | {
        int(n) for a, b in re.findall(r"\bruns (\d+) to (\d+)", page) for n in range(int(a), int(b) + 1)
    }
    assert runs
    assert [n for n in sorted(runs) if f"**Run {n}**" not in bench] == []


def test_the_readme_links_the_page() -> None:
    assert "(docs/choosing.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
