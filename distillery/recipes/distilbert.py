"""DistilBERT (Sanh et al., 2019, Sec. 3): a student of the teacher's width, initialised from its layers, pre-trained
by distillation, then fine-tuned.

    init: the teacher's embeddings and layers [0, 2, 4, 7, 9, 11] (``teacher_layers: auto`` spreads them evenly)
    -> pre-training distillation on the corpus: L = 5 L_ce + 2 L_mlm + 1 L_cos, L_ce the soft targets at T = 2 over
       every non-pad token, L_mlm the masked-LM loss, L_cos the cosine between last hidden states
    -> fine-tuning on the task (the grid) [-> prediction-layer distillation from the fine-tuned teacher, the paper's
       extra step, with ``task_distillation: true``]

Official-code settings as keys: ``mask_smoothing`` (masking probability ~ count^-0.7), Adam beta2 0.98, epsilon 1e-6,
gradient clip 5.0, gradient accumulation (the paper's ~4K-sequence batches).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from distillery.recipes.base import Recipe, RecipeError, StageContext, corpus_dataset
from distillery.recipes.checks import student_dims
from distillery.recipes.registry import register_recipe
from distillery.recipes.schema import InitField, TeacherLayersInit
from distillery.shape import Dims


@register_recipe
class DistilBertRecipe(Recipe):
    """DistilBERT: init from teacher layers, 5 L_ce + 2 L_mlm + 1 L_cos, fine-tuning."""

    recipe: Literal["distilbert"] = "distilbert"
    init: Annotated[InitField, Field(default_factory=TeacherLayersInit)]
    temperature: float = Field(2.0, gt=0)  # softmax temperature T of the soft-target loss L_ce
    mlm_probability: float = Field(0.15, gt=0, lt=1)  # share of tokens masked for L_mlm (80/10/10)
    mask_smoothing: float = Field(0.7, ge=0)      # masking probability ~ count^-0.7 (official); 0 = uniform
    adam_beta2: float = Field(0.98, gt=0, lt=1)  # AdamW beta2 of pre-training distillation (official)
    adam_epsilon: float = Field(1e-6, gt=0)  # AdamW epsilon of pre-training distillation (official)
    max_grad_norm: float = Field(5.0, gt=0)  # gradient clipping norm of pre-training distillation (official)
    gradient_accumulation_steps: int = Field(1, ge=1)  # the paper's ~4K-sequence batches: raise on a GPU

    OBJECTIVES: ClassVar[dict[str, float]] = {"soft_target_loss": 5.0, "mlm_loss": 2.0, "cosine_loss": 1.0}
    LEVEL: ClassVar[str] = "pretraining"
    OPTIONS: ClassVar[tuple[str, ...]] = ("teacher_train_mode", "temperature")

    @property
    def runs_general(self) -> bool:
        if self.general_distillation is not None:
            return self.general_distillation
        return self.init.kind != "checkpoint"

    @property
    def needs_mlm_teacher(self) -> bool:
        return self.runs_general

    def loss_options(self):
        from distillery.objectives.registry import LossOptions

        return LossOptions(temperature=self.temperature)

    def optimizer_options(self) -> dict[str, Any]:
        """TrainingArguments of pre-training distillation that the official code sets."""
        return {"adam_beta2": self.adam_beta2, "adam_epsilon": self.adam_epsilon,
                "max_grad_norm": self.max_grad_norm, "gradient_accumulation_steps": self.gradient_accumulation_steps}

    def check(self, teacher: Dims, key: str) -> None:
        super().check(teacher, key)
        s = student_dims(self, teacher, key)
        if "cosine_loss" in self.weights.active() and s.hidden != teacher.hidden:
            raise RecipeError(f"{key}.shape: cosine_loss needs the teacher's hidden size {teacher.hidden}, the student "
                              f"has {s.hidden}")
        if s.arch == "mobilebert":
            raise RecipeError(f"{key}.shape: the distilbert recipe needs a bert or distilbert student")

    def map_layers(self, n_student: int, n_teacher: int):
        """L_cos compares the last hidden states."""
        from distillery.layer_map import LayerMap

        return LayerMap(hidden=((n_student, n_teacher),))

    def general_stage(self, ctx: StageContext) -> dict[str, Any]:
        """Pre-training distillation of the MLM teacher, masking as the official code (smoothed frequencies)."""
        from transformers import AutoModelForMaskedLM, AutoTokenizer

        from distillery.models import num_layers
        from distillery.training.distill import distill
        from distillery.training.masking import SmoothedMaskingCollator, masking_weights, token_counts
        from distillery.training.spec import TrainRun

        tokenizer = AutoTokenizer.from_pretrained(ctx.teacher)
        teacher = AutoModelForMaskedLM.from_pretrained(ctx.teacher)
        train, n = corpus_dataset(ctx, tokenizer)
        train = train.select_columns(["input_ids"])
        model = self.start_student(teacher, tokenizer, head="mlm", data=train)
        weights = masking_weights(token_counts(train["input_ids"], len(tokenizer)), self.mask_smoothing,
                                  tokenizer.all_special_ids)
        collator = SmoothedMaskingCollator(tokenizer, weights, self.mlm_probability, seed=ctx.seed)
        spec = self.layer_wise_spec(num_layers(model), num_layers(teacher))
        run = TrainRun(ctx.out, train, tokenizer=tokenizer, data_collator=collator,
                       args={**ctx.args, **self.optimizer_options()})
        distill(teacher, model, spec, run)
        return {"metrics": {"sequences": n}}
