"""Many seeds of one profile, in bounded chunks, reduced to a summary.

Only aggregates and the failing seeds are kept, so memory does not grow with the number of
seeds. Chunks run one after the other, or on ``jobs`` worker processes (each seed is
independent and deterministic, so the summary does not depend on how the work was split).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from pystreams.sim.profiles import PROFILES
from pystreams.sim.scenario import SeedResult, convergence_bound_ms, run_seed
from pystreams.sim.world import Timing

DEFAULT_CHUNK = 100


@dataclass
class BatchSummary:
    profile: str
    seeds: int = 0
    steps: int = 0
    simulated_ms: int = 0
    failures: list[SeedResult] = field(default_factory=list)
    converged_after_ms: list[int] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)

    @property
    def violations(self) -> int:
        return len(self.failures)

    @property
    def ok(self) -> bool:
        return not self.failures

    def add(self, result: SeedResult) -> None:
        self.seeds += 1
        self.steps += result.steps
        self.simulated_ms += result.simulated_ms
        self.stats.update(result.stats)
        if result.converged_after_ms is not None:
            self.converged_after_ms.append(result.converged_after_ms)
        if not result.ok:
            result.stats = Counter()  # keep failures small
            self.failures.append(result)

    def merge(self, other: BatchSummary) -> None:
        self.seeds += other.seeds
        self.steps += other.steps
        self.simulated_ms += other.simulated_ms
        self.failures.extend(other.failures)
        self.converged_after_ms.extend(other.converged_after_ms)
        self.stats.update(other.stats)

    def convergence(self) -> dict[str, int | None]:
        times = sorted(self.converged_after_ms)
        profile = PROFILES.get(self.profile)
        bound = convergence_bound_ms(Timing(), profile.nodes if profile is not None else 1)
        if not times:
            return {"p50_ms": None, "p99_ms": None, "max_ms": None, "bound_ms": bound}
        return {
            "p50_ms": times[len(times) // 2],
            "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
            "max_ms": times[-1],
            "bound_ms": bound,
        }


def chunks(seeds: Sequence[int], size: int = DEFAULT_CHUNK) -> Iterator[Sequence[int]]:
    for start in range(0, len(seeds), size):
        yield seeds[start : start + size]


def run_chunk(profile: str, seeds: Iterable[int]) -> BatchSummary:
    summary = BatchSummary(profile)
    for seed in seeds:
        summary.add(run_seed(seed, profile))
    return summary


def run_seeds(
    profile: str,
    seeds: Sequence[int],
    *,
    chunk_size: int = DEFAULT_CHUNK,
    jobs: int = 1,
    on_chunk: Callable[[BatchSummary], None] | None = None,
) -> BatchSummary:
    """Run every seed of ``seeds`` under ``profile``; ``on_chunk`` sees each chunk's summary."""
    total = BatchSummary(profile)
    parts = list(chunks(seeds, chunk_size))
    if jobs <= 1:
        results: Iterable[BatchSummary] = (run_chunk(profile, part) for part in parts)
        for chunk in results:
            total.merge(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
        return total
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for chunk in pool.map(run_chunk, [profile] * len(parts), parts):
            total.merge(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
    total.failures.sort(key=lambda failure: failure.seed)
    return total
