"""`tpuflow inspect` and frontend.stats: MAC counts against independent hand-derived counts, bytes,
the roofline bound, JSON keys."""

from __future__ import annotations

import json

import pytest

from frontend_util import bundled
from tpuflow import cli, pipeline
from tpuflow.chip import load_chip
from tpuflow.frontend import load
from tpuflow.frontend.stats import graph_stats, layer_stats
from tpuflow.models.cnn import MOBILENET_V2
from tpuflow.models.light import LIGHT_FILES, light_path


def conv(cin: int, cout: int, k: int, hw: int, groups: int = 1) -> int:
    """MACs of a square conv producing cout x hw x hw."""
    return cout * hw * hw * (cin // groups) * k * k


def resnet50_macs() -> int:
    """ResNet-50 v1.5 (stride on the 3x3) at 224x224, from the architecture alone."""
    macs, cin, hw = conv(3, 64, 7, 112), 64, 56
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        for b in range(blocks):
            out = hw // 2 if b == 0 and stage > 0 else hw
            macs += conv(cin, width, 1, hw) + conv(width, width, 3, out) + conv(width, 4 * width, 1, out)
            macs += conv(cin, 4 * width, 1, out) if b == 0 else 0
            cin, hw = 4 * width, out
    return macs + 2048 * 1000


def vgg19_macs() -> int:
    macs, cin, hw = 0, 3, 224
    for item in [64, 64, "M", 128, 128, "M", *[256] * 4, "M", *[512] * 4, "M", *[512] * 4, "M"]:
        if item == "M":
            hw //= 2
        else:
            macs, cin = macs + conv(cin, item, 3, hw), item
    return macs + 512 * 7 * 7 * 4096 + 4096 * 4096 + 4096 * 1000


def squeezenet11_macs() -> int:
    macs, cin = conv(3, 64, 3, 111), 64
    for hw, fires in ((55, [(16, 64)] * 2), (27, [(32, 128)] * 2), (13, [(48, 192)] * 2 + [(64, 256)] * 2)):
        for squeeze, expand in fires:
            macs += conv(cin, squeeze, 1, hw) + conv(squeeze, expand, 1, hw) + conv(squeeze, expand, 3, hw)
            cin = 2 * expand
    return macs + conv(512, 1000, 1, 13)


def mobilenetv2_112_macs() -> int:
    macs, cin, hw = conv(3, 32, 3, 56), 32, 56
    for t, c, n, s in MOBILENET_V2:
        for i in range(n):
            out = -(-hw // (s if i == 0 else 1))
            hidden = cin * t
            macs += conv(cin, hidden, 1, hw) if t != 1 else 0
            macs += conv(hidden, hidden, 3, out, groups=hidden) + conv(hidden, c, 1, out)
            cin, hw = c, out
    return macs + conv(320, 1280, 1, hw) + 1280 * 1000


S, H, F = 64, 256, 1024
EXPECTED_MACS = {
    "mlp": 4 * (784 * 512 + 512 * 256 + 256 * 10),
    "bert_layer": 4 * S * H * H + 2 * S * S * H + 2 * S * H * F,
    "gpt_block": 4 * S * H * H + 2 * S * S * H + 2 * S * H * F,
    "llama_mlp": 3 * S * H * 688,
    "small_cnn": conv(3, 16, 3, 32) + conv(16, 32, 3, 16) + conv(32, 64, 3, 4) + 64 * 10,
    "mobilenetv2": mobilenetv2_112_macs(),
}


def test_resnet50_is_4_09_gmacs():
    assert resnet50_macs() == 4_089_184_256
    g = pipeline.load_graph(light_path("resnet50"))
    macs = sum(l.macs for l in layer_stats(g))
    assert macs == resnet50_macs() and round(macs / 1e9, 2) == 4.09


@pytest.mark.parametrize("name,expected", [("vgg19", vgg19_macs()), ("squeezenet", squeezenet11_macs())])
def test_light_model_macs_match_hand_counts(name, expected):
    assert sum(l.macs for l in layer_stats(pipeline.load_graph(light_path(name)))) == expected


@pytest.mark.parametrize("name", EXPECTED_MACS)
def test_bundled_model_macs_match_hand_counts(name):
    assert sum(l.macs for l in layer_stats(load(bundled(name)))) == EXPECTED_MACS[name]


@pytest.mark.parametrize("name", sorted(LIGHT_FILES))
def test_inspect_totals_on_every_light_model(name, capsys):
    assert cli.main(["inspect", str(light_path(name)), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["macs"] == sum(r["macs"] for r in s["layers"]) > 0
    assert s["ops"] == {op: sum(r["op"] == op for r in s["layers"]) for op in s["ops"]}
    assert sum(s["ops"].values()) == len(s["layers"])
    assert s["weight_bytes"] == 4 * s["params"] and s["bound"] in ("compute", "memory")
    assert s["inputs"][0]["shape"] == [1, 3, 224, 224]


def test_roofline_numbers_and_json_keys(capsys):
    assert cli.main(["inspect", "small_cnn", "--json", "--chip", "sg2260", "--dtype", "f16"]) == 0
    s = json.loads(capsys.readouterr().out)
    for key in ("macs", "params", "weight_bytes", "activation_bytes", "ops", "layers", "lower_bound_us", "bound",
                "chip", "chip_fingerprint", "dtype"):
        assert key in s
    chip = load_chip("sg2260")
    assert s["dtype"] == "fp16" and s["chip"] == "sg2260" and s["chip_fingerprint"] == chip.fingerprint()
    compute = s["macs"] / chip.peak_macs_per_second("fp16")
    dram = s["weight_bytes"] + s["input_bytes"] + s["output_bytes"]
    memory = dram / chip.ddr_peak_bytes_per_second
    assert s["compulsory_bytes"] == dram and s["weight_bytes"] == 2 * s["params"]
    assert s["lower_bound_us"] == pytest.approx(max(compute, memory) * 1e6)
    assert s["bound"] == ("compute" if compute >= memory else "memory")
    assert s["input_bytes"] == 2 * 3 * 32 * 32 and s["output_bytes"] == 2 * 10


def test_dtype_changes_bytes_not_macs():
    g = load(bundled("bert_layer"))
    f32, f16 = layer_stats(g, "fp32"), layer_stats(g, "bf16")
    t32, t16 = graph_stats(g, f32, "fp32"), graph_stats(g, f16, "bf16")
    assert t32.macs == t16.macs and t32.weight_bytes == 2 * t16.weight_bytes
    assert t32.activation_bytes == 2 * t16.activation_bytes


def test_shared_constants_count_once_in_totals():
    g = load(bundled("mobilenetv2"))            # relu6 bounds are attributes; BN constants folded
    layers = layer_stats(g)
    totals = graph_stats(g, layers)
    assert totals.params == sum(t.size for t in g.tensors.values() if t.is_const)
    assert totals.params == 3_487_816


def test_text_output(capsys):
    assert cli.main(["inspect", "llama_mlp"]) == 0
    out = capsys.readouterr().out
    assert "33.8 MMACs" in out and "lower bound" in out and "mlp/gate_proj/matmul" in out


def test_models_listing(capsys):
    assert cli.main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed if m["default"]] == ["resnet50"] and len(listed) == 16
    assert cli.main(["models"]) == 0
    assert "resnet50 (default)" in capsys.readouterr().out
