"""De-duplicate events by id with a low-level processor, its own store and punctuations.

``events`` (key: event id, value: JSON) go to ``events-unique`` unless the same id was seen
in the last hour of event time. The ``seen-ids`` store remembers when each id was first seen
(8-byte big-endian ms); a stream-time punctuation forgets ids older than an hour, and a
wall-clock punctuation logs how many ids the task remembers, even when no events arrive.
"""

import logging
from datetime import timedelta

from pystreams import serdes
from pystreams.app import App, Processor, PunctuationType, kv_store, punctuate

DEDUPE_WINDOW_MS = 60 * 60 * 1000
log = logging.getLogger(__name__)

app = App("dedupe")
events = app.topic("events", value=serdes.Json())


class Dedupe(Processor):
    def init(self, context):
        super().init(context)
        self.seen = context.store("seen-ids")

    def process(self, event_id, event):
        first_seen = self.seen.get(event_id)
        if first_seen is None or self.context.timestamp - first_seen > DEDUPE_WINDOW_MS:
            self.seen.put(event_id, self.context.timestamp)
            self.context.forward(event_id, event)

    @punctuate(every=timedelta(minutes=1), on=PunctuationType.STREAM_TIME)
    def forget_old_ids(self, stream_time_ms):
        expired = [key for key, first_seen in self.seen.items() if stream_time_ms - first_seen > DEDUPE_WINDOW_MS]
        for key in expired:
            self.seen.delete(key)

    @punctuate(every=timedelta(seconds=30), on=PunctuationType.WALL_CLOCK_TIME)
    def report(self, now_ms):
        log.info("task %s remembers %d event ids", self.context.task_id, sum(1 for _ in self.seen.items()))


# key_changing=False: it forwards the ids it receives, so nothing downstream needs a repartition.
unique = app.processor(events, stores=[kv_store("seen-ids", value=serdes.Int())], key_changing=False)(Dedupe)
unique.to("events-unique")
