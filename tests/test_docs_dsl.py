"""docs/dsl.md's ``python`` blocks run, in order and in one namespace, so the page cannot
drift from what pystreams does: each block asserts the results it describes."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "dsl.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_every_python_block_of_the_dsl_page_runs_and_its_assertions_hold() -> None:
    blocks = PYTHON_BLOCK.findall(DOC.read_text())
    assert len(blocks) >= 5, "the page lost its examples"
    namespace: dict[str, object] = {"__name__": "dsl_doc"}
    for number, block in enumerate(blocks, start=1):
        code = compile(block, f"{DOC.name} python block {number}", "exec")
        exec(code, namespace)  # an AssertionError names the block
    # The blocks built the apps they describe (a block that silently did nothing would not).
    assert {"app", "driver", "activity", "updates"} <= namespace.keys()
