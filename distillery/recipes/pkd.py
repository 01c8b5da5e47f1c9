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

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from distillery.recipes.base import Recipe, RecipeError
from distillery.recipes.checks import student_dims
from distillery.recipes.registry import register_recipe
from distillery.recipes.schema import InitField, TeacherLayersInit
from distillery.recipes.steps import extra, student_start
from distillery.shape import Dims


@register_recipe
class PKDRecipe(Recipe):
    """BERT-PKD: first k teacher layers, then soft targets + gold labels + the patient loss on the task."""

    recipe: Literal["pkd"] = "pkd"
    init: Annotated[InitField, Field(default_factory=lambda: TeacherLayersInit(teacher_layers="auto"))]
    # the patient loss's teacher layers: skip (PKD-Skip: every N/k-th) | last (PKD-Last: the k-1 below the top)
    strategy: Literal["skip", "last"] = "skip"
    alpha: float = Field(0.5, ge=0, le=1)  # weight of the soft targets L_DS; the gold labels' L_CE gets 1 - alpha
    beta: float = Field(100.0, ge=0)  # weight of the patient loss L_PT
    temperature: float = Field(10.0, gt=0)  # softmax temperature T of L_DS (the extra step has its section's)
    # L_PT summed over layers and hidden size, a batch mean (paper), or a mean over every element (official)
    patient_reduction: Literal["paper", "official"] = "paper"

    OBJECTIVES: ClassVar[dict[str, float]] = {"hard_label_loss": 0.5, "prediction_loss": 0.5, "patient_loss": 100.0}
    LAYERS_FROM_PRETRAINED: ClassVar[bool] = True
    TASK_DISTILLS: ClassVar[bool] = True
    TEACHER_LAYERS: ClassVar[str] = "first"  # ``teacher_layers: auto``: the first k layers (the paper)
    OPTIONS: ClassVar[tuple[str, ...]] = ("teacher_train_mode", "strategy", "temperature", "patient_reduction")

    @property
    def weights(self):
        """(1 - alpha) L_CE + alpha L_DS + beta L_PT, unless params give ``objectives``."""
        from distillery.objectives import ObjectiveWeights

        if self.objectives is not None:
            return ObjectiveWeights(self.objectives)
        return ObjectiveWeights({"hard_label_loss": 1 - self.alpha, "prediction_loss": self.alpha,
                                 "patient_loss": self.beta})

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
        s = student_dims(self, teacher, key)
        if s.hidden != teacher.hidden:
            raise RecipeError(f"{key}.shape: patient_loss compares [CLS] states of equal width: the teacher's hidden "
                              f"size is {teacher.hidden}, the student's {s.hidden}")
        if s.layers < 2 and "patient_loss" in self.weights.active():
            raise RecipeError(f"{key}.shape: a 1-layer student has no intermediate layer for patient_loss")

    def plan(self, teacher: Dims, sections):
        """Patient distillation over the fine-tuning grid, on the gold and unlabelled rows (its soft targets and
        patient loss read every row; the gold-label term skips unlabelled ones); the teacher runs on every batch (its
        hidden states). With ``task_distillation`` the extra step follows (``augmented``: TinyBERT's augmented set,
        which the paper's gold-label term cannot use: prediction-layer distillation only, a CPU-budget option)."""
        from distillery.training.plan import Plan, Step
        from distillery.training.spec import DistillSpec

        spec = DistillSpec(self.weights, "prediction", self.map_layers(self.shape.resolve().layers, teacher.layers),
                           self.loss_options(), teacher_train_mode=self.teacher_train_mode)
        return Plan((Step("grid", student_start(self), "finetune", spec, unlabeled=True, cache_logits=False),
                     *extra(self, sections)))
