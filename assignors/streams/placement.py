"""Where every task of a Streams group runs: active, standby and warm-up replicas.

A pure, deterministic function of its input (no IO, no clock; ties broken by process and
member id), in the spirit of Kafka Streams' HighAvailabilityTaskAssignor:

1. **Actives, balanced and sticky where lags allow.** Every thread (member) is worth
   ``T // M`` tasks and ``T % M`` threads one more, so a process's share is proportional to
   its threads. A stateful task's active may run only on a process whose state is within
   ``acceptable_recovery_lag`` (the current owner's process counts as caught up), or on the
   most caught-up one when none is; a task without state anywhere may run anywhere. Tasks
   that fewest processes may run are placed first; in each rank owners' processes keep their
   tasks while they have room (round robin over the owning threads), then the rest go to the
   best process with room that may run them, else to the least-loaded process (tasks anyone
   may run) or, over its share, to the best process that may run them (the current owner's
   first): the task is *held back*. Each process then spreads its tasks evenly over its
   threads, a thread keeping the tasks it owns while that stays even.
2. **Warm-up targets.** Each held-back task is meant to move to the least-loaded member of
   another process, preferring processes with some (not yet enough) state for it; chosen from
   the final loads, so an unchanged group gets the same targets again.
3. **Standbys.** ``num_standby_replicas`` per stateful task, on distinct processes other than
   the active's: first the processes whose ``rack_aware_assignment_tags`` values coincide least
   with the processes already holding the task, then those with state for it (lowest lag,
   while under their fair share), then the least loaded.
4. **Warm-ups.** The targets of step 2, in task order, up to ``max_warmup_replicas``, on the
   process the task is meant to move to (its thread with the fewest replicas); none where
   that process already has a standby of the task (the standby is the warm-up).

Cost: about O((T + L) log P) for T tasks, P processes and L reported lags, plus, per
standby, one look at each distinct combination of rack tag values.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pystreams.topology.ir import TaskId

_NO_STATE = math.inf


@dataclass(frozen=True)
class HaConfig:
    """The high-availability settings (Kafka: ``num.standby.replicas``, ``max.warmup.replicas``,
    ``acceptable.recovery.lag``, ``rack.aware.assignment.tags``)."""

    num_standby_replicas: int = 0
    max_warmup_replicas: int = 2
    acceptable_recovery_lag: int = 10_000
    rack_aware_assignment_tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, kafka_name in (
            ("num_standby_replicas", "num.standby.replicas"),
            ("max_warmup_replicas", "max.warmup.replicas"),
            ("acceptable_recovery_lag", "acceptable.recovery.lag"),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{kafka_name} must be a non-negative integer, got {value!r}")
        tags = self.rack_aware_assignment_tags
        if isinstance(tags, str):
            raise ValueError(f"rack.aware.assignment.tags must be a sequence of tag names, not the string {tags!r}")
        tags = tuple(tags)
        if any(not isinstance(tag, str) or not tag for tag in tags):
            raise ValueError(f"rack.aware.assignment.tags must be non-empty strings, got {tags!r}")
        if len(set(tags)) != len(tags):
            raise ValueError(f"rack.aware.assignment.tags has duplicates: {tags!r}")
        object.__setattr__(self, "rack_aware_assignment_tags", tags)


@dataclass(frozen=True)
class ProcessSpec:
    """One worker process: its stream threads (member ids), tags and local state."""

    process_id: str
    member_ids: tuple[str, ...]
    client_tags: Mapping[str, str] = field(default_factory=dict)
    #: Records behind the changelog end, for each task this process has local state for.
    task_lags: Mapping[TaskId, int] = field(default_factory=dict)


@dataclass
class MemberTasks:
    active: list[TaskId] = field(default_factory=list)
    standby: list[TaskId] = field(default_factory=list)
    warmup: list[TaskId] = field(default_factory=list)


def place_tasks(
    tasks: Iterable[TaskId],
    stateful: Collection[TaskId],
    processes: Sequence[ProcessSpec],
    current_owners: Mapping[TaskId, str],
    config: HaConfig = HaConfig(),
) -> dict[str, MemberTasks]:
    """Member id -> its active, standby and warm-up tasks (sorted). See the module docstring."""
    return _Placement(sorted(set(tasks)), stateful, processes, current_owners, config).run()


class _Process:
    __slots__ = ("index", "process_id", "members", "capacity", "tag_values", "actives", "replicas")

    def __init__(self, index: int, spec: ProcessSpec, tag_keys: tuple[str, ...]) -> None:
        self.index = index
        self.process_id = spec.process_id
        self.members = tuple(sorted(spec.member_ids))
        self.capacity = len(self.members)
        self.tag_values = tuple(spec.client_tags.get(key) for key in tag_keys)
        self.actives = 0
        self.replicas = 0

    def replica_load(self) -> float:
        return self.replicas / self.capacity

    def active_load(self) -> float:
        return self.actives / self.capacity


class _Placement:
    def __init__(
        self,
        tasks: list[TaskId],
        stateful: Collection[TaskId],
        specs: Sequence[ProcessSpec],
        current_owners: Mapping[TaskId, str],
        config: HaConfig,
    ) -> None:
        self.tasks = tasks
        self.config = config
        specs = sorted(specs, key=lambda spec: spec.process_id)
        if len({spec.process_id for spec in specs}) != len(specs):
            raise ValueError("process ids must be unique")
        self.processes = [_Process(index, spec, config.rack_aware_assignment_tags) for index, spec in enumerate(specs)]
        self.process_of: dict[str, _Process] = {}
        for process in self.processes:
            if not process.members:
                raise ValueError(f"process {process.process_id} has no members")
            for member_id in process.members:
                if member_id in self.process_of:
                    raise ValueError(f"member {member_id!r} belongs to two processes")
                self.process_of[member_id] = process
        self.member_ids = sorted(self.process_of)
        task_set = set(tasks)
        self.owner = {task: mid for task, mid in current_owners.items() if task in task_set and mid in self.process_of}
        self.stateful = {task for task in tasks if task in stateful}
        # task -> {process index: lag}; the owner's process holds the live state (lag 0).
        self.lags: dict[TaskId, dict[int, int]] = {}
        for process, spec in zip(self.processes, specs):
            for task, lag in spec.task_lags.items():
                if task in self.stateful:
                    self.lags.setdefault(task, {})[process.index] = max(0, lag)
        for task, mid in self.owner.items():
            if task in self.stateful:
                self.lags.setdefault(task, {})[self.process_of[mid].index] = 0
        self.result = {mid: MemberTasks() for mid in self.member_ids}
        #: Standbys and warm-ups per member, to spread them over a process's threads.
        self.member_replicas = dict.fromkeys(self.member_ids, 0)

    def run(self) -> dict[str, MemberTasks]:
        if not self.member_ids:
            if self.tasks:
                raise ValueError("tasks to place but no members")
            return {}
        active, held_back = self._place_actives()
        standby_processes = self._place_standbys(active)
        self._place_warmups(self._warmup_targets(active, held_back), standby_processes)
        for task, mid in active.items():
            self.result[mid].active.append(task)
        for tasks in self.result.values():
            tasks.active.sort()
            tasks.standby.sort()
            tasks.warmup.sort()
        return self.result

    # -- 1. actives: balanced and sticky where lags allow ----------------------------------------

    def _place_actives(self) -> tuple[dict[TaskId, str], list[TaskId]]:
        """Task -> member running it, and the tasks held back on a process over its share
        because no process with room may run them yet."""
        per_process = self._place_actives_on_processes()
        active: dict[TaskId, str] = {}
        for process in self.processes:
            active.update(self._spread_over_threads(process, per_process[process.index][0]))
        held_back = sorted(task for tasks, held in per_process.values() for task in held)
        return active, held_back

    def _place_actives_on_processes(self) -> dict[int, tuple[list[TaskId], list[TaskId]]]:
        """Process index -> (its tasks, those of them held back there)."""
        base, extra = divmod(len(self.tasks), len(self.member_ids))
        placed: dict[int, tuple[list[TaskId], list[TaskId]]] = {p.index: ([], []) for p in self.processes}

        # Every thread is worth ``base`` tasks and ``extra`` threads one more: a process has
        # room below ``base`` per thread, and up to one more per thread while the one-more
        # slots last. They are claimed as tasks are placed: the first placed decide who gets them.
        def has_room(process: _Process) -> bool:
            floor = base * process.capacity
            return process.actives < floor or (process.actives < floor + process.capacity and extra > 0)

        # Processes with room, least loaded per thread first; entries go stale (lazy heap).
        room = [(0.0, p.index) for p in self.processes]

        def place(task: TaskId, process: _Process, held_back: bool = False) -> None:
            nonlocal extra
            placed[process.index][0].append(task)
            if held_back:
                placed[process.index][1].append(task)
            elif process.actives >= base * process.capacity:
                extra -= 1
            process.actives += 1
            if has_room(process):
                heapq.heappush(room, (process.active_load(), process.index))

        by_rank: dict[int, list[TaskId]] = {}
        for task in self.tasks:
            by_rank.setdefault(self._placing_rank(task), []).append(task)
        for rank in sorted(by_rank):
            # Owners keep their tasks first, so moving one task never displaces another; round
            # robin over the owning threads, so a full process keeps some of each thread's.
            moving = [task for task in by_rank[rank] if task not in self.owner]
            position: dict[str, int] = {}
            owned = []
            for task in by_rank[rank]:
                if task in self.owner:
                    owner = self.owner[task]
                    position[owner] = position.get(owner, -1) + 1
                    owned.append((position[owner], task))
            for _, task in sorted(owned):
                process = self.process_of[self.owner[task]]
                if has_room(process):
                    place(task, process)
                else:
                    moving.append(task)
            for task in moving:
                eligible = self._eligible(task)
                if not eligible:  # stateless, or no state anywhere: the least-loaded process
                    while True:
                        entry_load, index = heapq.heappop(room)
                        process = self.processes[index]
                        if entry_load == process.active_load() and has_room(process):
                            break
                    place(task, process)
                    continue
                chosen = next((process for process in eligible if has_room(process)), None)
                if chosen is not None:
                    place(task, chosen)
                else:
                    # Every process that may run it is full: it stays on (or goes to) the best
                    # of them, over its share, until a warm-up elsewhere catches up.
                    place(task, eligible[0], held_back=True)
        return placed

    def _spread_over_threads(self, process: _Process, tasks: list[TaskId]) -> dict[TaskId, str]:
        """A process's tasks over its threads, evenly; a thread keeps what it owns while even."""
        base, extra = divmod(len(tasks), process.capacity)
        owned: dict[str, list[TaskId]] = {mid: [] for mid in process.members}
        for task in sorted(tasks):
            owner = self.owner.get(task)
            if owner in owned:
                owned[owner].append(task)
        limit = dict.fromkeys(process.members, base)
        for mid in sorted(process.members, key=lambda m: (-min(len(owned[m]), base + 1), m))[:extra]:
            limit[mid] += 1
        result: dict[TaskId, str] = {}
        load = {}
        for mid in process.members:
            for task in owned[mid][: limit[mid]]:
                result[task] = mid
            load[mid] = min(len(owned[mid]), limit[mid])
        for task in sorted(tasks):
            if task not in result:
                mid = min((m for m in process.members if load[m] < limit[m]), key=lambda m: (load[m], m))
                result[task] = mid
                load[mid] += 1
        return result

    def _eligible(self, task: TaskId) -> list[_Process]:
        """The processes that may run a stateful task's active, best first: the caught-up ones,
        else the most caught-up; the owner's process first among equals. Empty: anyone may."""
        holders = self.lags.get(task)
        if not holders:
            return []
        acceptable = self.config.acceptable_recovery_lag
        best = min(holders.values())
        owner = self.owner.get(task)
        owner_index = self.process_of[owner].index if owner is not None else -1
        indexes = [i for i, lag in holders.items() if lag <= acceptable or lag == best]
        indexes.sort(key=lambda i: (i != owner_index, holders[i], self.processes[i].active_load(), i))
        return [self.processes[i] for i in indexes]

    def _placing_rank(self, task: TaskId) -> int:
        """Tasks fewest processes may run go first, so they get the slots where their state is:
        the number of processes that may run it; stateless and stateless-so-far tasks last."""
        holders = self.lags.get(task)
        if not holders:
            return len(self.processes) + 1
        acceptable = self.config.acceptable_recovery_lag
        best = min(holders.values())
        return sum(1 for lag in holders.values() if lag <= acceptable or lag == best)

    # -- 2. where held-back tasks should go: warm-up targets -------------------------------------

    def _warmup_targets(self, active: Mapping[TaskId, str], held_back: list[TaskId]) -> list[tuple[TaskId, str]]:
        """For each held-back task, the member it should move to once its state is there: the
        least-loaded member of another process, preferring processes with some state for it.
        Decided from the final loads, so an unchanged group gets the same targets again."""
        if not held_back:
            return []
        limit = -(-len(self.tasks) // len(self.member_ids))  # ceil(T / M)
        load = dict.fromkeys(self.member_ids, 0)
        for mid in active.values():
            load[mid] += 1
        lightest = [(load[mid], mid) for mid in self.member_ids]
        heapq.heapify(lightest)
        targets = []
        for task in sorted(held_back):
            running_on = self.process_of[active[task]]
            chosen = None
            for lag, index in sorted((lag, i) for i, lag in self.lags.get(task, {}).items()):
                process = self.processes[index]
                if process is running_on or lag <= self.config.acceptable_recovery_lag:
                    continue  # (a caught-up process with no room needs no warm-up)
                candidate = min(process.members, key=lambda m: (load[m], m))
                if load[candidate] < limit:
                    chosen = candidate
                    break
            if chosen is None:
                chosen = self._lightest_elsewhere(lightest, load, running_on)
            if chosen is None:
                continue  # a single process: nowhere to warm up
            load[chosen] += 1  # counts as going there, so wishes spread
            heapq.heappush(lightest, (load[chosen], chosen))
            targets.append((task, chosen))
        return targets

    def _lightest_elsewhere(self, heap: list[tuple[int, str]], load: Mapping[str, int], excluded: _Process) -> str | None:
        """Peek the least-loaded member outside ``excluded``."""
        entry = _peek_lazy_heap(heap, lambda e: e[0] == load[e[1]], lambda e: self.process_of[e[1]] is not excluded)
        return None if entry is None else entry[1]

    # -- 3. standbys ----------------------------------------------------------------------------

    def _place_standbys(self, active: Mapping[TaskId, str]) -> dict[TaskId, set[int]]:
        wanted = self.config.num_standby_replicas
        placed: dict[TaskId, set[int]] = {}
        if not wanted or len(self.processes) < 2 or not self.stateful:
            return placed
        total_capacity = len(self.member_ids)
        demand = len(self.stateful) * min(wanted, len(self.processes) - 1)
        # Fair share of standbys per process: state is preferred only while under it.
        fair_share = {p.index: math.ceil(demand * p.capacity / total_capacity) for p in self.processes}
        groups: dict[tuple[str | None, ...], list[tuple[float, str, int]]] = {}
        for process in self.processes:
            groups.setdefault(process.tag_values, []).append((0.0, process.process_id, process.index))
        for heap in groups.values():
            heapq.heapify(heap)
        member_replicas = self.member_replicas

        for task in self.tasks:
            if task not in self.stateful:
                continue
            used = {self.process_of[active[task]].index}
            used_values = [{value} for value in self.processes[next(iter(used))].tag_values]
            holders = self.lags.get(task, {})
            for _ in range(wanted):
                chosen = self._best_standby_process(used, used_values, holders, fair_share, groups)
                if chosen is None:
                    break
                used.add(chosen.index)
                for values, value in zip(used_values, chosen.tag_values):
                    values.add(value)
                chosen.replicas += 1
                heapq.heappush(groups[chosen.tag_values], (chosen.replica_load(), chosen.process_id, chosen.index))
                member = min(chosen.members, key=lambda m: (member_replicas[m], m))
                member_replicas[member] += 1
                self.result[member].standby.append(task)
                placed.setdefault(task, set()).add(chosen.index)
        return placed

    def _best_standby_process(
        self,
        used: set[int],
        used_values: list[set[str | None]],
        holders: Mapping[int, int],
        fair_share: Mapping[int, int],
        groups: Mapping[tuple[str | None, ...], list[tuple[float, str, int]]],
    ) -> _Process | None:
        def rank(process: _Process, lag: float) -> tuple[int, float, float, str]:  # lag may be _NO_STATE (inf)
            # Fewest rack tag values already used by this task's replicas, then state, then load.
            coincidences = sum(1 for values, value in zip(used_values, process.tag_values) if value in values)
            return (coincidences, lag, process.replica_load(), process.process_id)

        best_key = None
        best: _Process | None = None
        for index, lag in holders.items():
            process = self.processes[index]
            if index in used or process.replicas >= fair_share[index]:
                continue
            key = rank(process, lag)
            if best_key is None or key < best_key:
                best_key, best = key, process
        for heap in groups.values():
            process = self._least_loaded_unused(heap, used)
            if process is None:
                continue
            lag = holders.get(process.index, _NO_STATE)
            if lag != _NO_STATE and process.replicas >= fair_share[process.index]:
                lag = _NO_STATE  # over its share: its state no longer earns a preference
            key = rank(process, lag)
            if best_key is None or key < best_key:
                best_key, best = key, process
        return best

    def _least_loaded_unused(self, heap: list[tuple[float, str, int]], used: set[int]) -> _Process | None:
        """Peek the least-loaded process of a tag group that does not hold the task yet."""
        entry = _peek_lazy_heap(heap, lambda e: e[0] == self.processes[e[2]].replica_load(), lambda e: e[2] not in used)
        return None if entry is None else self.processes[entry[2]]

    # -- 4. warm-ups ----------------------------------------------------------------------------

    def _place_warmups(self, wishes: list[tuple[TaskId, str]], standby_processes: Mapping[TaskId, set[int]]) -> None:
        budget = self.config.max_warmup_replicas
        for task, target_member in wishes:
            if budget <= 0:
                break
            process = self.process_of[target_member]
            if process.index in standby_processes.get(task, ()):
                continue  # its standby is already restoring the state
            # State belongs to the process, so the thread is chosen by replica load alone: the
            # same warm-up lands on the same thread at the next assignment.
            member = min(process.members, key=lambda m: (self.member_replicas[m], m))
            self.member_replicas[member] += 1
            self.result[member].warmup.append(task)
            budget -= 1


def _peek_lazy_heap(heap: list[Any], current: Callable[[Any], bool], wanted: Callable[[Any], bool]) -> Any | None:
    """The smallest entry of a heap whose loads change after entries are pushed: entries that
    are no longer ``current`` are dropped for good, ones not ``wanted`` here are kept."""
    skipped = []
    found = None
    while heap:
        entry = heap[0]
        if not current(entry):
            heapq.heappop(heap)
        elif not wanted(entry):
            skipped.append(heapq.heappop(heap))
        else:
            found = entry
            break
    for entry in skipped:
        heapq.heappush(heap, entry)
    return found
