"""Multi-core tests: `split_lowering` makes compile/verify split over cores even where the
compiler would keep a small model on core 0 (lower() picks the faster of the two)."""

import pytest


@pytest.fixture
def split_lowering(monkeypatch):
    import tpuflow.lowering as lowering
    from tpuflow.lowering.compiler import lower_split
    monkeypatch.setattr(lowering, "lower", lower_split)
