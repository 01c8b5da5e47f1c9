"""GPU paths on the CPU: the GPU benchmark at micro scale, bf16 autocast against fp32, the CUDA-only defaults."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import gpu
from benchmarks.distill import batch, student_model, teacher_model
from distillery.layer_map import build_layer_map
from distillery.training.distill import Distiller, make_projection
from distillery.training.spec import DistillSpec

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models on one intra-op thread (tests/conftest.py)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_gpu_benchmark_without_cuda_says_so_and_measures_nothing(capsys):
    assert gpu.main([]) is None
    out = capsys.readouterr().out
    assert "needs a CUDA device" in out and "--device cpu --micro" in out


def test_gpu_benchmark_runs_its_code_at_micro_scale_on_cpu(capsys, one_thread):
    res = gpu.main(["--device", "cpu", "--micro"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("aug_speedup: ") and " step_ratio: " in last and " gd_seq_per_s: " in last
    assert res["aug_speedup"] > 0 and res["step_ratio"] > 0 and res["gd_seq_per_s"] > 0
    assert math.isnan(res["mfu"])  # no known peak for a CPU
    assert gpu.peak_tflops(torch.device("cpu"), 100.0) == 100.0


def test_step_flops_count_teacher_forward_and_student_forward_backward():
    shapes = gpu.MICRO
    t = teacher_model(shapes["teacher_shape"], shapes["vocab"]).config
    s = student_model(shapes["student_shape"], shapes["vocab"]).config
    from distillery.efficiency import flops_per_example
    assert gpu.step_flops(4, 16, **shapes) == 4 * (flops_per_example(t, 16) + 3 * flops_per_example(s, 16))


def test_paper_projection():
    # 2.5e9 words x 1.3 tokens / 128 per sequence x 3 epochs = 76.17M sequences; at 1000 sequences/s: 21.2 hours
    assert gpu.paper_gpu_hours(1000.0) == pytest.approx(2.5e9 * 1.3 / 128 * 3 / 1000 / 3600)
    assert gpu.paper_gpu_hours(1000.0) == pytest.approx(21.16, abs=0.01)


def test_bf16_autocast_step_matches_fp32(one_thread):
    """One intermediate-layer distillation step's losses and gradients under bf16 autocast (what a GPU run uses) stay
    within bf16 tolerance of the fp32 CPU path."""
    torch.manual_seed(0)
    teacher, student = teacher_model((2, 64, 2, 128), 1000), student_model((1, 32, 2, 64), 1000)
    lm = build_layer_map("uniform", 1, 2)
    spec = DistillSpec({"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0}, "intermediate", lm)
    # eval mode: no dropout, so both passes see the same network (without labels it still distils)
    distiller = Distiller(student, teacher, spec, make_projection(student, teacher, lm)).eval()
    b = {k: v for k, v in batch(8, 16, vocab=1000).items() if k != "labels"}

    def step(bf16: bool):
        distiller.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = distiller(**b)
        out.loss.backward()
        grad = torch.cat([p.grad.flatten() for p in distiller.parameters() if p.grad is not None])
        return float(out.loss.detach()), {k: float(v.detach()) for k, v in out.terms.items()}, grad

    total32, parts32, grad32 = step(False)
    total16, parts16, grad16 = step(True)
    assert total32 > 0 and set(parts16) == set(parts32)
    assert total16 == pytest.approx(total32, rel=0.03)
    for name in parts32:
        assert parts16[name] == pytest.approx(parts32[name], rel=0.05, abs=1e-4), name
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.99


def test_trainer_precision_options_follow_the_device(monkeypatch):
    """Outside the pipeline's switch: bf16 + TF32 on an Ampere+ bf16 GPU, neither on a V100, fp32 on a CPU."""
    from distillery import precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.trainer_options() == {"bf16": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))  # H100
    assert precision.trainer_options() == {"bf16": True, "tf32": True}
    with precision.use("fp32"):
        assert precision.trainer_options() == {"bf16": False, "tf32": True}
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (7, 0))  # V100: neither
    assert precision.trainer_options() == {"bf16": False}


def test_gpu_loader_options_feed_a_gpu_and_leave_a_cpu_alone(monkeypatch, tmp_path):
    """On a GPU the batches come from persistent worker processes, pinned, with no per-step NaN check of the loss
    (a host-device wait); on a CPU (or `use_cpu`) the loader stays in the training process; a caller's option wins;
    under a launcher the machine's cores are shared among its processes."""
    from distillery.training.args import LOADER_WORKERS, training_arguments

    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = training_arguments(tmp_path)
    assert (cpu.dataloader_num_workers, cpu.dataloader_pin_memory, cpu.logging_nan_inf_filter) == (0, False, False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("distillery.precision.trainer_options", lambda *a, **k: {})
    monkeypatch.setattr("transformers.TrainingArguments.__post_init__", lambda self: None)  # no device to set up
    on_gpu = training_arguments(tmp_path)
    assert on_gpu.dataloader_num_workers == LOADER_WORKERS and on_gpu.dataloader_persistent_workers
    assert on_gpu.dataloader_pin_memory and on_gpu.dataloader_prefetch_factor == 4
    assert training_arguments(tmp_path, {"dataloader_num_workers": 1}).dataloader_num_workers == 1
    in_process = training_arguments(tmp_path, {"dataloader_num_workers": 0})  # no prefetch without workers
    assert in_process.dataloader_prefetch_factor is None and not in_process.dataloader_persistent_workers
    assert training_arguments(tmp_path, use_cpu=True).dataloader_num_workers == 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert training_arguments(tmp_path).dataloader_num_workers == 1  # 16 cores / 8 processes, one left to each


def test_distillation_loop_with_loader_workers(one_thread):
    """The pipeline's loop as it runs on a GPU: the collators cross into persistent worker processes."""
    from benchmarks.gpu_loop import loop_step

    step = loop_step(4, 4, 16, options={"dataloader_num_workers": 2, "dataloader_persistent_workers": True,
                                            "dataloader_prefetch_factor": 2}, **gpu.MICRO)
    assert step > 0


def test_gpu_loop_benchmark_at_micro_scale(capsys, tmp_path):
    from benchmarks import gpu_loop

    res = gpu_loop.main(["--device", "cpu", "--micro", "--out", str(tmp_path)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("bare_ms: ") and " speedup: " in last and " loop_ratio: " in last
    assert res["before_ms"] > 0 and res["pipeline_ms"] > 0
    assert (tmp_path / "host_profile.txt").read_text().count("\n") > 10 and (tmp_path / "trace.json.gz").stat().st_size
