"""fp32 vs bf16 autocast on this machine, measured side by side in one run (`distillery.precision`).

Run as ``python -m benchmarks.precision`` (``--device cuda`` on a GPU). The same models and inputs in both
precisions, interleaved (fp32, bf16, bf16, fp32, ...), after a warm-up; the median of each is reported:

  (a) a distillation step of the `local` preset's shapes: a 6 x 384 teacher (all-MiniLM-L6-v2's shape, BERT's
      30522-word vocabulary) and a 3 x 384 student, TinyBERT's intermediate losses (eqs. 7-9) through the
      `Distiller` the Trainer optimises, backward, fused AdamW; batch 32 at length 64 and 128;
      every bf16 run with the attention the pipeline gives it (`distillery.precision.fast_attention`), on a CPU
      with the pipeline's kernels (`distillery.training.cpu_kernels`: dropout, attention, bias); at length 128 the
      bf16 step without them beside it;
  (b) a SQuAD-shaped fine-tuning step: the 6 x 384 encoder with a span head at length 384 (batch --squad-batch);
  (c) inference of the 6 x 384 classifier at batch 1 and 32, length 128, and batch 8 at SQuAD's length 384
      (`distillery.efficiency.measure_latency`, as the evaluate stage times the bf16 row, with the kernels inference
      runs: on a CPU `distillery.training.cpu_kernels`); on a CPU also a padded batch in bf16 as transformers runs
      the model (PyTorch's SDPA) and with those kernels;
  (d) augmentation's MLM forwards: the masked copies of TinyBERT's Algorithm 1 for the first --sentences SST-2
      training sentences (generated ones without ../shared), batched as `MaskedLM.topk` runs them, through a
      6 x 384 MLM (random weights, or --mlm DIR). With --mlm, also the overlap of the top-K candidates of the two
      precisions (does bf16 change what augmentation proposes? It does: the faithful path keeps fp32 forwards).

Beside (a), this machine's matmul ceiling at the student's layer shapes in each precision
(`distillery.efficiency.ceiling.matmul_pass`: one pass over the shapes' matmuls, timed in the same interleaved rounds
as the steps, so that a slow spell of the machine slows both), and the step's share of it (MFU: the step's FLOPs,
student forward and backward and teacher forward, over its time, over the ceiling).

Last line: ``train_speedup: X infer_speedup: Y aug_speedup: Z ceiling_ratio: R step_mfu_bf16: M step_mfu_fp32: N``
(X: (a) at length 128; Y: (c) at batch 32; Z: (d); each fp32 time over bf16 time; R: the bf16 matmul ceiling over
the fp32 one, the most X and Y could be; M, N: (a)'s MFU at length 128), and on a CPU ``kernels_gain: G`` (the bf16
step without `distillery.training.cpu_kernels` over the step with them). On a device without fast bf16 it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Callable

import torch
import transformers

from distillery import precision
from distillery.runtime import steady_allocator
from distillery.training import cpu_kernels
from distillery.efficiency.ceiling import StepFlops, layer_shapes, matmul_pass

#: the matmul ceilings (FLOP/s) measured beside the distillation steps, by precision; each step's MFU, by
#: (batch, length, precision)
CEILINGS: dict[str, float] = {}
MFU: dict[tuple[int, int, str], float] = {}
#: the bf16 step's time without `distillery.training.cpu_kernels` over its time with them, by (batch, length)
KERNELS_GAIN: dict[tuple[int, int], float] = {}
#: (layers, hidden, heads, intermediate): the local preset's teacher (all-MiniLM-L6-v2) and its 3-layer student
TEACHER, STUDENT = (6, 384, 12, 1536), (3, 384, 12, 1536)
VOCAB = 30522
#: the two precisions and their matmul dtypes
FORMS = (("fp32", "float32"), ("bf16", "bfloat16"))


def interleaved(fns: dict[str, Callable[[], None]], reps: int, device: str = "cpu") -> dict[str, float]:
    """Median seconds of each zero-argument function, after one warm-up call each, timed in alternating order (on a
    CUDA device each call is waited for before the clock stops)."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for fn in fns.values():
        fn()
    sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(reps):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            fns[name]()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def attention_for(form: str, *models, device: str = "cpu", training: bool = False) -> None:
    """Each model with the attention the pipeline gives it at `form` on `device` for training or inference
    (`distillery.precision.fast_attention`: under bf16 on a CPU eager to train, SDPA to infer; SDPA otherwise),
    switched before every timed call: both forms share the weights."""
    for model in models:
        model.set_attn_implementation("sdpa")
        precision.fast_attention(model, device, form, training=training)


def _ratio(line: str, t: dict[str, float]) -> float:
    ratio = t["fp32"] / t["bf16"]
    print(f"{line}: fp32 {1000 * t['fp32']:.0f} ms, bf16 {1000 * t['bf16']:.0f} ms, {ratio:.2f}x", flush=True)
    return ratio


def train_steps(model: torch.nn.Module, inputs: dict[str, torch.Tensor], reps: int, *attention,
                device: str = "cpu", torch_kernels: bool = False,
                beside: dict[str, Callable[[], None]] | None = None) -> dict[str, float]:
    """Median seconds of one training step of `model` (forward to its `.loss`, backward, AdamW) in each precision,
    interleaved, on `device` (the model and inputs are moved there), as the pipeline's Trainer runs it: fused AdamW,
    and on a CPU `distillery.training.cpu_kernels` and `distillery.runtime.steady_allocator`; `attention`: the
    transformers models inside whose attention follows the precision. `torch_kernels`: also "bf16, torch kernels",
    the bf16 step without `cpu_kernels`. `beside`: more functions timed in the same rounds."""
    model.to(device)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    if torch.device(device).type == "cpu":
        steady_allocator()  # as the pipeline's Trainer
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)

    def step(form: str, cheap: bool = True) -> Callable[[], None]:
        def run() -> None:
            attention_for(form, *attention, device=device, training=True)
            teacher = getattr(model, "teacher", None)  # a Distiller's, run by the pipeline with the kernels too
            if cheap and teacher is not None:  # it only infers (`distillery.training.trainer`)
                attention_for(form, teacher, device=device)
            with cpu_kernels.used(model if cheap else None, device), \
                    cpu_kernels.used(teacher if cheap else None, device):
                with precision.autocast(device, form):
                    loss = model(**inputs).loss
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return run

    steps = {"fp32": step("fp32"), "bf16": step("bf16")}
    if torch_kernels and torch.device(device).type == "cpu":
        steps["bf16, torch kernels"] = step("bf16", cheap=False)
    return interleaved({**steps, **(beside or {})}, reps, device)


def distillation_step(batch: int, seq: int, reps: int, device: str = "cpu") -> float:
    from benchmarks.distill import INTERMEDIATE, student_model, teacher_model
    from benchmarks.distill import batch as make_batch
    from distillery.layer_map import build_layer_map
    from distillery.training.distill import Distiller, make_projection
    from distillery.training.spec import DistillSpec

    torch.manual_seed(0)
    teacher, student = teacher_model(TEACHER, VOCAB).to(device), student_model(STUDENT, VOCAB)  # the teacher sits
    # outside the Distiller's module tree: `train_steps` moves the student and projections, the teacher moves here
    lm = build_layer_map("uniform", STUDENT[0], TEACHER[0])
    distiller = Distiller(student, teacher, DistillSpec(INTERMEDIATE, "intermediate", lm),
                          make_projection(student, teacher, lm)).train()
    inputs = {k: v for k, v in make_batch(batch, seq).items() if k != "labels"}
    shapes = layer_shapes(STUDENT[1], STUDENT[3], batch * seq)
    passes = {form: matmul_pass(shapes, dtype=dtype, device=device) for form, dtype in FORMS}
    times = train_steps(distiller, inputs, reps, teacher, student, device=device, torch_kernels=seq == 128,
                        beside={f"ceiling {form}": run for form, (_, run) in passes.items()})
    ratio = _ratio(f"(a) distillation step, batch {batch}, length {seq}", times)
    if "bf16, torch kernels" in times:
        KERNELS_GAIN[(batch, seq)] = times["bf16, torch kernels"] / times["bf16"]
        print(f"    bf16 without distillery.training.cpu_kernels: {1000 * times['bf16, torch kernels']:.0f} ms "
              f"({KERNELS_GAIN[(batch, seq)]:.2f}x the time with them)", flush=True)
    flops = StepFlops(student, teacher)(inputs)
    for form, _ in FORMS:  # the matmuls alone, timed in the same rounds as the steps
        ceiling = passes[form][0] / times[f"ceiling {form}"]
        CEILINGS[form] = ceiling
        MFU[(batch, seq, form)] = flops / times[form] / ceiling
        print(f"    {form}: {flops / times[form] / 1e12:.3f} TFLOP/s of a {ceiling / 1e12:.3f} TFLOP/s matmul ceiling "
              f"at these shapes: MFU {MFU[(batch, seq, form)]:.2f}", flush=True)
    print(f"    matmul ceiling bf16 / fp32: {CEILINGS['bf16'] / CEILINGS['fp32']:.2f}x", flush=True)
    return ratio


def squad_step(batch: int, reps: int, device: str = "cpu") -> float:
    from benchmarks.distill import bert_config

    torch.manual_seed(0)
    model = transformers.BertForQuestionAnswering(bert_config(TEACHER, VOCAB)).train()
    g = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.randint(1000, VOCAB, (batch, 384), generator=g),
              "start_positions": torch.randint(0, 384, (batch,), generator=g),
              "end_positions": torch.randint(0, 384, (batch,), generator=g)}
    return _ratio(f"(b) SQuAD fine-tuning step, batch {batch}, length 384",
                  train_steps(model, inputs, reps, model, device=device))


def inference(batch: int, reps: int, device: str = "cpu", seq: int = 128) -> float:
    from benchmarks.distill import batch as make_batch
    from benchmarks.distill import teacher_model
    from distillery.efficiency import measure_latency

    torch.manual_seed(0)
    model = teacher_model(TEACHER, VOCAB)
    table = measure_latency({"fp32": model, "bf16": model}, batch=batch, seq_len=seq, reps=reps, device=device,
                            precisions={"bf16": "bf16"})
    ratio = _ratio(f"(c) inference, batch {batch}, length {seq}", {k: r.median_ms / 1000 for k, r in table.items()})
    if torch.device(device).type == "cpu":  # the kernels inference runs, beside the model as transformers runs it
        inputs = {k: v for k, v in make_batch(batch, seq).items() if k != "labels"}
        padded = 1 - inputs["attention_mask"].float().mean().item()
        model.set_attn_implementation("sdpa")
        plain, kernels = model, copy.deepcopy(model)
        cpu_kernels.put(kernels, device)

        def forward(m: torch.nn.Module) -> Callable[[], None]:
            def run() -> None:
                with torch.inference_mode(), precision.autocast(device, "bf16"):
                    m(**inputs)

            return run

        t = interleaved({"plain": forward(plain), "kernels": forward(kernels)}, reps, device)
        print(f"    bf16 on a padded batch ({padded:.0%} padding): transformers' SDPA model "
              f"{1000 * t['plain']:.0f} ms, with distillery.training.cpu_kernels, as evaluation runs it, "
              f"{1000 * t['kernels']:.0f} ms ({t['plain'] / t['kernels']:.2f}x)", flush=True)
    return ratio


def augmentation(sentences: int, mlm: str | None, reps: int, device: str = "cpu") -> float:
    import tempfile
    from types import SimpleNamespace

    from benchmarks.augment import _sentences, _tokenizer_and_model, _vectors, bert_tokenizer
    from distillery.augment import AugmentConfig, Augmenter

    if mlm is None:  # the MLM shape of the local preset's teacher, random weights (timing does not read them)
        tok = bert_tokenizer()
        torch.manual_seed(0)
        model = transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=len(tok), num_hidden_layers=TEACHER[0], hidden_size=TEACHER[1], num_attention_heads=TEACHER[2],
            intermediate_size=TEACHER[3])).eval().to(device)
    else:
        tok, model = _tokenizer_and_model(SimpleNamespace(mlm=mlm, device=device))
    aug = Augmenter(model, tok, _vectors(tok, tempfile.mkdtemp(prefix="precision-bench-")), AugmentConfig())
    texts = _sentences(sentences, tok.convert_ids_to_tokens(list(range(len(tok)))))
    analyses = [aug.analyse(t) for t in texts]
    copies, _, _ = aug._plan(analyses, fast=False)

    def forwards(form: str) -> Callable[[], None]:
        def run() -> None:
            attention_for(form, model, device=device)
            with precision.use(form):
                aug.mlm.forward_only(copies, aug.config.k, aug.config.batch_size)

        return run

    ratio = _ratio(f"(d) augmentation MLM forwards, {len(copies)} masked copies of {len(texts)} sentences",
                   interleaved({"fp32": forwards("fp32"), "bf16": forwards("bf16")}, reps, device))
    if mlm is not None:  # the MLM's own top-K (the faithful path runs fp32 whatever the precision: this is why)
        ranked = {}
        for form in ("fp32", "bf16"):
            attention_for(form, model, device=device)
            with precision.use(form):
                ranked[form] = [c for copy in aug.mlm.topk(copies, aug.config.k, aug.config.batch_size) for c in copy]
        pairs = [(r, g) for r, g in zip(ranked["fp32"], ranked["bf16"]) if r]
        overlap = sum(len(set(r) & set(g)) / len(r) for r, g in pairs) / max(1, len(pairs))
        same = sum(r == g for r, g in pairs)
        print(f"    bf16 vs fp32 MLM candidates ({mlm}): overlap {overlap:.3f} of the top-{aug.config.k} per masked "
              f"word; the same list in the same order for {same}/{len(pairs)} words", flush=True)
    return ratio


def main(argv: list[str] | None = None) -> dict[str, float] | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=4, help="timed runs of each precision per measurement")
    p.add_argument("--squad-batch", type=int, default=8)
    p.add_argument("--sentences", type=int, default=64, help="SST-2 sentences for the augmentation forwards")
    p.add_argument("--mlm", default=None, help="a trained masked-LM directory (e.g. models/teacher-mlm/model)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: where both precisions run")
    args = p.parse_args(argv)
    dev = args.device
    if torch.device(dev).type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here (torch.cuda.is_available() is False): nothing measured")
        return None
    if not precision.bf16_supported(dev):
        print(f"no bf16 to measure: {precision.why_not(dev)}; the pipeline runs in fp32 here (precision: auto)")
        return None
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    where = (f"{torch.cuda.get_device_name(dev)}" if torch.device(dev).type == "cuda"
             else f"{torch.get_num_threads()} threads, CPU bf16: {', '.join(precision.cpu_bf16_flags())}")
    print(f"torch {torch.__version__}, {where}", flush=True)
    res = {"distill_64": distillation_step(32, 64, args.reps, dev),
           "train_speedup": distillation_step(32, 128, args.reps, dev),
           "squad_step": squad_step(args.squad_batch, args.reps, dev), "infer_b1": inference(1, 5 * args.reps, dev),
           "infer_speedup": inference(32, args.reps, dev), "infer_384": inference(8, args.reps, dev, seq=384),
           "aug_speedup": augmentation(args.sentences, args.mlm, args.reps, dev)}
    res.update(ceiling_ratio=CEILINGS["bf16"] / CEILINGS["fp32"], step_mfu_bf16=MFU[(32, 128, "bf16")],
               step_mfu_fp32=MFU[(32, 128, "fp32")])
    if (32, 128) in KERNELS_GAIN:
        res["kernels_gain"] = KERNELS_GAIN[(32, 128)]
    print(f"train_speedup: {res['train_speedup']:.2f} infer_speedup: {res['infer_speedup']:.2f} "
          f"aug_speedup: {res['aug_speedup']:.2f} ceiling_ratio: {res['ceiling_ratio']:.2f} "
          f"step_mfu_bf16: {res['step_mfu_bf16']:.2f} step_mfu_fp32: {res['step_mfu_fp32']:.2f}"
          + (f" kernels_gain: {res['kernels_gain']:.2f}" if "kernels_gain" in res else ""))
    return res


if __name__ == "__main__":
    main()
