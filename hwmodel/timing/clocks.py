"""Clock domains of one core: integer-picosecond periods and edge alignment (exactly reproducible time)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tpuflow.chip import ChipConfig

PS_PER_NS = 1000


def period_ps(mhz: float) -> int:
    """Clock period in whole picoseconds (rounded; 1 GHz -> 1000, 800 MHz -> 1250)."""
    return max(1, round(1e6 / mhz))


def ns_to_ps(ns: float) -> int:
    return round(ns * PS_PER_NS)


@dataclass(frozen=True)
class Clock:
    """A clock domain: period in ps; edges at every multiple of the period from time 0."""

    name: str
    period: int

    def align(self, t: int) -> int:
        """First edge at or after `t`."""
        p = self.period
        return -(-t // p) * p

    def align_array(self, t: np.ndarray) -> np.ndarray:
        p = self.period
        return -(-t // p) * p

    def cycles(self, n: int) -> int:
        return n * self.period


@dataclass(frozen=True)
class Clocks:
    """Every clock domain of the core, built from chip.clocks."""

    tiu: Clock
    gdma: Clock
    tile: Clock
    sys: Clock
    ife: Clock
    fabric_fast: Clock
    fabric: Clock
    umc: Clock

    @classmethod
    def of(cls, chip: ChipConfig) -> "Clocks":
        c = chip.clocks
        return cls(tiu=Clock("tiu", period_ps(c.tiu_clock_mhz)), gdma=Clock("gdma", period_ps(c.gdma_clock_mhz)),
                   tile=Clock("tile", period_ps(c.tile_clock_mhz)), sys=Clock("sys", period_ps(c.sys_clock_mhz)),
                   ife=Clock("ife", period_ps(c.ife_clock_mhz)),
                   fabric_fast=Clock("fabric_fast", period_ps(c.fabric_fast_clock_mhz)),
                   fabric=Clock("fabric", period_ps(c.fabric_clock_mhz)), umc=Clock("umc", period_ps(c.umc_clock_mhz)))
