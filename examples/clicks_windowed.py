"""Windowed click analytics over every ``clicks.<region>`` topic (an RE2 pattern source).

Clicks are JSON ``{"user": ..., "url": ..., "ts": epoch_ms}``; event time comes from ``ts``.

* ``clicks-per-minute``: clicks per user in 1-minute tumbling windows, 10 s grace;
* ``url-views-5m``: views per URL over 5 minutes, every minute (hopping windows);
* ``user-sessions``: pages per user session (30 minutes of inactivity ends one), with the
  session's first and last page.

Keys of windowed outputs are ``WindowedKey(Text())``: the UTF-8 key then window start and
end as 8-byte big-endian ints.
"""

from datetime import timedelta

import msgspec

from pystreams import serdes
from pystreams.app import App, HoppingWindow, SessionWindow, TumblingWindow


class Click(msgspec.Struct):
    user: str
    url: str
    ts: int


class Session(msgspec.Struct):
    pages: int = 0
    first_url: str = ""
    last_url: str = ""


app = App("clicks")
clicks = app.topic(
    pattern=r"clicks\.[a-z]+",
    name="clicks",
    value=serdes.Json(type=Click),
    timestamp=lambda key, click, record_ts: click.ts,
)


@app.group_by(clicks)
def by_user(key, click):
    return click.user


@app.group_by(clicks)
def by_url(key, click):
    return click.url


clicks_per_minute = app.count(by_user, store="clicks-per-minute", window=TumblingWindow(size=timedelta(minutes=1), grace=timedelta(seconds=10)))
clicks_per_minute.to("clicks-per-minute")

url_views = app.count(by_url, store="url-views-5m", window=HoppingWindow(size=timedelta(minutes=5), advance=timedelta(minutes=1)))
url_views.to("url-views-5m")


def merge_sessions(user, older, newer):
    return Session(older.pages + newer.pages, older.first_url or newer.first_url, newer.last_url or older.last_url)


@app.aggregate(
    by_user,
    initial=Session,  # a factory: a fresh Session per new session; also picks the Struct serde
    window=SessionWindow(gap=timedelta(minutes=30), grace=timedelta(minutes=1)),
    merge=merge_sessions,
)
def user_sessions(session, user, click):
    return Session(session.pages + 1, session.first_url or click.url, click.url)


user_sessions.to("user-sessions")
