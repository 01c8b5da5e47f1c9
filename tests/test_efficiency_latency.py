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
    assert "| fast | 4 |" in table and "x [" in table


class FakeClock:
    """time.perf_counter and time.sleep of the latency module, advanced only by the fake models' calls: the test's
    figures do not depend on the machine's load."""

    def __init__(self, monkeypatch):
        import distillery.efficiency.latency as latency

        self.now = 0.0
        monkeypatch.setattr(latency.time, "perf_counter", lambda: self.now)
        monkeypatch.setattr(latency.time, "sleep", lambda s: None)

    def model(self, cost):
        """A model whose call takes `cost()` seconds of the fake clock."""
        def run():
            self.now += cost()
        return run


def test_a_sample_is_tens_of_milliseconds_of_back_to_back_calls(monkeypatch):
    """A call of 1 ms is timed as 30 of them in a row; one of 40 ms once per sample."""
    clock = FakeClock(monkeypatch)
    counts = {"short": 0, "long": 0}

    def counted(name, seconds):
        def cost():
            counts[name] += 1
            return seconds
        return clock.model(cost)

    res = measure_latency({"short": counted("short", 0.001), "long": counted("long", 0.04)}, reps=3, warmup=1,
                          min_sample_ms=30)
    assert res["short"].calls == 30 and res["long"].calls == 1
    # the reference ("short", the first) is timed before and after the other in each of the 3 rounds
    assert counts["short"] == 1 + 3 * 2 * 30 and counts["long"] == 1 + 3
    assert res["short"].samples_ms == pytest.approx((1.0,) * 6) and len(res["long"].ratios) == 3


def test_the_speedup_is_the_median_of_per_round_ratios_and_a_busy_machine_leaves_it_unresolved(monkeypatch):
    """Each model's sample lies between two of the reference's, and its ratio is their mean over its own: a machine
    whose speed drifts steadily (a host's clock, its other tenants) moves the times, not the ratio, which a ratio to
    the reference's sample before it alone would; a slow-down that hits only the model in some rounds
    widens the spread until it is unresolved."""
    from distillery.efficiency.spread import describe_speedup

    clock = FakeClock(monkeypatch)
    calls = [0]

    def drifting(seconds):  # every call 5% slower than the one before it, whichever model makes it
        def cost():
            calls[0] += 1
            return seconds * (1 + 0.05 * calls[0])
        return clock.model(cost)

    steady = measure_latency({"ref": drifting(0.004), "half": drifting(0.002)}, reps=8, warmup=0, min_sample_ms=0)
    half = steady["half"]
    assert half.speedup == pytest.approx(2.0) and half.speedup_p10 == pytest.approx(2.0) and half.resolved
    assert half.samples_ms[-1] > 1.5 * half.samples_ms[0]  # the drift moved the times
    assert len(steady["ref"].samples_ms) == 2 * 8 and steady["ref"].speedup == pytest.approx(1.0)
    draws = iter([0.002, 0.006] * 20)
    noisy = measure_latency({"ref": clock.model(lambda: 0.004), "jumpy": clock.model(lambda: next(draws))},
                            reps=10, warmup=0, min_sample_ms=0)
    jumpy = noisy["jumpy"]
    assert not jumpy.resolved and jumpy.speedup_p10 < 1 < jumpy.speedup_p90
    assert describe_speedup(jumpy.speedup, jumpy.speedup_p10, jumpy.speedup_p90).startswith("unresolved [")
    assert describe_speedup(2.04, 1.98, 2.1) == "2.0x [2.0-2.1]"
    assert jumpy.as_dict()["resolved"] is False


def test_a_speedup_is_resolved_by_its_medians_interval_not_by_how_far_its_rounds_spread(monkeypatch):
    """A model slow in one round of seven: its rounds spread wide (p10 at half the median), but the median is pinned
    down, so the figure is reported; the interval is the order statistics a binomial count puts around the median."""
    from distillery.efficiency.spread import MAX_SPREAD, median_interval, resolved

    assert median_interval(range(1, 22)) == (6, 16) and median_interval(range(6)) == (0, 5)
    assert median_interval(range(5)) is None  # too few rounds for a 95% interval: a timing takes their whole range
    assert resolved(2.0, 1.0, 2.1, 1.8, 2.2) and not resolved(2.0, 1.9, 2.1, 1.6, 2.1)
    assert resolved(2.0, 1.9, 2.1) and not resolved(2.0, 1.0, 2.1)  # an older row, without the interval: its spread
    clock = FakeClock(monkeypatch)
    calls = [0]

    def sometimes_slow():
        calls[0] += 1
        return 0.004 if calls[0] % 7 == 3 else 0.002

    res = measure_latency({"ref": clock.model(lambda: 0.004), "s": clock.model(sometimes_slow)}, reps=21, warmup=0,
                          min_sample_ms=0)["s"]
    assert res.speedup == pytest.approx(2.0) and (res.speedup_p90 - res.speedup_p10) / res.speedup > MAX_SPREAD
    assert res.speedup_ci_low == pytest.approx(2.0) and res.speedup_ci_high == pytest.approx(2.0) and res.resolved


def test_an_unresolved_speedup_gets_more_rounds_up_to_max_reps(monkeypatch):
    """`time_sessions(max_reps=...)`: after the planned rounds, runs of the reference and the unresolved models only,
    pooled with the first, until each is resolved or has had `max_reps` rounds."""
    from distillery.efficiency.latency import time_sessions

    clock = FakeClock(monkeypatch)
    draws = iter([0.002, 0.006] * 100)
    table = time_sessions({"ref": clock.model(lambda: 0.004), "steady": clock.model(lambda: 0.002),
                           "jumpy": clock.model(lambda: next(draws))}, reps=6, max_reps=18, reference="ref",
                          warmup=0, min_sample_ms=0)
    assert table["steady"].reps == 6 and table["steady"].resolved
    assert table["jumpy"].reps == 18 and len(table["jumpy"].ratios) == 18 and not table["jumpy"].resolved
    assert len(table["ref"].samples_ms) == 6 * 3 + 2 * 6 * 2  # its samples in every run, pooled


def test_a_pinned_down_speedup_stops_after_the_first_rounds_and_a_loose_one_gets_the_planned_ones(monkeypatch):
    """`time_sessions`: the first `FIRST_ROUNDS` rounds, then more only for a speedup whose median's interval is wider
    than `PRECISE`, up to ``reps``; with ``max_reps``, an unresolved one beyond."""
    from distillery.efficiency.latency import FIRST_ROUNDS, time_sessions

    clock = FakeClock(monkeypatch)
    loose = iter([0.0019, 0.0021, 0.0017, 0.0023] * 100)  # ratios 1.7-2.4 around 2: wider than PRECISE, resolved
    table = time_sessions({"ref": clock.model(lambda: 0.004), "steady": clock.model(lambda: 0.002),
                           "loose": clock.model(lambda: next(loose))}, reps=20, max_reps=60, reference="ref",
                          warmup=0, min_sample_ms=0)
    assert table["steady"].reps == FIRST_ROUNDS and table["steady"].pinned
    assert table["loose"].reps == 27 and table["loose"].resolved and not table["loose"].pinned  # 9, 18, 27 >= 20


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


def test_the_allocator_is_put_in_a_steady_state_where_glibc_runs():
    """glibc's trim and mmap thresholds are fixed before a CPU timing (the module docstring says why)."""
    import platform

    from distillery.runtime import steady_allocator

    assert steady_allocator() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_sessions_of_a_runtime_model_are_drawn_afresh_and_every_round_of_every_run_counts():
    import time as clock

    from distillery.efficiency.latency import pooled, time_sessions

    made = []

    class Session:  # a model with `fresh()`: an ONNX Runtime session stands in
        def __init__(self):
            made.append(self)

        def __call__(self):
            clock.sleep(0.0005)

        def fresh(self):
            return Session()

    def reference():
        clock.sleep(0.001)

    table = time_sessions({"ref": reference, "int8": Session()}, reps=9, sessions=3, reference="ref",
                          min_sample_ms=1, warmup=1, settle_ms=0)
    assert len(made) == 3  # the first session and two fresh ones
    assert table["int8"].reps == 9 and len(table["int8"].ratios) == 9 and table["int8"].speedup > 1
    assert len(table["ref"].samples_ms) == 3 * (3 + 3)  # each run: a reference sample before and after each round
    single = time_sessions({"ref": reference, "plain": reference}, reps=4, reference="ref", min_sample_ms=1,
                           warmup=1, settle_ms=0)
    assert single["plain"].reps == 4  # nothing to draw afresh: one run
    assert pooled([single]) == single


def test_saved_models_are_timed_in_a_process_of_their_own(tmp_path):
    from distillery.efficiency.apart import time_apart

    cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=32, num_labels=2)
    transformers.BertForSequenceClassification(cfg).save_pretrained(tmp_path / "m")
    model = {"torch": str(tmp_path / "m"), "head": "sequence-classification"}
    tables = time_apart({"ref": model, "same": model, "same-bf16": model}, batches=[1, 3], reference="ref", reps=3,
                        seq_len=7, min_sample_ms=1, device="cpu", precisions={"same-bf16": "bf16"})
    assert sorted(tables) == [1, 3] and sorted(tables[3]) == ["ref", "same", "same-bf16"]
    row = tables[3]["same"]
    assert row.batch == 3 and row.seq_len == 7 and row.threads == torch.get_num_threads()
    assert len(row.ratios) == 3 and row.speedup > 0 and isinstance(row.samples_ms, tuple)
    with pytest.raises(RuntimeError, match="timing process exited"):
        time_apart({"gone": {"torch": str(tmp_path / "none"), "head": "sequence-classification"}}, batches=[1],
                   reps=3, device="cpu")
