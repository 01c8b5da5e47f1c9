"""BERT-PKD (Sun et al., EMNLP 2019, "Patient Knowledge Distillation for BERT Model Compression", Sec. 3-4).

    init: the pre-trained teacher's embeddings and first k layers, a fresh classifier (BERT_k "initialised from the
    first k layers"; the official code's default encoder checkpoint is pre-trained BERT)
    -> task distillation over the fine-tuning grid (``task_distillation.finetune``, the one its direct baseline
       gets: the paper searches FT, KD and PKD over the same learning rates and epochs):
       L = (1 - alpha) L_CE + alpha L_DS(T) + beta L_PT
       (``distillery.objectives.pkd``), the student learning "patiently" from the [CLS] states of teacher layers
       I_pt(j), j = 1..k-1 (the last layer is taught by L_DS):
         PKD-Skip (``strategy: skip``, the paper's better one): I_pt(j) = j * N/k, e.g. {2, 4, 6, 8, 10} for 12 -> 6
         PKD-Last (``strategy: last``): I_pt(j) = N - k + j, e.g. {7, 8, 9, 10, 11}

Defaults: the middle of the paper's search space (Sec. 4.1: T in {5, 10, 20}, alpha in {0.2, 0.5, 0.7}, beta in
{10, 100, 500, 1000}): T = 10, alpha = 0.5, beta = 100; ``objectives`` in params replaces the three weights.
The official code differs in two places, both options: L_PT as a mean over every element (``patient_reduction:
official``), and L_DS as KL x T^2 (the soft CE here is the paper's; KL differs from it by the teacher's entropy, a
constant, so only the T^2 scale differs: raise alpha to match).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from distillery.models import Dims
from distillery.recipes.base import Init, Recipe, RecipeError, TaskContext, TeacherLayersInit, task_student
from distillery.recipes.registry import register_recipe


@register_recipe
class PKDRecipe(Recipe):
    """BERT-PKD: first k teacher layers, then soft targets + gold labels + the patient loss on the task."""

    recipe: Literal["pkd"] = "pkd"
    init: Annotated[Init, Field(default_factory=lambda: TeacherLayersInit(teacher_layers="auto"))]
    # the patient loss's teacher layers: skip (PKD-Skip: every N/k-th) | last (PKD-Last: the k-1 below the top)
    strategy: Literal["skip", "last"] = "skip"
    alpha: float = Field(0.5, ge=0, le=1)  # weight of the soft targets L_DS; the gold labels' L_CE gets 1 - alpha
    beta: float = Field(100.0, ge=0)  # weight of the patient loss L_PT
    temperature: float = Field(10.0, gt=0)  # softmax temperature T of L_DS (the extra step has its section's)
    # L_PT summed over layers and hidden size, a batch mean (paper), or a mean over every element (official)
    patient_reduction: Literal["paper", "official"] = "paper"

    OBJECTIVES: ClassVar[dict[str, float]] = {"hard_label_loss": 0.5, "prediction_loss": 0.5, "patient_loss": 100.0}
    LAYERS_FROM_PRETRAINED: ClassVar[bool] = True

    @property
    def weights(self):
        """(1 - alpha) L_CE + alpha L_DS + beta L_PT, unless params give ``objectives``."""
        from distillery.objectives import ObjectiveWeights

        if self.objectives is not None:
            return ObjectiveWeights(self.objectives)
        return ObjectiveWeights({"hard_label_loss": 1 - self.alpha, "prediction_loss": self.alpha,
                                 "patient_loss": self.beta})

    @property
    def task_distills(self) -> bool:
        return True

    def options(self) -> dict[str, Any]:
        return {**super().options(), "strategy": self.strategy, "temperature": self.temperature,
                "patient_reduction": self.patient_reduction}

    def loss_options(self):
        from distillery.objectives.registry import LossOptions

        return LossOptions(temperature=self.temperature, extra={"patient_reduction": self.patient_reduction})

    def map_layers(self, n_student: int, n_teacher: int):
        """Student layer j <- teacher layer I_pt(j) for j = 1..k-1 (1-based outputs of the layers)."""
        from distillery.layer_map import LayerMap

        step = n_teacher // n_student
        teacher = [j * step if self.strategy == "skip" else n_teacher - n_student + j for j in range(1, n_student)]
        return LayerMap(hidden=tuple(zip(range(1, n_student), teacher)))

    def check(self, teacher: Dims, key: str) -> None:
        super().check(teacher, key)
        s = self.student_dims(teacher, key)
        if s.hidden != teacher.hidden:
            raise RecipeError(f"{key}.shape: patient_loss compares [CLS] states of equal width: the teacher's hidden "
                              f"size is {teacher.hidden}, the student's {s.hidden}")
        if s.layers < 2 and "patient_loss" in self.weights.active():
            raise RecipeError(f"{key}.shape: a 1-layer student has no intermediate layer for patient_loss")

    def auto_teacher_layers(self, n_teacher: int, n_student: int) -> list[int]:
        """``teacher_layers: auto`` means the first k layers here (the paper), not DistilBERT's spread."""
        return list(range(n_student))

    def task_stage(self, ctx: TaskContext):
        """Patient distillation over the fine-tuning grid; the teacher runs on every batch (its hidden states). With
        ``task_distillation`` the extra step follows (``augmented``: TinyBERT's augmented set, which the paper's
        gold-label term cannot use: prediction-layer distillation only, a CPU-budget option of this project)."""
        from dataclasses import replace

        from distillery.models import num_layers
        from distillery.training.grid import prediction_grid
        from distillery.training.spec import DistillSpec

        start = task_student(self, ctx)
        n_student = self.shape.resolve().layers
        spec = DistillSpec(self.weights, "prediction", self.map_layers(n_student, num_layers(ctx.teacher)),
                           self.loss_options(), teacher_train_mode=self.teacher_train_mode)
        train, dev = ctx.data(False, unlabeled=True)  # its soft targets and patient loss read every row
        grid, run = ctx.grid(ctx.sections.finetune)
        grid = replace(grid, cache_teacher_logits=False)
        pkd = prediction_grid(ctx.teacher, start, spec, run.with_(output_dir=ctx.out / "grid", train_dataset=train,
                                                                  eval_dataset=dev), grid)
        return self.extra_step(ctx, pkd), None
