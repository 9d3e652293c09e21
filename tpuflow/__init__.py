"""tpuflow: an ONNX compiler and performance estimator for TPU-class accelerators."""

__version__ = "0.1.0"
