"""Every order's shipping label, kept current as customers move (a foreign-key table join).

* ``orders`` is a table (key: order id) whose value names its customer;
* ``customers`` is a table (key: customer id) holding the customer's current address;
* each order joins the customer it names — the tables need not be co-partitioned — into the
  queryable table ``shipping-labels`` and the topic ``order-shipping``. When a customer moves,
  every order of theirs gets a new label; when an order names another customer, its label
  follows; a deleted order's label is deleted (a tombstone). An order whose customer is not
  known yet gets a label without an address (a left join) until the customer arrives.

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


app = App("shipping")
orders = app.table("orders", value=serdes.Struct(Order))
customers = app.table("customers", value=serdes.Struct(Address))


def customer_of(order_id: str, order: Order) -> str:
    return order.customer_id


@app.join(orders, customers, foreign_key=customer_of, how="left", value=serdes.Struct(ShippingLabel), store="shipping-labels")
def label(order_id: str, order: Order, address: Address | None) -> ShippingLabel:
    ship_to = f"{address.street}, {address.city}" if address is not None else "address pending"
    return ShippingLabel(order_id, order.item, ship_to)


label.to_stream().to("order-shipping")
