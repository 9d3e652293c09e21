"""Every canonical op kind has exactly one lowering spec, and each spec names a group the lowering
emits and a row-wise role the row emitters can carry out."""

from __future__ import annotations

from tpuflow.frontend.ops import ALL, ELEMENTWISE as FRONTEND_ELEMENTWISE, OpKind
from tpuflow.lowering import ewise
from tpuflow.lowering.compiler import TIU_EMITTERS
from tpuflow.lowering.opspec import SPECS, spec


def test_every_op_kind_has_a_spec():
    assert set(SPECS) == set(ALL)
    assert all(spec(k.value) is SPECS[k] for k in OpKind)


def test_each_spec_names_an_emitted_group_and_a_known_role():
    for kind, s in SPECS.items():
        assert s.group in TIU_EMITTERS, kind
        assert s.row_role in ("", "elementwise", "reduce", "normalize"), kind
        assert (s.row_role == "") or s.group == "row", kind
        assert (s.reduce is not None) == (s.row_role == "reduce"), kind


def test_every_elementwise_kind_has_an_emission_rule_and_the_frontend_agrees():
    for kind, s in SPECS.items():
        if s.row_role == "elementwise":
            assert kind.value in ewise.EMITTED, kind
    assert set(FRONTEND_ELEMENTWISE) <= ewise.ELEMENTWISE
