"""run(): load a Program's weight image and inputs into a Machine, execute every engine's queue
under an interleaving policy (with the race detector), and return the output tensors."""

from __future__ import annotations

import numpy as np

from tpuflow.isa.base import Prec
from tpuflow.program import DdrTensor, Program

from tpuflow.hwmodel.functional.cores import execute_cores, has_messages
from tpuflow.hwmodel.functional.engines import EngineState, make_policy, waits_of
from tpuflow.hwmodel.functional.errors import ExecutionError, InputMismatchError
from tpuflow.hwmodel.functional.floats import encode, f32_to_bf16
from tpuflow.hwmodel.functional.machine import Machine
from tpuflow.hwmodel.functional.race import RaceDetector


UNSIGNED_DTYPES = {"uint8": Prec.INT8, "uint16": Prec.INT16}    # stored like their signed precision, read unsigned


def tensor_prec(tensor: DdrTensor) -> Prec:
    if tensor.dtype in UNSIGNED_DTYPES:
        return UNSIGNED_DTYPES[tensor.dtype]
    try:
        return Prec.from_name(tensor.dtype)
    except KeyError:
        raise ExecutionError(f"DDR tensor {tensor.name!r}: unsupported dtype {tensor.dtype!r}") from None


def storage_dtype(tensor: DdrTensor) -> np.dtype:
    """numpy dtype of a DDR tensor's elements as the user sees them (uint8 / uint16 unsigned)."""
    if tensor.dtype in UNSIGNED_DTYPES:
        return np.dtype(tensor.dtype)
    return tensor_prec(tensor).storage_dtype


def _input_bytes(tensor: DdrTensor, value) -> np.ndarray:
    """A user array as the tensor's row-major stored values (bf16: uint16 bits or floats)."""
    array = np.asarray(value)
    if array.shape != tuple(tensor.shape):
        raise InputMismatchError(f"input {tensor.name!r}: shape {array.shape}, the program expects {tuple(tensor.shape)}")
    prec = tensor_prec(tensor)
    if prec is Prec.BF16 and array.dtype == np.uint16:
        return np.ascontiguousarray(array)
    if prec is Prec.BF16 and array.dtype.kind == "f":
        return f32_to_bf16(array.astype(np.float32))
    if array.dtype.kind not in "fiub":
        raise InputMismatchError(f"input {tensor.name!r}: dtype {array.dtype} is not numeric")
    return np.ascontiguousarray(array.astype(storage_dtype(tensor)) if prec is not Prec.BF16 else encode(array, prec))


def load_inputs(machine: Machine, program: Program, inputs: dict) -> None:
    """Weight image at weight_base, then every role 'input' tensor at its address."""
    memory = program.memory
    if memory.weight_image:
        machine.load_ddr(memory.weight_base, memory.weight_image)
    expected = {t.name: t for t in memory.by_role("input")}
    unknown = sorted(set(inputs) - set(expected))
    if unknown:
        raise InputMismatchError(f"unknown input {unknown[0]!r} (program inputs: {', '.join(sorted(expected)) or 'none'})")
    for name, tensor in expected.items():
        if name not in inputs:
            raise InputMismatchError(f"input {name!r} is missing (program inputs: {', '.join(sorted(expected))})")
        data = _input_bytes(tensor, inputs[name])
        if data.nbytes != tensor.nbytes:
            raise ExecutionError(f"DDR tensor {name!r}: {data.nbytes} B of data but nbytes = {tensor.nbytes}")
        machine.load_ddr(tensor.addr, data)


def read_outputs(machine: Machine, program: Program) -> dict[str, np.ndarray]:
    out = {}
    for tensor in program.memory.by_role("output"):
        dtype = storage_dtype(tensor)
        count = int(np.prod(tensor.shape, dtype=np.int64))
        raw = machine.read_ddr(tensor.addr, count * dtype.itemsize)
        out[tensor.name] = raw.view(dtype).reshape(tuple(tensor.shape))
    return out


def execute_program(machine: Machine, program: Program, *, race_check: bool = True,
                    interleave: str = "round_robin", seed: int = 0, observe=None) -> None:
    """Run every queue to its end; DeadlockError when no engine can proceed, RaceError on a race.
    `observe(engine, index)`, when given, is called after each instruction executes."""
    pick = make_policy(interleave, seed)
    state = EngineState(program)
    detector = RaceDetector(program) if race_check else None
    while not state.finished():
        ready = state.ready_engines()
        if not ready:
            raise state.deadlock()
        engine = pick(ready)
        index, instr = state.head(engine)
        if detector is not None:
            detector.step(engine, index, waits_of(engine, instr))
        machine.execute(instr, index + 1, program.layer_of(engine, index))
        state.complete(engine)
        if observe is not None:
            observe(engine, index)


def run(program: Program, inputs: dict[str, np.ndarray], *, race_check: bool = True,
        interleave: str = "round_robin", seed: int = 0, snapshots: dict | None = None) -> dict[str, np.ndarray]:
    """Execute `program` on fresh cores (one shared DDR, private LMEM each) and return every role
    'output' tensor by name (storage dtype: fp32/fp16 as numpy, bf16 as uint16 bit patterns, DDR dtype
    uint8 / uint16 as unsigned numpy arrays).
    `snapshots` {name: ({(core, engine): instruction index}, DdrTensor | isa LocalTensor)}: each
    tensor read (from DDR, or core 0's LMEM) right after the last of those instructions executes, returned
    by name with the outputs (DDR ones as read_outputs reads them, LMEM ones as
    (N, C, H, W) storage values).
    A single-core program without messages runs on the one-core executor as it always did."""
    machine = Machine(program.chip, program.memory.ddr_bytes_used)
    load_inputs(machine, program, inputs)
    taken = {}
    observe = _snapshotter(machine, snapshots, taken) if snapshots else None
    if program.core_count == 1 and not has_messages(program):
        execute_program(machine, program, race_check=race_check, interleave=interleave, seed=seed,
                        observe=(lambda engine, index: observe(0, engine, index)) if observe else None)
    else:
        machines = [machine] + [Machine(program.chip, 0, ddr=machine.ddr) for _ in range(1, program.core_count)]
        execute_cores(machines, program, race_check=race_check, interleave=interleave, seed=seed, observe=observe)
    return {**read_outputs(machine, program), **taken}


def _snapshotter(machine: Machine, snapshots: dict, taken: dict):
    """observe(core, engine, index) for the executors: copy each snapshot tensor out of memory once every
    instruction it waits for has executed (each engine of each core runs its queue in order: its progress
    is its last index)."""
    due: dict[tuple, list] = {}
    for name, (needs, target) in snapshots.items():
        for unit, index in needs.items():
            due.setdefault((*unit, index), []).append((name, needs, target))
    progress: dict = {}

    def observe(core, engine, index):
        progress[(core, engine)] = index
        for name, needs, target in due.get((core, engine, index), ()):
            if all(progress.get(unit, -1) >= i for unit, i in needs.items()):
                taken[name] = _read(machine, target)
    return observe


def _read(machine: Machine, target) -> np.ndarray:
    if isinstance(target, DdrTensor):
        dtype = storage_dtype(target)
        return machine.read_ddr(target.addr, target.nbytes).view(dtype).reshape(tuple(target.shape)).copy()
    return np.array(machine.lmem.read(target))
