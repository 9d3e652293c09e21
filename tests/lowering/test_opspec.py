"""The lowering keys on the one spec per op kind (frontend/ops.py SPECS, re-exported by
lowering/opspec.py): every kind's group names a group emitter, its row role, reduction, row axes,
slicing rule and emission rule are consistent and resolvable, and each elementwise kind's
`scratch` is exactly what its TIU sequence uses."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from tpuflow.chip import load_chip
from tpuflow.frontend import ops as frontend_ops
from tpuflow.frontend.graph import OpNode
from tpuflow.frontend.ops import ALL, OpKind
from tpuflow.isa import Prec
from tpuflow.lowering import ewise, mathops
from tpuflow.lowering.compiler import TIU_EMITTERS
from tpuflow.lowering.emitter import Emitter
from tpuflow.lowering.opspec import SPECS, kinds_with, spec
from tpuflow.lowering.tensors import make_tile

CHIP = load_chip("sg2260")
NORMALIZE_RULES = ("softmax", "log_softmax", "layer_norm")


def test_one_table_for_frontend_and_lowering():
    assert SPECS is frontend_ops.SPECS
    assert set(SPECS) == set(ALL)
    assert all(spec(k.value) is SPECS[k] for k in OpKind)


def test_each_spec_names_an_emitted_group_and_a_consistent_row_role():
    for kind, s in SPECS.items():
        assert s.group in TIU_EMITTERS, kind
        assert (s.row_role != "") == (s.group == "row"), kind
        assert (s.reduce is not None) == (s.row_role == "reduce"), kind
        assert (s.row_axes != "") == (s.row_role in ("reduce", "normalize")), kind


def test_slicing_rules_follow_the_groups():
    for kind, s in SPECS.items():
        assert (s.slicing == "window") == (s.group in ("conv", "pool")), kind
        assert (s.slicing == "rows") == (s.row_role == "elementwise"), kind
        if s.slicing == "window":
            assert {"kernel_shape", "strides", "dilations", "pads"} <= set(s.attrs), kind


def test_every_row_kind_has_a_resolvable_emission_rule():
    for kind, s in SPECS.items():
        if s.row_role == "elementwise":
            assert s.emit.rule in ewise.RULES, kind
            assert s.emit.rule != "unary" or s.emit.op in mathops.UNARY_RULES, kind
        elif s.row_role == "normalize":
            assert s.emit.rule in NORMALIZE_RULES, kind
        else:
            assert s.emit is None, kind
        assert 0 <= s.scratch <= mathops.SCRATCH_TILES, kind


def test_the_row_traits_are_views_of_the_specs():
    assert ewise.ELEMENTWISE == kinds_with("elementwise") == {k.value for k in frontend_ops.ELEMENTWISE}
    assert set(ewise.ROW_REDUCE) == kinds_with("reduce") and ewise.ROW_NORMALIZE == kinds_with("normalize")
    assert ewise.ROW_REDUCE["GlobalAveragePool"] == ("avgpooling", True)
    assert ewise.SCRATCH_NEED == {k.value: s.scratch for k, s in SPECS.items() if s.scratch}


class CountingScratch(mathops.Scratch):
    """Scratch that records how many tiles were asked for."""

    used = 0

    def get(self, i: int, prec: Prec = Prec.FP32):
        self.used = max(self.used, i + 1)
        return super().get(i, prec)


ATTRS = {"Clip": dict(min=-1.0, max=1.0), "LeakyRelu": dict(alpha=0.1), "HardSigmoid": dict(alpha=0.2, beta=0.5),
         "Cast": dict(to="int32"), "Mod": dict(fmod=0), "ThresholdedRelu": dict(alpha=1.0)}
ARITY = {"unary": 1, "binary": 2, "ternary": 3}


def tile(i: int, prec: Prec = Prec.FP32):
    return make_tile(CHIP, 1024 + i * 2048, (1, 4, 2, 8), prec)


def operand_variants(arity: int) -> list[list]:
    """All-tile operands, scalar constants after the first, and (Where) a y in another layout."""
    variants = [[tile(j + 1) for j in range(arity)]]
    if arity >= 2:
        variants.append([tile(1)] + [2.5] * (arity - 1))
    if arity == 3:
        variants.append([tile(1), tile(2), tile(3, Prec.FP16)])
    return variants


@pytest.mark.parametrize("kind", sorted(kinds_with("elementwise")))
def test_scratch_is_exactly_what_the_emission_uses(kind):
    """Row groups compute on fp32 tiles: emission never asks for more tiles than the spec's
    scratch count (a Scratch of that size would raise), and some operand form uses them all."""
    s = spec(kind)
    node = OpNode("n", kind, ("a",) * ARITY[s.category], ("y",), MappingProxyType(ATTRS.get(kind, {})))
    used = 0
    for ins in operand_variants(ARITY[s.category]):
        scratch = CountingScratch([tile(10 + j) for j in range(s.scratch)])
        ewise.apply_elementwise(Emitter(CHIP), node, tile(0), ins, scratch)
        used = max(used, scratch.used)
    assert used == s.scratch
