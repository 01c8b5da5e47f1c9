"""Interleaved latency measurement: medians, throughput, speedup against a reference."""

import time

import pytest
import torch
import transformers

from distillery.efficiency import LatencyResult, latency_table, measure_latency


def _busy(seconds):
    """A callable that keeps the CPU busy for `seconds` (sleep's wake-up latency varies too much on VMs)."""
    def run():
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    return run


def test_callables_speedup_reflects_their_cost():
    results = measure_latency({"slow": _busy(0.02), "fast": _busy(0.002)}, batch=4, reps=5, warmup=1)
    slow, fast = results["slow"], results["fast"]
    assert isinstance(slow, LatencyResult)
    assert slow.speedup == pytest.approx(1.0)
    assert fast.speedup > 3
    assert slow.median_ms >= 20
    assert fast.throughput == pytest.approx(4 / (fast.median_ms / 1000))
    assert slow.threads == torch.get_num_threads()
    table = latency_table(results)
    assert "| fast | 4 |" in table and "x |" in table


def test_models_are_fed_inputs_of_the_requested_shape():
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=32)
    model = transformers.BertModel(cfg)
    seen = []
    model.register_forward_hook(lambda m, args, kwargs, out: seen.append(kwargs["input_ids"].shape), with_kwargs=True)
    res = measure_latency({"bert": model}, batch=3, seq_len=7, reps=2, warmup=1, device="cpu")
    assert seen and all(tuple(s) == (3, 7) for s in seen)
    assert res["bert"].device == "cpu" and res["bert"].seq_len == 7


def test_bad_arguments():
    with pytest.raises(ValueError):
        measure_latency({})
    with pytest.raises(KeyError, match="nope"):
        measure_latency({"a": lambda: None}, reference="nope")
    with pytest.raises(TypeError, match="int"):
        measure_latency({"a": 3}, reps=1)
    with pytest.raises(ValueError, match="settle_ms"):
        measure_latency({"a": lambda: None}, settle_ms=-1)


@pytest.mark.parametrize("settle_ms, overlapped", [(0, True), (60, False)])
def test_each_sample_waits_for_the_previous_runtime_to_settle(settle_ms, overlapped):
    """A runtime whose threads spin for 30 ms after each call (ONNX Runtime's do): with the pause, no sample of the
    other model starts while they spin; without it, the next one does."""
    spin_until, starts_while_spinning = [0.0], []

    def spinning_runtime():
        spin_until[0] = time.perf_counter() + 0.03

    def other():
        starts_while_spinning.append(time.perf_counter() < spin_until[0])

    measure_latency({"a": spinning_runtime, "b": other}, reps=4, warmup=0, device="cpu", settle_ms=settle_ms)
    assert any(starts_while_spinning) is overlapped
