"""--tile-engine for MatMul groups (lowering.ops.tilemm.TileEngineChoice.matmul): under "fit" (the default) a
MatMul runs on the engine whose plan the shared cost model times faster (_shared_bound_ps: the busiest unit,
the TIU and the GDMA counted together), under "all" on the cube; either way the model matches onnxruntime."""

from __future__ import annotations

import pytest
from onnx_build import ModelBuilder

from tpuflow.isa import Engine, Mm2Tiu, TMatmul
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify


@pytest.fixture(autouse=True)
def choice_from_options(monkeypatch):
    """The engine choice comes from --tile-engine here (tests/e2e's conftest may have set the override)."""
    from tpuflow.lowering.ops import tilemm
    monkeypatch.setattr(tilemm, "ENGINE_CHOICE", None)


def _two_products():
    """Neg, [128 x 512] . [512 x 512] + Relu (fp16 sg2260: the TIU's MM2 plan is less busy than the cube's,
    whose cube blocks outlast the TIU's), then [128 x 512] . [512 x 32] (the cube's: the TIU's 64 lanes
    would hold 32 output columns)."""
    b = ModelBuilder(seed=5)
    x = b.node("Neg", [b.input("x", [1, 128, 512])], "nx")
    y = b.node("Relu", [b.node("MatMul", [x, b.weight("w1", [512, 512])], "m1")], "r")
    b.output(b.node("MatMul", [y, b.weight("w2", [512, 32])], "m2"))
    return b.model()


def _engines(program) -> tuple[set[str], set[str]]:
    """(layers with MM2 instructions on the TIU, layers with TMATMULs on the TILE engine)."""
    on_tiu = {layer for layer, i in zip(program.layer_names(Engine.TIU), program.tiu) if isinstance(i, Mm2Tiu)}
    on_tile = {layer for layer, i in zip(program.layer_names(Engine.TILE), program.tile) if isinstance(i, TMatmul)}
    products = {"matmul_1", "matmul_3"}
    return on_tiu & products, on_tile & products


@pytest.mark.parametrize("engine, expected", [("fit", ({"matmul_1"}, {"matmul_3"})),
                                              ("all", (set(), {"matmul_1", "matmul_3"}))])
def test_each_matmul_runs_on_the_engine_the_choice_picks(engine, expected):
    _, program = compile_model(_two_products(), None, CompileOptions(dtype="fp16", matmul="tile", tile_engine=engine))
    assert _engines(program) == expected


def test_the_fit_choice_agrees_with_its_cost_measure(monkeypatch):
    """The plans "fit" compared: matmul_1's TIU plan measured less busy than its TILE plan, matmul_3's TILE
    plan less busy than its TIU plan (so the routing above follows the measure, not a shape rule)."""
    from tpuflow.lowering.ops import tilemm
    seen: dict[str, tuple[int, int]] = {}
    faster = tilemm.TileEngineChoice._faster

    def record(self, tile, tiu):
        seen[self.group.anchor.name] = (self._bound(tile), self._bound(tiu))
        return faster(self, tile, tiu)

    monkeypatch.setattr(tilemm.TileEngineChoice, "_faster", record)
    compile_model(_two_products(), None, CompileOptions(dtype="fp16", matmul="tile"))
    assert seen["matmul_1"][1] < seen["matmul_1"][0]
    assert seen["matmul_3"][0] < seen["matmul_3"][1]


@pytest.mark.parametrize("engine", ["fit", "all"])
def test_routed_products_match_onnxruntime(engine):
    result = verify(_two_products(), None, CompileOptions(dtype="fp16", matmul="tile", tile_engine=engine),
                    race_check=True)
    assert result["ok"], result


def test_the_tiu_is_not_chosen_for_residents_it_cannot_serve(monkeypatch):
    """A MatMul whose LMEM residents the TIU product does not serve (here its ports are made empty) runs on the
    cube even where "fit" takes the TIU otherwise (matmul_1, whose input and result stay in LMEM): the
    declared ports are the TILE product's, and the choice only picks among plans valid for them."""
    from tpuflow.lowering.compiler import tiu_matmul_emitter
    monkeypatch.setattr(tiu_matmul_emitter, "resident_ports", lambda graph, group, chip: ({}, {}))
    model = _two_products()
    options = CompileOptions(dtype="fp16", matmul="tile")
    _, program = compile_model(model, None, options)
    assert {"nx", "r"} <= set(program.layer_groups[0]["resident"])
    assert _engines(program) == (set(), {"matmul_1", "matmul_3"})
    assert verify(model, None, options, race_check=True)["ok"]
