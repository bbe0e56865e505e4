"""The app the base manifests run (mounted from the ConfigMap ``pystreams-app``): how many
events each key has had so far.

Input ``events``: key = UTF-8 text (a user, a device, ...), any value. Output ``event-counts``:
key = the same key, value = its count so far as an 8-byte big-endian signed integer. The count
is kept in the RocksDB store ``counts`` (changelog ``pystreams-demo-counts-changelog``), so it is
restored, replicated to standbys and queryable:

    pystreams query /etc/pystreams/app/app.py counts KEY --endpoint POD.pystreams-worker:7070

Replace it with your own app: point ``PYSTREAMS_APP`` at a file of your image, or put your file
in this ConfigMap (see deploy/README.md).
"""

import pystreams as ps

app = ps.App("pystreams-demo")  # application.id: the group id, and the prefix of internal topics
events = app.topic("events", key=ps.serdes.Text(), value=ps.serdes.Bytes())
app.count(events, store="counts").to("event-counts")
