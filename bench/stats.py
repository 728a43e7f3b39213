"""Summaries of samples: percentiles by linear interpolation (numpy's default), in the samples' unit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `samples`; NaN when there are none."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Summary:
    n: int
    p50: float
    p95: float
    mean: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Summary:
        if not samples:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        return cls(
            n=len(samples),
            p50=round(percentile(samples, 50), 2),
            p95=round(percentile(samples, 95), 2),
            mean=round(sum(samples) / len(samples), 2),
            max=round(max(samples), 2),
        )
