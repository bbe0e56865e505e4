"""Restoring one store from its changelog, with progress reports."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from .changelog import ChangelogRecord, RestoreProgress
from .store import CachedStore

ProgressListener = Callable[[RestoreProgress], None]

# Small fetched batches are coalesced into WriteBatches of at least this many records: fewer,
# larger writes restore faster.
RESTORE_CHUNK_RECORDS = 10_000


def restore_store(
    store: CachedStore,
    batches: Iterable[Sequence[ChangelogRecord]],
    end_offset: int,
    *,
    task_id: str,
    on_progress: ProgressListener | None = None,
) -> int:
    """Apply ``batches`` (the changelog from the store's position up to ``end_offset``) in
    WriteBatches of RESTORE_CHUNK_RECORDS or more, report progress after each, and leave the
    store at ``end_offset``.

    Offsets may have gaps (compaction, transaction markers); reaching the end of ``batches``
    means the changelog was read up to ``end_offset``. Returns the records applied."""
    restored = 0

    def report(done: bool) -> None:
        if on_progress is not None:
            on_progress(RestoreProgress(task_id, store.name, store.changelog, restored, store.changelog_position, end_offset, done))

    report(False)
    pending: list[ChangelogRecord] = []
    for batch in batches:
        pending.extend(batch)
        if len(pending) >= RESTORE_CHUNK_RECORDS:
            restored += store.apply_changelog(pending)
            pending = []
            report(False)
    if pending:
        restored += store.apply_changelog(pending)
        report(False)
    store.advance_position(end_offset)
    report(True)
    return restored


class RestoreProgressLogger:
    """A ProgressListener that logs at INFO: the start of a restore, then at most once per
    ``every_records`` restored records, and its completion."""

    def __init__(self, logger: logging.Logger | None = None, every_records: int = 100_000) -> None:
        self._log = logger or logging.getLogger("pystreams.state.restore")
        self._every_records = every_records
        self._logged_at: dict[tuple[str, str], int] = {}

    def __call__(self, progress: RestoreProgress) -> None:
        ident = (progress.task_id, progress.store_name)
        if progress.done:
            started = self._logged_at.pop(ident, None) is not None
            self._log.log(
                logging.INFO if started or progress.restored_records else logging.DEBUG,
                "task %s store %s: restored %d records from %s-%d, now at offset %s",
                progress.task_id,
                progress.store_name,
                progress.restored_records,
                progress.changelog.topic,
                progress.changelog.partition,
                progress.position,
            )
            return
        last = self._logged_at.get(ident)
        if last is None:
            if progress.lag == 0:
                return
            self._log.info(
                "task %s store %s: restoring %s-%d from offset %s to %d (lag %d)",
                progress.task_id,
                progress.store_name,
                progress.changelog.topic,
                progress.changelog.partition,
                progress.position,
                progress.end_offset,
                progress.lag,
            )
            self._logged_at[ident] = progress.restored_records
        elif progress.restored_records - last >= self._every_records:
            self._log.info(
                "task %s store %s: restored %d records, %d to go",
                progress.task_id,
                progress.store_name,
                progress.restored_records,
                progress.lag,
            )
            self._logged_at[ident] = progress.restored_records
