"""Prove small and fast: size, analytic FLOPs, interleaved latency, ONNX export and int8 quantisation."""

from distillery.efficiency.export import (ExportError, ExportResult, OnnxModel, check_onnx, export_onnx,
                                          int8_export, load_model_for_export, optimize_onnx, predict_torch,
                                          quantize_onnx, quantize_torch)
from distillery.efficiency.flops import (FlopsBreakdown, FlopsConfigError, flops_breakdown, flops_if_counted,
                                         flops_per_example)
from distillery.efficiency.latency import LatencyResult, latency_table, make_inputs, measure_latency
from distillery.efficiency.size import disk_size_bytes, parameter_counts

__all__ = [
    "ExportError", "ExportResult", "OnnxModel", "check_onnx", "export_onnx", "int8_export", "load_model_for_export",
    "optimize_onnx", "predict_torch", "quantize_onnx", "quantize_torch", "FlopsBreakdown", "FlopsConfigError",
    "flops_breakdown", "flops_if_counted", "flops_per_example", "LatencyResult", "latency_table", "make_inputs", "measure_latency",
    "disk_size_bytes", "parameter_counts",
]
