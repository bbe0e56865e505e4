"""The interactive-query tests' app: one store of each kind, over visits keyed by user.

``visits`` holds the page a user visited (text key and value; event time is the record's
timestamp). ``counts`` counts visits per user (key-value store), ``per-minute`` per user and
1-minute tumbling window (window store), ``sessions`` per user session, 30 s of inactivity
ending one (session store), ``recent`` per user and 10 s sliding window (window store of a
sliding aggregation), ``weighted`` a cogroup per user and minute of every visit (1) and of home
page visits (10 more), two streams into one window store.
"""

from datetime import timedelta

from pystreams import serdes
from pystreams.app import App, SessionWindow, SlidingWindow, TumblingWindow

app = App("query_stores")
visits = app.topic("visits", key=serdes.Text(), value=serdes.Text())
visits.count(store="counts").to("visit-counts")
visits.count(store="per-minute", window=TumblingWindow(size=timedelta(minutes=1), grace=timedelta(minutes=10)))
visits.count(store="sessions", window=SessionWindow(gap=timedelta(seconds=30), grace=timedelta(minutes=10)))
visits.count(store="recent", window=SlidingWindow(difference=timedelta(seconds=10), grace=timedelta(minutes=10)))
home_visits = visits.filter(lambda user, page: page == "/home", name="home-visits")
(
    visits.cogroup(lambda total, user, page: total + 1)
    .cogroup(home_visits, lambda total, user, page: total + 10)
    .aggregate(initial=0, store="weighted", window=TumblingWindow(size=timedelta(minutes=1), grace=timedelta(minutes=10)))
)
