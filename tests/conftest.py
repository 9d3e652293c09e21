"""Fixtures shared across the test folders."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (CI is a gate, a failure must reproduce);
# HYPOTHESIS_PROFILE=explore draws fresh ones (`--hypothesis-seed N` picks a run's seed).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture
def variant_times(monkeypatch) -> dict:
    """{variant name: its simulated ps} of every program the lowering compares with lowering.compiler._fastest
    (which still chooses), filled as the lowering runs."""
    import tpuflow.lowering.compiler as compiler
    from tpuflow.hwmodel.timing import simulate
    seen: dict = {}
    original = compiler._fastest

    def spy(variants):
        seen.update({name: simulate(p).total_ps for name, p in variants.items()})
        return original(variants)
    monkeypatch.setattr(compiler, "_fastest", spy)
    return seen
