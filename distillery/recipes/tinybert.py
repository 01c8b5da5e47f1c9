"""TinyBERT (Jiao et al., 2020, Sec. 3-4): transformer distillation in two stages.

    init random -> general distillation on the corpus: L_attn (eq. 7) + L_hidn (eq. 8) + L_embd (eq. 9)
    -> task distillation step 1: the same losses on the augmented task set (Algorithm 1)
    -> step 2: prediction-layer distillation L_pred (eq. 10) over the lr x batch grid, best on dev

Layer map g(m) (Sec. 3.1, Table 7): ``uniform`` (student layer m <- teacher layer m * N/M), ``top`` or ``bottom``.
Official-code behaviour as switches: ``official_attention_masking`` (-10000 masking and zeroing, the default),
``per_layer_projection`` (one W_h per mapped state instead of the paper's shared one), ``prediction_reduction``
(``official``: 1/C of eq. 10), ``teacher_train_mode`` (the official code leaves the teacher's dropout on).
Ablations (Tables 2-3): ``augmentation: false`` (w/o DA), ``intermediate_step: false`` (w/o step 1).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from distillery.recipes.base import Recipe, RecipeError
from distillery.recipes.checks import student_dims
from distillery.recipes.registry import register_recipe
from distillery.recipes.steps import after, intermediate, predict, student_start
from distillery.shape import Dims


@register_recipe
class TinyBertRecipe(Recipe):
    """TinyBERT: attention + hidden + embedding distillation, then the prediction layer."""

    recipe: Literal["tinybert"] = "tinybert"
    # which teacher layer each student layer learns from, g(m): uniform (m <- m * N/M) | top | bottom
    layer_map: Literal["uniform", "top", "bottom"] = "uniform"
    # attention loss as the official code: -10000 on padded keys, scores <= -100 zeroed, MSE over all positions;
    # false: valid query-key pairs only
    official_attention_masking: bool = True
    per_layer_projection: bool = False  # one W_h per mapped hidden state instead of the paper's shared one
    # prediction loss (eq. 10): soft CE summed over classes (paper) or averaged over them too (official)
    prediction_reduction: Literal["paper", "official"] = "paper"
    augmentation: bool = True       # task distillation on the augmented set when `augment.enabled` (Table 2 "w/o DA")
    intermediate_step: bool = True  # task-distillation step 1 (intermediate layers); off: step 2 (prediction) alone

    OBJECTIVES: ClassVar[dict[str, float]] = {"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0}
    TASK_DISTILLS: ClassVar[bool] = True
    TASK_LAYER_WISE: ClassVar[bool] = True
    #: ``teacher_layers: auto``: the teacher layers the layer map aligns the student's with (uniform, 6 -> 3: 1, 3, 5;
    #: 6 -> 4: 1, 2, 4, 5), so step 1 starts each student layer from the layer it is to imitate (scores of the
    #: alternatives: docs/results.md)
    TEACHER_LAYERS: ClassVar[str] = "mapped"
    #: the cut of a distilled twin goes through step 2 again, from the teacher (scores: docs/results.md)
    CUT_TRAINING: ClassVar[str] = "prediction"
    OPTIONS: ClassVar[tuple[str, ...]] = ("teacher_train_mode", "official_attention_masking", "per_layer_projection",
                                          "prediction_reduction")

    def ablations(self) -> dict[str, tuple[str, Recipe]]:
        """Tables 2-3: without general distillation (when it has one), data augmentation, step 1, the attention loss."""
        out = {} if not self.runs_general else {
            "no-gd": ("w/o GD", self.model_copy(update={"general_distillation": False}))}
        out["no-da"] = ("w/o DA", self.model_copy(update={"augmentation": False}))
        out["no-step1"] = ("w/o task step 1", self.model_copy(update={"intermediate_step": False}))
        out["no-attn"] = ("w/o Attn", self.model_copy(
            update={"objectives": {**dict(self.weights.weights), "attention_loss": 0.0}}))
        return out

    def loss_options(self):
        from distillery.objectives.registry import LossOptions

        return LossOptions(official_attention_masking=self.official_attention_masking,
                           prediction_reduction=self.prediction_reduction)

    def map_layers(self, n_student: int, n_teacher: int):
        from distillery.layer_map import build_layer_map

        return build_layer_map(self.layer_map, n_student, n_teacher)

    def layer_wise_spec(self, n_student: int, n_teacher: int, projection=None):
        return super().layer_wise_spec(n_student, n_teacher, projection).with_(
            per_layer_projection=self.per_layer_projection)

    def check(self, teacher: Dims, key: str) -> None:
        from distillery.layer_map import LayerMapError, build_layer_map, validate_layer_map

        super().check(teacher, key)
        if self.task_distillation:
            raise RecipeError(f"{key}.task_distillation: the tinybert recipe's step 2 is prediction-layer distillation "
                              "already (on the augmented set); the extra step is for the recipes that fine-tune or "
                              "distil without it (minilm, distilbert, mobilebert, pkd)")
        s = student_dims(self, teacher, key)
        try:
            lm = build_layer_map(self.layer_map, s.layers, teacher.layers)
            validate_layer_map(lm, s.layers, teacher.layers, s.heads, teacher.heads,
                               head_wise="attention_loss" in self.weights.active())
        except LayerMapError as exc:
            raise RecipeError(f"{key}.layer_map: {exc}") from None

    def plan(self, teacher: Dims, sections):
        """Step 1 (intermediate layers on the augmented set, continuing the general student's projection), then
        step 2 (prediction layer over the grid; teacher logits computed once and reused by every run)."""
        from distillery.training.plan import Plan

        start = student_start(self)
        if not self.intermediate_step:  # step 2 alone, from where the task stage starts
            return Plan((predict(self, start, sections, augmented=self.augmentation),))
        return Plan((intermediate(self, start, teacher, augmented=self.augmentation, projection=True),
                     predict(self, after("intermediate"), sections, augmented=self.augmentation)),
                    curve="intermediate")
