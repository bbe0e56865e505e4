"""State-store benchmark: the record cache, flushes, restore and reads on real RocksDB.

Measures, for one key-value store of one task (changelog sends go to a counting sink, so only
the store is timed):

* puts/s through the cache with a flush (WriteBatch + changelog + forward) every commit
  interval, for 1,000,000 updates over 10,000 distinct keys and over 1,000,000 distinct keys,
  and how many changelog records each run emitted (the cache folds repeated keys);
* word-count style read-modify-write updates/s (get + put) over 10,000 keys;
* restore records/s applying 1,000,000 changelog records in batches;
* gets/s served by RocksDB (cache empty) and by the cache.

Prints one JSON document.

    python benchmarks/state.py [--updates N] [--state-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time

from pystreams.state import CacheLimits, ChangelogRecord, TaskState

COMMIT_EVERY_UPDATES = 100_000  # ≈ 2 s of input at the 51k words/s target
RESTORE_BATCH_RECORDS = 2_000


class CountingSink:
    def __init__(self) -> None:
        self.records = 0

    def send(self, topic: str, partition: int, key: bytes, value: bytes | None, timestamp: int | None = None) -> None:
        self.records += 1


def _open(state_dir: str, task_id: str, sink: CountingSink) -> tuple[TaskState, object, list[int]]:
    forwarded = [0]

    def forward(changes: list) -> None:
        forwarded[0] += len(changes)

    state = TaskState(state_dir, "bench", task_id, 0, sink)
    store = state.key_value_store("counts", cache_limits=CacheLimits(), forward=forward)
    return state, store, forwarded


def bench_puts(state_dir: str, task_id: str, updates: int, distinct_keys: int) -> dict:
    rng = random.Random(7)
    keys = [b"word-%d" % index for index in range(distinct_keys)]
    if distinct_keys >= updates:
        sequence = keys[:updates]
        rng.shuffle(sequence)
    else:
        sequence = [keys[rng.randrange(distinct_keys)] for _ in range(updates)]
    values = [b"%d" % (index % 1000) for index in range(updates)]
    sink = CountingSink()
    state, store, forwarded = _open(state_dir, task_id, sink)
    put = store.put
    started = time.perf_counter()
    for start in range(0, updates, COMMIT_EVERY_UPDATES):
        for index in range(start, min(start + COMMIT_EVERY_UPDATES, updates)):
            put(sequence[index], values[index])
        state.flush()
    elapsed = time.perf_counter() - started
    result = {
        "updates": updates,
        "distinct_keys": distinct_keys,
        "puts_per_s": round(updates / elapsed),
        "changelog_records": sink.records,
        "forwarded_records": forwarded[0],
        "evicted_entries": store.cache.evicted_entries,
        "fold_ratio": round(updates / max(1, sink.records), 1),
    }
    state.close()
    return result


def bench_word_count(state_dir: str, updates: int, distinct_keys: int) -> dict:
    rng = random.Random(11)
    words = [b"word-%d" % rng.randrange(distinct_keys) for _ in range(updates)]
    sink = CountingSink()
    state, store, _ = _open(state_dir, "word_count", sink)
    get, put = store.get, store.put
    started = time.perf_counter()
    for start in range(0, updates, COMMIT_EVERY_UPDATES):
        for word in words[start : start + COMMIT_EVERY_UPDATES]:
            count = get(word)
            put(word, b"%d" % (int(count) + 1 if count is not None else 1))
        state.flush()
    elapsed = time.perf_counter() - started
    state.close()
    return {"updates": updates, "distinct_keys": distinct_keys, "updates_per_s": round(updates / elapsed), "changelog_records": sink.records}


def bench_restore_and_gets(state_dir: str, records: int) -> dict:
    rng = random.Random(13)
    distinct_keys = records // 2
    changelog = [ChangelogRecord(offset, b"word-%d" % rng.randrange(distinct_keys), b"%d" % offset) for offset in range(records)]
    batches = [changelog[start : start + RESTORE_BATCH_RECORDS] for start in range(0, records, RESTORE_BATCH_RECORDS)]
    sink = CountingSink()
    state, store, _ = _open(state_dir, "restore", sink)
    started = time.perf_counter()
    restored = state.restore_changelog(store.changelog, batches, records)
    restore_elapsed = time.perf_counter() - started
    assert restored == records and store.changelog_position == records

    lookups = [b"word-%d" % rng.randrange(distinct_keys) for _ in range(records)]
    get = store.get
    started = time.perf_counter()
    hits = sum(1 for key in lookups if get(key) is not None)
    rocksdb_elapsed = time.perf_counter() - started

    cached_keys = lookups[:50_000]
    for key in cached_keys:
        store.put(key, b"cached")
    started = time.perf_counter()
    for _ in range(10):
        for key in cached_keys:
            get(key)
    cached_elapsed = time.perf_counter() - started
    state.flush()
    state.close()
    return {
        "restore": {"records": records, "batch_records": RESTORE_BATCH_RECORDS, "records_per_s": round(records / restore_elapsed)},
        "gets": {
            "rocksdb_gets_per_s": round(records / rocksdb_elapsed),
            "rocksdb_hit_ratio": round(hits / records, 3),
            "cached_gets_per_s": round(10 * len(cached_keys) / cached_elapsed),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--state-dir", default=None, help="where RocksDB writes (default: a temporary directory)")
    arguments = parser.parse_args()
    updates = arguments.updates
    with tempfile.TemporaryDirectory(dir=arguments.state_dir) as state_dir:
        result = {
            "benchmark": "state",
            "python": platform.python_version(),
            "machine": f"{platform.machine()}, {platform.system()}",
            "commit_every_updates": COMMIT_EVERY_UPDATES,
            "cache_limits": {"max_entries": CacheLimits().max_entries, "max_bytes": CacheLimits().max_bytes},
            "puts_10k_keys": bench_puts(state_dir, "puts_10k", updates, 10_000),
            "puts_all_distinct_keys": bench_puts(state_dir, "puts_distinct", updates, updates),
            "word_count_get_put_10k_keys": bench_word_count(state_dir, updates, 10_000),
            **bench_restore_and_gets(state_dir, updates),
        }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
