"""The failure-path tests' app: JSON events keyed by user, counted per user.

``events`` holds JSON objects keyed by the user (``ann`` → ``{"n": 1}``); a value that is not
JSON is a bad record. ``event-counts`` gets each user's running count (8-byte big-endian).
One sub-topology, one task per partition of ``events``.

Two switches in a worker's environment: ``JSON_EVENTS_POISON=PREFIX`` makes its processing of
the events of users whose name starts with PREFIX fail (so tests can make exactly one worker
fail), and ``JSON_EVENTS_CLOSE_S=S`` makes closing a task take S seconds (as closing a large
store may).
"""

import os
import time

from pystreams import serdes
from pystreams.app import App, Processor

app = App("json_events")
events = app.topic("events", key=serdes.Text(), value=serdes.Json())


class Checked(Processor):
    def process(self, user, event):
        poison = os.environ.get("JSON_EVENTS_POISON")
        if poison and user.startswith(poison):
            raise ValueError(f"poisoned user {user!r}")
        self.context.forward(user, event)

    def close(self):
        time.sleep(float(os.environ.get("JSON_EVENTS_CLOSE_S", "0")))


checked = app.processor(events, key_changing=False, name="checked")(Checked)
checked.count(store="event-counts").to("event-counts")
