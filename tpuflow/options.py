"""CompileOptions: the frozen, validated options of one compilation, hashed into outputs."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from tpuflow.errors import OptionError

DTYPES = ("fp32", "fp16", "bf16", "int8")    # int8: post-training quantization, the rest fp16 (tpuflow.quantize)
MATMUL_PATHS = ("tiu", "tile")
DEP_MODES = ("bitmap", "auto")
SCHEDULES = ("program", "list", "cpsat")
LAYER_GROUP = ("on", "off")
TILE_ENGINES = ("fit", "all", "cost")        # --matmul tile: which convs and MatMuls the cube takes (lowering.ops.tilemm)
CALIBRATION_DEFAULT = 8      # --dtype int8: seeded random calibration inputs unless told (issue 15's default)
DTYPE_ALIASES = {"f32": "fp32", "float32": "fp32", "f16": "fp16", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class CompileOptions:
    dtype: str = "fp32"          # compute and storage precision of activations and weights
    matmul: str = "tiu"          # MatMul/Gemm (and im2col Conv) on TIU MM2/CONV or on the TILE engine
    dep_mode: str = "bitmap"     # cmd_id_dep from chunk bitmaps, or the serialising auto mode
    schedule: str = "list"       # instruction order: emission order, list scheduling (default), CP-SAT windows
    time_limit_s: float = 20.0   # CP-SAT total budget (deterministic time units)
    layer_group: str = "on"      # on: activations stay in LMEM across fused groups when they fit; off: every group round-trips DDR
    cores: int = 1               # cores the program is split over (at most the chip's core.cores, checked by the pipeline)
    calibration: int = CALIBRATION_DEFAULT  # --dtype int8: seeded random calibration inputs (tpuflow.quantize)
    calibration_data: str = ""   # --dtype int8: a folder of .npz calibration samples instead of random inputs
    tile_engine: str = "fit"     # --matmul tile: fit (cube where the shared cost model's busiest unit is less busy),
                                 # all (every conv / MatMul the cube can take), cost (timing model per group)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))
        for name, allowed in (("dtype", DTYPES), ("matmul", MATMUL_PATHS), ("dep_mode", DEP_MODES),
                              ("schedule", SCHEDULES), ("layer_group", LAYER_GROUP), ("tile_engine", TILE_ENGINES)):
            value = getattr(self, name)
            if value not in allowed:
                raise OptionError(f"option --{name.replace('_', '-')}: '{value}' is not one of {', '.join(allowed)}")
        if not self.time_limit_s > 0:
            raise OptionError(f"option --time-limit: must be positive, got {self.time_limit_s}")
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1:
            raise OptionError(f"option --cores: must be a positive integer, got {self.cores!r}")
        self._check_calibration()
        if self.tile_engine != "fit" and self.matmul != "tile":
            raise OptionError(f"option --tile-engine: only with --matmul tile (got --matmul {self.matmul})")

    def _check_calibration(self) -> None:
        """--calibration N / --calibration-data DIR: one of them, and only for --dtype int8."""
        if isinstance(self.calibration, bool) or not isinstance(self.calibration, int) or self.calibration < 1:
            raise OptionError(f"option --calibration: must be a positive integer, got {self.calibration!r}")
        calibrated = self.calibration != CALIBRATION_DEFAULT or self.calibration_data
        if calibrated and self.dtype != "int8":
            flag = "--calibration-data" if self.calibration_data else "--calibration"
            raise OptionError(f"option {flag}: only with --dtype int8 (it calibrates tpuflow's quantization)")
        if self.calibration_data and self.calibration != CALIBRATION_DEFAULT:
            raise OptionError("options --calibration and --calibration-data: give one of them")

    def as_dict(self) -> dict:
        """The options as recorded in outputs; `cores` only when more than one, so single-core
        programs, manifests and estimates are exactly what they were before the core axis; the
        calibration only at --dtype int8 (and only the one in use); `tile_engine` only when not "fit"
        (the default: outputs of earlier compiles stay byte-identical)."""
        out = asdict(self)
        if self.tile_engine == "fit":
            del out["tile_engine"]
        if self.cores == 1:
            del out["cores"]
        if self.dtype != "int8" or not out["calibration_data"]:
            del out["calibration_data"]
        if self.dtype != "int8" or self.calibration_data:
            del out["calibration"]
        return out

    def fingerprint(self) -> str:
        blob = json.dumps(self.as_dict(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def typed_options(options: dict) -> dict:
    """Program.options (kept as strings) with CompileOptions' types: time_limit_s is a number in
    JSON documents (estimate --json, manifest.json)."""
    from dataclasses import fields
    casts = {f.name: {"float": float, "int": int}.get(str(f.type)) for f in fields(CompileOptions)}
    return {k: casts[k](v) if casts.get(k) and isinstance(v, str) else v for k, v in options.items()}
