"""The Program core axis: core 0 is the Program's own fields, views and from_cores keep the rest."""

from tpuflow.chip import load_chip
from tpuflow.isa import SysDma, SysTiu
from tpuflow.program import CoreStreams, MemoryPlan, Program


def _base():
    return Program(chip=load_chip("sg2260"), tiu=[SysTiu(op="nop"), SysTiu(op="end")], gdma=[SysDma(op="chain_end")],
                   tiu_layers=["a", "a"], gdma_layers=["a"], issue_order="BDB", memory=MemoryPlan(weight_base=64))


def test_single_core_program_is_its_own_core_zero():
    prog = _base()
    assert prog.core_count == 1 and prog.core(0) is prog
    assert prog.cores[0].tiu is prog.tiu and prog.cores[0].issue_order == "BDB"
    assert prog.core_counts() == [{"tiu": 2, "gdma": 1, "tile": 0}]


def test_from_cores_keeps_shared_state_and_views_each_core():
    base = _base()
    one = CoreStreams(tiu=[SysTiu(op="end")], gdma=[SysDma(op="nop"), SysDma(op="chain_end")], issue_order="DDB")
    prog = Program.from_cores(base, [base.cores[0], one], core_split=[{"n": [0, 1]}, {"n": [1, 2]}])
    assert prog.core_count == 2 and prog.total_instruction_count == 6
    assert prog.tiu == base.tiu and prog.instruction_count == 3
    view = prog.core(1)
    assert view.core_count == 1 and view.core_id == 1 and view.memory is base.memory
    assert view.gdma == one.gdma and view.issue_order == "DDB" and list(view.issue_sequence())[0][1] == 0
    assert prog.core_split[1] == {"n": [1, 2]}
    again = prog.with_queues(prog.tiu, [], [], prog.tiu_layers, [], [], "BB")
    assert again.core_count == 2 and again.extra_cores[0].gdma == one.gdma
