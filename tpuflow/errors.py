"""The TpuflowError tree: user errors (exit code 2) versus internal errors (exit code 1)."""

from __future__ import annotations


class TpuflowError(Exception):
    """Base of every error tpuflow raises on purpose."""

    exit_code = 1


class UserError(TpuflowError):
    """Something the user can fix: a file, a model, a config key, an option."""

    exit_code = 2


class InputFileError(UserError):
    """A file that is missing, unreadable, truncated or of the wrong kind."""


class ModelError(UserError):
    """An ONNX model that is malformed: dangling names, contradictory shapes, bad attributes."""


class UnsupportedOpError(ModelError):
    """The model uses operators tpuflow cannot lower; lists every one of them."""

    def __init__(self, unsupported: dict[str, list[str]]):
        self.unsupported = {op: sorted(names) for op, names in sorted(unsupported.items())}
        parts = []
        for op, names in self.unsupported.items():
            shown = ", ".join(names[:5]) + (f", ... ({len(names)} nodes)" if len(names) > 5 else "")
            parts.append(f"{op} ({shown})")
        super().__init__("unsupported operators: " + "; ".join(parts))


class ConfigError(UserError):
    """A chip configuration with an unknown key, a wrong type or an impossible value."""


class OptionError(UserError):
    """A command-line or API option that makes no sense."""


class BinaryFormatError(UserError):
    """Bytes that do not decode as instructions; names the byte offset."""


class LoweringError(UserError):
    """A layer that cannot be mapped onto the chip (too large for any tiling, ...)."""


class GroupDoesNotFit(LoweringError):
    """A fused group no tiling of which fits LMEM; `nodes` names its nodes (the lowering may
    rewrite some of them into pieces that fit, and retry)."""

    def __init__(self, message: str, nodes=()):
        super().__init__(message)
        self.nodes = tuple(nodes)


class EncodingError(TpuflowError):
    """An instruction field value that does not fit its descriptor field (a compiler bug)."""


class RaceError(TpuflowError):
    """Two engines touched the same LMEM bytes without an ordering between them."""


class DeadlockError(TpuflowError):
    """Engines wait on each other forever."""


class VerificationError(TpuflowError):
    """The compiled program does not compute what onnxruntime computes."""
