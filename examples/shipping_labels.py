"""Every order's shipping label, kept current as customers move (a foreign-key table join),
and the carrier that delivers it (a global table).

* ``orders`` is a table (key: order id) whose value names its customer;
* ``customers`` is a table (key: customer id) holding the customer's current address;
* each order joins the customer it names — the tables need not be co-partitioned — into the
  queryable table ``shipping-labels`` and the topic ``order-shipping``. When a customer moves,
  every order of theirs gets a new label; when an order names another customer, its label
  follows; a deleted order's label is deleted (a tombstone). An order whose customer is not
  known yet gets a label without an address (a left join) until the customer arrives;
* ``carriers`` is a global table (key: city) naming the carrier serving each city: every
  worker holds all of it, so each label update looks its city's carrier up whatever partition
  it is on, into the topic ``order-dispatch`` ("unassigned" for a city no carrier serves yet).

Values are msgspec Structs as MessagePack.
"""

import msgspec

from pystreams import serdes
from pystreams.app import App


class Order(msgspec.Struct):
    customer_id: str
    item: str


class Address(msgspec.Struct):
    street: str
    city: str


class ShippingLabel(msgspec.Struct):
    order_id: str
    item: str
    ship_to: str
    city: str | None = None


class Dispatch(msgspec.Struct):
    order_id: str
    ship_to: str
    carrier: str


app = App("shipping")
orders = app.table("orders", value=serdes.Struct(Order))
customers = app.table("customers", value=serdes.Struct(Address))
carriers = app.global_table("carriers", value=serdes.Text())


def customer_of(order_id: str, order: Order) -> str:
    return order.customer_id


@app.join(orders, customers, foreign_key=customer_of, how="left", value=serdes.Struct(ShippingLabel), store="shipping-labels")
def label(order_id: str, order: Order, address: Address | None) -> ShippingLabel:
    if address is None:
        return ShippingLabel(order_id, order.item, "address pending")
    return ShippingLabel(order_id, order.item, f"{address.street}, {address.city}", address.city)


labels = label.to_stream()
labels.to("order-shipping")


def city_of(order_id: str, label: ShippingLabel) -> str | None:
    return label.city


@app.join(labels, carriers, foreign_key=city_of, how="left", value=serdes.Struct(Dispatch))
def dispatch(order_id: str, label: ShippingLabel, carrier: str | None) -> Dispatch:
    return Dispatch(order_id, label.ship_to, carrier or "unassigned")


dispatch.to("order-dispatch")
