"""Orders enriched from a global table, for the worker process tests: ``ge-orders`` (JSON
``{"n": int, "c": customer}``) left-joined with the global table of ``ge-customers`` (Int zone
per customer) by customer into ``ge-enriched``: ``n * 1_000_000 + zone``, or ``+ 999_999``
when the lookup found no customer. Int values, so ``LatestValueReader`` reads them."""

from pystreams import serdes
from pystreams.app import App

MISSING = 999_999

app = App("global-enrich")
customers = app.global_table("ge-customers", value=serdes.Int())
orders = app.topic("ge-orders", value=serdes.Json())
orders.join(
    customers,
    lambda key, order, zone: order["n"] * 1_000_000 + (zone if zone is not None else MISSING),
    foreign_key=lambda key, order: order["c"],
    how="left",
    value=serdes.Int(),
    name="enrich",
).to("ge-enriched")
