"""MobileBERT (Sun et al., 2020, Sec. 3-4): a bottleneck student trained layer by layer from an IB-BERT teacher.

    IB-BERT teacher of the student's feature-map width (``ib_teacher``: the pipeline's MLM teacher with bottlenecks
    inserted and continued MLM, or MLM from scratch as in the paper)
    -> knowledge transfer (Sec. 3.5-3.6, Figure 2), the embedding and MLM head copied from the teacher:
       feature maps (eq. 2) + attention (eq. 3) of every layer, ``progressive`` (L stages; layer l at the full
       learning rate, the layers below at ``lower_layer_lr_scale``) or ``joint`` (all at once)
    -> pre-training distillation (eq. 4): alpha L_MLM + (1 - alpha) L_KD + L_NSP
    -> fine-tuning on the task (the grid)
    ``auxiliary``: the layer-wise terms added to eq. 4 in one stage, no separate transfer.

``transfer_epochs`` is the transfer's total (progressive: split evenly over the L stages, like the official
``steps_per_phase``); None means ``general_distillation.epochs``. ``feature_map_normalized``: the official code's
layer-normalised maps with mean and variance terms.

CPU-budget option (the paper fine-tunes only): ``intermediate_step`` runs eqs. 2-3 from the fine-tuned teacher on the
task's training set before fine-tuning (TinyBERT's task step 1 with MobileBERT's losses), for a teacher whose depth,
width and heads the student's layers match (`Recipe.plan`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from distillery.recipes.base import Recipe, RecipeError, StageContext, StudentStage, corpus_dataset
from distillery.recipes.checks import student_dims
from distillery.recipes.registry import register_recipe
from distillery.recipes.schema import Section, Shape
from distillery.shape import Dims

#: Corpus sequences on which the teachers' MLM losses are compared (same masks for every model).
MLM_EVAL_SEQUENCES = 256


class IBTeacher(Section):
    """MobileBERT's IB-BERT teacher (Sec. 3.1): inverted bottlenecks give its inter-block feature maps the student's
    width, so eqs. 2-3 compare them without a projection; its intra-block width is its own.

    ``convert``: the pipeline's MLM teacher with bottleneck projections inserted around each of its layers (BERT
    weights inside, new input/output linears) and continued MLM training; ``scratch``: MLM pre-training from random
    weights (the paper), ``shape`` defaulting to the student's depth, width, heads and embedding with an intra-block
    width of twice the inter-block one and FFN 4 x intra (for the ``mobilebert`` student: IB-BERT_LARGE).
    The MLM schedule (lr, batch, warm-up, length) is ``pretrain``'s; ``epochs`` None means ``pretrain.epochs``."""

    # convert (the pipeline's MLM teacher with bottlenecks inserted, continued MLM) | scratch (MLM from random weights)
    init: Literal["convert", "scratch"] = "convert"
    # init scratch: its shape; None: the student's depth, width, heads, embedding; intra-block 2 x width, FFN 4 x intra
    shape: Shape | None = None
    # MLM epochs (the rest of its schedule is `pretrain`'s); None: `pretrain.epochs`
    epochs: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _shape_for_scratch(self) -> "IBTeacher":
        if self.shape is not None and self.init != "scratch":
            raise ValueError("`shape` is for init 'scratch' (a converted teacher takes its shape from the teacher)")
        return self


@register_recipe
class MobileBertRecipe(Recipe):
    """MobileBERT: IB teacher -> layer-wise transfer -> pre-training distillation (eq. 4) -> fine-tuning."""

    recipe: Literal["mobilebert"] = "mobilebert"
    ib_teacher: IBTeacher = IBTeacher()  # the IB-BERT teacher the student learns its layers from
    # knowledge transfer: progressive (layer by layer) | joint (all layers at once) | auxiliary (in eq. 4, no own stage)
    transfer: Literal["progressive", "joint", "auxiliary"] = "progressive"
    lower_layer_lr_scale: float = Field(0.1, ge=0, le=1)  # Sec. 3.6 "a small learning rate"; official: 0.1
    # knowledge transfer's total epochs (progressive: split evenly over the layers); None: `general_distillation.epochs`
    transfer_epochs: float | None = Field(None, gt=0)
    feature_map_normalized: bool = False          # official: layer-normalised maps + mean/variance terms
    alpha: float = Field(0.5, gt=0, lt=1)         # eq. 4; Appendix: 0.5 (= official distill_ground_truth_ratio)
    next_sentence_prediction: bool = True         # eq. 4's L_NSP on sentence pairs of the corpus documents
    mlm_probability: float = Field(0.15, gt=0, lt=1)  # share of tokens masked in pre-training distillation

    OBJECTIVES: ClassVar[dict[str, float]] = {"feature_map_loss": 1.0, "attention_transfer_loss": 1.0}
    ANY_DEPTH: ClassVar[bool] = True  # the IB teacher's depth, not the pipeline teacher's
    STUDENT_STAGES: ClassVar[dict[str, str]] = {"ib_teacher": "ib-teacher", "knowledge_transfer": "transfer",
                                                "general_distillation": "general"}
    OPTIONS: ClassVar[tuple[str, ...]] = ("teacher_train_mode", "feature_map_normalized")
    TASK_LAYER_WISE: ClassVar[bool] = True

    @property
    def needs_mlm_teacher(self) -> bool:
        return self.runs_general and self.ib_teacher.init == "convert"

    @property
    def runs_transfer(self) -> bool:
        """Whether a separate knowledge-transfer stage runs before pre-training distillation."""
        return self.runs_general and self.transfer != "auxiliary"

    def loss_options(self):
        from distillery.objectives.registry import LossOptions

        return LossOptions(feature_map_normalized=self.feature_map_normalized, mlm_alpha=self.alpha)

    def map_layers(self, n_student: int, n_teacher: int):
        """Student layer l <- teacher layer l (the same depth): block output l (eq. 2), attention of layer l (eq. 3)."""
        from distillery.training.progressive_transfer import layer_wise_map

        return layer_wise_map(range(1, n_student + 1))

    def check(self, teacher: Dims, key: str) -> None:
        super().check(teacher, key)
        s = student_dims(self, teacher, key)
        if s.arch != "mobilebert":
            raise RecipeError(f"{key}.shape: the mobilebert recipe needs a mobilebert shape (a bottleneck student), "
                              f"got {s.arch}")
        if self.runs_general and self.init.kind in ("random", "pruned"):
            from distillery.ib_teacher import IBShapeError, ib_teacher_shape

            try:
                ib = ib_teacher_shape(self.shape.resolve(), self.ib_teacher.init,
                                      self.ib_teacher.shape.resolve() if self.ib_teacher.shape else None, teacher)
            except IBShapeError as exc:
                raise RecipeError(f"{key}.ib_teacher: {exc}") from None
            if (s.layers, s.hidden, s.heads) != (ib.layers, ib.hidden, ib.heads):
                raise RecipeError(
                    f"{key}.shape: layer-wise transfer needs the IB teacher's depth, feature-map width and heads "
                    f"({ib.layers}/{ib.hidden}/{ib.heads}); the student has {s.layers}/{s.hidden}/{s.heads}")
        if self.intermediate_step and (s.layers, s.hidden, s.heads) != (
                teacher.layers, teacher.hidden, teacher.heads):
            raise RecipeError(
                f"{key}.intermediate_step: eqs. 2-3 on the task read the fine-tuned teacher layer by layer and need "
                f"its depth, feature-map width and heads ({teacher.layers}/{teacher.hidden}/{teacher.heads}); the "
                f"student has {s.layers}/{s.hidden}/{s.heads}")

    def _check_pruned(self, teacher: Dims, s: Dims, key: str) -> None:
        """``init: pruned`` cuts the student from the converted teacher (`distillery.ib_pruning`): every teacher layer,
        the teacher's width between blocks, a narrower inside of the converted teacher's layout."""
        extra = dict(self.shape.resolve().extra)
        wants = {"the teacher's BERT architecture": teacher.arch == "bert",
                 "ib_teacher.init convert": self.ib_teacher.init == "convert",
                 "general_distillation: true": self.runs_general,
                 f"init.teacher_layers auto (all {teacher.layers})":
                     self.init.teacher_layers in ("auto", list(range(teacher.layers))),
                 f"layers {teacher.layers}, hidden {teacher.hidden}, heads {teacher.heads}":
                     (s.layers, s.hidden, s.heads) == (teacher.layers, teacher.hidden, teacher.heads),
                 f"intra <= {teacher.hidden}, a multiple of the heads; intermediate <= {teacher.intermediate}":
                     extra.get("intra_bottleneck_size", 0) <= teacher.hidden
                     and extra.get("intra_bottleneck_size", 0) % teacher.heads == 0
                     and s.intermediate <= teacher.intermediate,
                 "ffns 1, layer_norm, use_bottleneck_attention": extra.get("num_feedforward_networks") == 1
                     and extra.get("normalization_type") == "layer_norm" and extra.get("use_bottleneck_attention")
                     and not extra.get("key_query_shared_bottleneck")}
        missing = [what for what, ok in wants.items() if not ok]
        if missing:
            raise RecipeError(f"{key}.init: pruned cuts a MobileBERT student from the converted teacher and needs: "
                              + "; ".join(missing))

    def _transfer_start(self, ctx: StageContext, teacher, tokenizer, train):
        """The student the transfer (or eq. 4) starts from: cut from the pre-trained teacher (``pruned``, ranked on the
        corpus), else random layers with the IB teacher's embedding and MLM head."""
        from distillery.training.progressive_transfer import student_from_teacher

        if self.init.kind == "pruned":
            from transformers import AutoModelForMaskedLM

            return self.start_student(AutoModelForMaskedLM.from_pretrained(ctx.teacher), tokenizer,
                                      head=self._student_head(), data=train)
        return student_from_teacher(self.shape.resolve(), teacher, head=self._student_head())

    # ---------------------------------------------------------------- stages

    def stages(self, teacher: Dims) -> dict[str, StudentStage]:
        if not self.runs_general:
            return {}
        transfer = {"knowledge_transfer": StudentStage(self.transfer_stage)} if self.runs_transfer else {}
        return {"ib_teacher": StudentStage(self.ib_teacher_stage, schedule="pretrain"), **transfer,
                "general_distillation": StudentStage(self.general_stage)}

    def _student_head(self) -> str:
        return "pretraining" if self.next_sentence_prediction else "mlm"

    @property
    def exact_conversion(self) -> bool:
        """Whether the converted IB teacher computes exactly what the teacher computes (`distillery.ib_teacher.
        convert_bert`): for a student cut from it, which inherits its function; a student that learns its feature maps
        from random layers gets the teacher with MobileBERT's residual kept, maps its blocks can make
        (docs/recipes/mobilebert.md)."""
        return self.init.kind == "pruned"

    def ib_teacher_stage(self, ctx: StageContext) -> dict[str, Any]:
        """The IB-BERT teacher; logs the MLM loss of the original teacher, of the converted one before training and
        of the IB teacher (same masked sequences)."""
        from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

        from distillery import corpus
        from distillery.ib_teacher import convert_bert, scratch_shape
        from distillery.models import build_student
        from distillery.training.mlm import masked_lm_loss, train_mlm
        from distillery.training.spec import TrainRun

        pt = ctx.schedule
        tokenizer = AutoTokenizer.from_pretrained(ctx.teacher)
        texts = corpus.pack_sequences(corpus.read_sentences(ctx.corpus), tokenizer, pt.max_length)

        def mlm_loss(model) -> float:
            return masked_lm_loss(model, tokenizer, texts[:MLM_EVAL_SEQUENCES], max_length=pt.max_length,
                                  mlm_probability=pt.mlm_probability, seed=ctx.seed)

        metrics: dict[str, Any] = {}
        shape = self.shape.resolve()
        if self.ib_teacher.init == "convert":
            original = AutoModelForMaskedLM.from_pretrained(ctx.teacher)
            metrics["mlm_loss_original"] = mlm_loss(original)
            model = convert_bert(original, shape, exact=self.exact_conversion)
            metrics["mlm_loss_converted"] = mlm_loss(model)
        else:
            spec = self.ib_teacher.shape
            ib_shape = scratch_shape(shape, spec.resolve() if spec is not None else None)
            model = build_student(ib_shape, len(tokenizer), head="mlm", base=AutoConfig.from_pretrained(ctx.teacher))
        args = {**ctx.args, "num_train_epochs": self.ib_teacher.epochs or pt.epochs}
        train_mlm(model, TrainRun(ctx.out, texts, tokenizer=tokenizer, args=args), max_length=pt.max_length,
                  mlm_probability=pt.mlm_probability)
        metrics["mlm_loss_ib_teacher"] = mlm_loss(model)
        cfg = model.config
        metrics.update({"inter_block": cfg.hidden_size, "intra_block": cfg.intra_bottleneck_size,
                        "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads, "sequences": len(texts)})
        return {"metrics": metrics}

    def _ib_teacher(self, ctx: StageContext):
        from transformers import AutoTokenizer

        from distillery.models import load_model

        source = ctx.inputs["ib_teacher"]
        return load_model(source, head="mlm"), AutoTokenizer.from_pretrained(str(source))

    def transfer_stage(self, ctx: StageContext) -> dict[str, Any]:
        """Progressive or joint layer-wise transfer (feature maps + attention) from the IB teacher."""
        from distillery.models import num_layers
        from distillery.training.progressive_transfer import joint_transfer, progressive_transfer
        from distillery.training.spec import TrainRun

        teacher, tokenizer = self._ib_teacher(ctx)
        train, n = corpus_dataset(ctx, tokenizer)
        model = self._transfer_start(ctx, teacher, tokenizer, train)
        spec = self.layer_wise_spec(num_layers(model), num_layers(teacher))
        run = TrainRun(ctx.out, train, tokenizer=tokenizer, args=ctx.args)
        if self.transfer == "progressive":
            progressive_transfer(teacher, model, spec, run, lower_layer_lr_scale=self.lower_layer_lr_scale,
                                 epochs=self.transfer_epochs)
        else:
            joint_transfer(teacher, model, spec, run, epochs=self.transfer_epochs)
        return {"metrics": {"sequences": n, "layers": teacher.config.num_hidden_layers}}

    def general_stage(self, ctx: StageContext) -> dict[str, Any]:
        """Pre-training distillation, eq. 4 (+ the layer-wise terms for ``auxiliary``), with NSP on sentence pairs
        built inside the corpus documents."""
        from distillery import corpus
        from distillery.models import load_model, num_layers
        from distillery.objectives import ObjectiveWeights
        from distillery.training.pretraining_distillation import nsp_dataset, pretraining_distillation
        from distillery.training.spec import DistillSpec, TrainRun

        gd = ctx.schedule
        teacher, tokenizer = self._ib_teacher(ctx)
        if self.runs_transfer:
            model = load_model(ctx.inputs["knowledge_transfer"], head=self._student_head())
        else:
            model = self._transfer_start(ctx, teacher, tokenizer, corpus_dataset(ctx, tokenizer)[0])
        if self.next_sentence_prediction:
            pairs = corpus.sentence_pairs(corpus.read_sentences(ctx.corpus), tokenizer, gd.max_length, seed=ctx.seed)
            train, n = nsp_dataset(pairs, tokenizer, gd.max_length), len(pairs)
        else:
            train, n = corpus_dataset(ctx, tokenizer)
        objectives = {"pretraining_distillation_loss": 1.0}
        layer_map = None
        if not self.runs_transfer:  # auxiliary knowledge transfer: the layer-wise terms in the same loss
            objectives.update(self.weights.weights)
            layer_map = self.map_layers(num_layers(model), num_layers(teacher))
        spec = DistillSpec(ObjectiveWeights(objectives), "pretraining", options=self.loss_options(),
                           teacher_train_mode=self.teacher_train_mode)
        if layer_map is not None:
            spec = spec.with_(layer_map=layer_map)
        pretraining_distillation(teacher, model, spec, TrainRun(ctx.out, train, tokenizer=tokenizer, args=ctx.args),
                                 mlm_probability=self.mlm_probability)
        return {"metrics": {"sequences": n}}
