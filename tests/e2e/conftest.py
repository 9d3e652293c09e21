import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def convs_on_the_cube():
    """Every conv the cube can take runs on the TILE (not the per-conv TILE / TIU choice by the timing
    model): for the tests of the TILE conv itself."""
    from tpuflow.lowering.ops import tilemm
    saved, tilemm.ENGINE_CHOICE = tilemm.ENGINE_CHOICE, "tile"
    yield
    tilemm.ENGINE_CHOICE = saved
