"""A cumulative-bucket histogram, the state behind each Prometheus histogram
cosched exports (skew, switch latency, slot lateness)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Histogram:
    """Cumulative-bucket histogram state for a custom collector."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self):
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.total += value

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket holding quantile ``q`` (None when empty)."""
        n = sum(self.counts)
        if n == 0:
            return None
        running = 0
        for b, c in zip((*self.bounds, float("inf")), self.counts):
            running += c
            if running >= q * n:
                return b
        return float("inf")

    def buckets(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs ending with ``+Inf``."""
        out, running = [], 0
        for b, c in zip((*self.bounds, float("inf")), self.counts):
            running += c
            out.append(("+Inf" if b == float("inf") else repr(b), running))
        return out
