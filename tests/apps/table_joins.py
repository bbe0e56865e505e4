"""A table-table outer join and a foreign-key left join, for the worker process tests: Int
tables ``tj-left`` / ``tj-right`` joined on the key into ``tj-joined``; ``tj-orders`` (JSON
``{"n": int, "c": customer}``) joined with the Int table ``tj-customers`` by customer into
``tj-fk``. Both results are Int values, so ``LatestValueReader`` reads them."""

from pystreams import serdes
from pystreams.app import App

app = App("table-joins")
left = app.table("tj-left", value=serdes.Int())
right = app.table("tj-right", value=serdes.Int())
left.join(right, lambda key, a, b: (a or 0) * 1000 + (b or 0), how="outer", value=serdes.Int(), store="joined", name="joined").to_stream().to("tj-joined")

orders = app.table("tj-orders", value=serdes.Json())
customers = app.table("tj-customers", value=serdes.Int())
orders.join(
    customers,
    lambda key, order, zone: order["n"] * 1000 + (zone if zone is not None else 999),
    foreign_key=lambda key, order: order["c"],
    how="left",
    value=serdes.Int(),
    store="fk-joined",
    name="fk",
).to_stream().to("tj-fk")
