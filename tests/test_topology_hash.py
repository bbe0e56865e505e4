"""The topology hash is stable across builds and processes, and follows structural changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import pytest

from pystreams import serdes
from pystreams.app import App, TumblingWindow, load_app

ROOT = Path(__file__).resolve().parent.parent
WORDCOUNT = ROOT / "examples" / "wordcount.py"


def wordcount_like(*, sink="word-counts", value=None, extra_filter=False, window=None, body=lambda t, k, v: t + v):
    app = App("wordcount")
    lines = app.topic("text-lines", value=serdes.Text())
    words = lines.flat_map(lambda k, line: [(w, 1) for w in line.split()], name="words", value=value)
    if extra_filter:
        words = words.filter(lambda k, v: len(k) > 1, name="no_single_letters")
    counts = words.aggregate(body, initial=0, store="counts", name="counts", window=window)
    counts.to(sink)
    return app.topology().hash


def test_hash_is_a_uuid_and_stable_across_builds():
    first = load_app(str(WORDCOUNT)).topology().hash
    second = load_app(str(WORDCOUNT)).topology().hash
    assert isinstance(first, UUID) and first != UUID(int=0)
    assert first == second


@pytest.mark.parametrize("seed", ["0", "12345"])
def test_hash_is_stable_in_a_fresh_python_process(seed):
    in_process = load_app(str(WORDCOUNT)).topology().hash
    code = "import sys; from pystreams.app import load_app; print(load_app(sys.argv[1]).topology().hash)"
    result = subprocess.run(
        [sys.executable, "-c", code, str(WORDCOUNT)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": seed},
    )
    assert UUID(result.stdout.strip()) == in_process


def test_structural_changes_change_the_hash_and_function_bodies_do_not():
    base = wordcount_like()
    assert wordcount_like(body=lambda total, key, value: total + 2 * value) == base
    changed = {
        "sink topic": wordcount_like(sink="other-topic"),
        "serde": wordcount_like(value=serdes.Int()),
        "node": wordcount_like(extra_filter=True),
        "window": wordcount_like(window=TumblingWindow(1000)),
        "grace": wordcount_like(window=TumblingWindow(1000, grace=10)),
    }
    assert base not in changed.values()
    assert len(set(changed.values())) == len(changed)


def test_the_example_and_its_inline_twin_agree():
    # The same structure declared two ways (decorators vs fluent lambdas) hashes the same.
    assert load_app(str(WORDCOUNT)).topology().hash == wordcount_like()
