"""The simulated network between member processes and the coordinator.

Every member process has one link to the coordinator. A message on a link may be delayed,
held back (a straggler, which may outlive its sender's request timeout), dropped, or delivered
twice; a link may be cut (a network partition), which loses whatever crosses it in either
direction, including messages already in flight when the cut starts. All randomness comes
from the seeded ``rng``.

Answers may be duplicated and may overtake each other freely: the member must ignore an
answer to a request it no longer waits for. Requests, by default, are neither duplicated nor
reordered: one member's requests reach the coordinator once each, in the order it sent them (a
straggler holds back those behind it), as on a Kafka connection. KIP-848 relies on that: a
heartbeat carries no sequence number, so a copy processed after a newer heartbeat carries a
stale epoch or a stale set of owned partitions, and the coordinator fences a live member (which
does not hear of it until its next heartbeat) or releases partitions the member still holds.
``duplicate_requests`` and ``ordered_requests=False`` lift those guarantees, to show exactly that.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pystreams.sim.events import EventQueue


@dataclass(frozen=True)
class NetworkFaults:
    #: Every message takes between these many milliseconds; at least 1, so an answer never
    #: arrives in the same instant as the event that caused it.
    min_delay_ms: int = 1
    max_delay_ms: int = 5
    drop: float = 0.0
    #: Probability an answer (coordinator to member) is delivered twice.
    duplicate: float = 0.0
    #: Probability a request (member to coordinator) is delivered twice.
    duplicate_requests: float = 0.0
    #: Probability that a message is held back by up to ``straggle_max_ms`` more, so that later
    #: messages overtake it (and it may outlive its sender's request timeout).
    straggle: float = 0.0
    straggle_max_ms: int = 0
    #: One member's requests arrive in the order they were sent (see the module docstring).
    ordered_requests: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_delay_ms <= self.max_delay_ms:
            raise ValueError("delays must satisfy 1 <= min_delay_ms <= max_delay_ms")


QUIET_NETWORK = NetworkFaults()


class Network:
    def __init__(self, rng: random.Random, queue: EventQueue, clock: Callable[[], int], stats: Counter) -> None:
        self.rng = rng
        self.queue = queue
        self.clock = clock
        self.stats = stats
        self.faults = QUIET_NETWORK
        #: Endpoints whose link to the coordinator is cut.
        self.cut: set[str] = set()
        #: When the last duplicated or held-back message lands: until then, faults have not
        #: really stopped, whatever the fault settings say.
        self.last_fault_arrival_ms = 0
        self._last_ordered_arrival: dict[str, int] = {}

    def send(self, endpoint: str, deliver: Callable[..., Any], *args: Any, request: bool = False) -> None:
        """Carry one message over ``endpoint``'s link; ``deliver(*args)`` runs on arrival.
        ``request``: a member's request to the coordinator (kept in order if so configured)."""
        faults, rng = self.faults, self.rng
        if endpoint in self.cut:
            self.stats["net.cut"] += 1
            return
        if faults.drop and rng.random() < faults.drop:
            self.stats["net.dropped"] += 1
            return
        copies = 1
        duplicate = faults.duplicate_requests if request else faults.duplicate
        if duplicate and rng.random() < duplicate:
            copies = 2
            self.stats["net.duplicated"] += 1
        now = self.clock()
        for _ in range(copies):
            delay = rng.randint(faults.min_delay_ms, faults.max_delay_ms)
            faulty = copies > 1
            if faults.straggle and rng.random() < faults.straggle:
                delay += rng.randint(1, faults.straggle_max_ms)
                self.stats["net.straggled"] += 1
                faulty = True
            arrival = now + delay
            if request and faults.ordered_requests:
                # Same-time arrivals run in push order, so equal times keep the order too.
                arrival = max(arrival, self._last_ordered_arrival.get(endpoint, 0))
                self._last_ordered_arrival[endpoint] = arrival
            if faulty:
                self.last_fault_arrival_ms = max(self.last_fault_arrival_ms, arrival)
            self.queue.push(arrival, self._arrive, endpoint, deliver, args)

    def _arrive(self, endpoint: str, deliver: Callable[..., Any], args: tuple) -> None:
        if endpoint in self.cut:
            self.stats["net.cut"] += 1
            return
        deliver(*args)
