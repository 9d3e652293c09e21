"""--dtype int8 on a float model: onnxruntime's post-training quantizer (QDQ, seeded random
calibration, only the kinds the int8 lowering computes) then the int8 lowering; the program holds
int8 convolutions, verifies against onnxruntime on the quantized model, and compiles
deterministically; what the int8 lowering cannot compute is one clear error."""

from __future__ import annotations

import pytest

from tpuflow.errors import UserError
from tpuflow.isa import ConvTiu, Prec
from tpuflow.options import CompileOptions
from tpuflow.pipeline import compile_model, verify


def test_a_float_cnn_at_int8_runs_int8_convolutions_and_verifies():
    result = verify("small_cnn", None, CompileOptions(dtype="int8"))
    assert result["ok"], result["outputs"]
    _, program = compile_model("small_cnn", None, CompileOptions(dtype="int8"))
    convs = [i for i in program.tiu if isinstance(i, ConvTiu)]
    assert convs and any(i.opt_opd0_prec == int(Prec.INT8) for i in convs)


def test_int8_compilation_is_deterministic(tmp_path):
    from tpuflow.codegen import write_program
    outputs = []
    for k in range(2):
        _, program = compile_model("mlp", None, CompileOptions(dtype="int8"))
        folder = tmp_path / str(k)
        write_program(program, folder, name="mlp")
        outputs.append({p.name: p.read_bytes() for p in folder.iterdir() if p.suffix != ".json"})
    assert outputs[0] == outputs[1]


def test_what_the_int8_lowering_cannot_compute_is_one_clear_error():
    """A transformer layer: its attention products stay float, its head transposes do not."""
    with pytest.raises(UserError, match="on quantized tensors"):
        compile_model("bert_layer", None, CompileOptions(dtype="int8"))


def _conv_times_pinned_scale():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent / "e2e"))
    from onnx_build import ModelBuilder
    b = ModelBuilder(seed=61)
    x = b.node("Conv", [b.input("x", (1, 8, 12, 12)), b.weight("w", (8, 8, 3, 3))], "c", kernel_shape=[3, 3],
               pads=[1, 1, 1, 1])
    b.output(b.node("Mul", [b.node("Relu", [x], "r"), b.input("k", (1,))], "m"))
    return b.model()


def test_inputs_pinned_by_value_are_constants_of_the_quantized_model():
    from tpuflow.frontend.pinning import InputValue
    result = verify(_conv_times_pinned_scale(), None, CompileOptions(dtype="int8"),
                    input_shapes={"k": InputValue.parse("0.5")})
    assert result["ok"], result["outputs"]


def test_a_failure_of_the_quantizer_is_one_model_error(monkeypatch):
    import onnxruntime.quantization as ortq
    from tpuflow.errors import ModelError

    def broken(*args, **kwargs):
        raise ValueError("some internal quantizer failure")
    monkeypatch.setattr(ortq, "quantize_static", broken)
    with pytest.raises(ModelError, match="post-training quantizer failed.*some internal quantizer failure"):
        compile_model("mlp", None, CompileOptions(dtype="int8"))
