"""Every Python code block in the README and on the site's index page runs as written.

A reader copies these first; an undefined name there is the first thing they meet.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", "docs/index.md"]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    for page in PAGES:
        text = (ROOT / page).read_text()
        blocks = FENCE.findall(text)
        assert blocks, f"{page} has no python code block"
        for i, code in enumerate(blocks):
            yield pytest.param(page, code, id=f"{page}[{i}]")


@pytest.mark.parametrize(("page", "code"), list(_blocks()))
def test_code_block_runs(page, code):
    namespace: dict = {"__name__": "__snippet__"}
    exec(compile(code, f"{page} snippet", "exec"), namespace)  # noqa: S102


def test_blocks_are_found():
    # The pattern must see the fences the pages use (a silent zero would pass the test above).
    assert sum(len(FENCE.findall((ROOT / p).read_text())) for p in PAGES) >= 2
