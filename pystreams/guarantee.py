"""``processing.guarantee``: what a crash may do to an app's results (Kafka Streams' names).

* ``at_least_once`` (the default): outputs and state changes are written, then input offsets are
  committed. A worker that dies between the two makes the next owner process those inputs
  again, so their effects can show up twice downstream (a count can end too high).
* ``exactly_once_v2``: every commit is one Kafka transaction holding the sink, repartition and
  changelog writes *and* the input positions; ``read_committed`` readers see each input
  record's effects exactly once, whatever crashes (see ``pystreams/worker/exactly_once.py``).
"""

from __future__ import annotations

from enum import StrEnum


class ProcessingGuarantee(StrEnum):
    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE_V2 = "exactly_once_v2"

    @classmethod
    def parse(cls, text: str) -> ProcessingGuarantee:
        """The guarantee named ``text``; a clear error for anything else (Kafka Streams' old
        ``exactly_once``/``exactly_once_beta`` names were removed in Kafka 4, and are here)."""
        try:
            return cls(text.strip().lower())
        except ValueError:
            choices = ", ".join(g.value for g in cls)
            raise ValueError(f"unknown processing guarantee {text!r} (choose one of: {choices})") from None

    @property
    def exactly_once(self) -> bool:
        return self is ProcessingGuarantee.EXACTLY_ONCE_V2

    @property
    def default_commit_interval_ms(self) -> int:
        """``commit.interval.ms`` when none is given: 100 ms under exactly-once, as in Kafka
        Streams (a transaction's outputs are invisible until it commits, so the interval is
        the floor of end-to-end latency); 1 s otherwise (this project's demos want results
        sooner than Kafka Streams' 30 s)."""
        return 100 if self.exactly_once else 1000
