"""The high-availability tests' app: a big key-value store filled cheaply.

Each input record (key: any text, value: "FIRST COUNT VERSION") makes its task put keys
"kFIRST" .. "k(FIRST+COUNT-1)" = VERSION into store ``keys`` (so a few thousand records build a
store of a million keys), and forwards one record "TASK,COUNT,VERSION,PROCESSED_AT_MS" to ``ha-keys-progress`` so tests
can see which task processed what, and when (wall clock: record timestamps are the input's).
"""

import time

from pystreams import serdes
from pystreams.app import App, Processor, kv_store

app = App("ha_keys")
commands = app.topic("ha-keys-in", key=serdes.Text(), value=serdes.Text())


class FillKeys(Processor):
    def init(self, context):
        super().init(context)
        self.keys = context.store("keys")

    def process(self, key, value):
        first, count, version = (int(part) for part in value.split())
        put = self.keys.put
        for index in range(first, first + count):
            put(f"k{index}", version)
        self.context.forward(key, f"{self.context.task_id},{count},{version},{time.time_ns() // 1_000_000}")


filled = app.processor(commands, stores=[kv_store("keys", key=serdes.Text(), value=serdes.Int())], key_changing=False)(FillKeys)
filled.to("ha-keys-progress", value=serdes.Text())
