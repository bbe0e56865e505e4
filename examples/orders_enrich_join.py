"""Orders enriched with their customer (stream–table join) and matched with their payment
(windowed stream–stream join).

* ``orders`` (key: order id) is re-keyed by customer id — a repartition topic — and joined
  with the ``customers`` table (key: customer id) into ``orders-enriched``;
* ``orders`` and ``payments`` (both keyed by order id, so they must be co-partitioned) are
  joined when a payment arrives within 15 minutes of its order, into ``orders-paid``.

Values are msgspec Structs as MessagePack.
"""

from datetime import timedelta

import msgspec

from pystreams import serdes
from pystreams.app import App, JoinWindow


class Order(msgspec.Struct):
    order_id: str
    customer_id: str
    amount_cents: int


class Customer(msgspec.Struct):
    customer_id: str
    name: str
    tier: str


class Payment(msgspec.Struct):
    order_id: str
    amount_cents: int


class EnrichedOrder(msgspec.Struct):
    order: Order
    customer_name: str
    tier: str


class PaidOrder(msgspec.Struct):
    order: Order
    paid_cents: int


app = App("orders")
orders = app.topic("orders", value=serdes.Struct(Order))
payments = app.topic("payments", value=serdes.Struct(Payment))
customers = app.table("customers", value=serdes.Struct(Customer))


@app.map(orders, value=serdes.Struct(Order))
def orders_by_customer(order_id, order):
    return order.customer_id, order


@app.join(orders_by_customer, customers, value=serdes.Struct(EnrichedOrder))
def enriched(customer_id, order, customer):
    return EnrichedOrder(order, customer.name, customer.tier)


enriched.to("orders-enriched")


@app.join(
    orders,
    payments,
    window=JoinWindow(before=timedelta(0), after=timedelta(minutes=15)),
    value=serdes.Struct(PaidOrder),
)
def paid(order_id, order, payment):
    return PaidOrder(order, payment.amount_cents)


paid.to("orders-paid")
