"""MiniLM (Wang et al., 2020, Sec. 3): deep self-attention distillation of the last layer, student width free.

    [teacher assistant: L layers x d' (Sec. 3.3), distilled from the teacher with the same objectives]
    -> general distillation: KL of the last layer's attention distributions (eq. 6) + KL of its value relation
       softmax(V V^T / sqrt(d_k)) (eqs. 7-9), averaged over heads and query positions; or MiniLMv2's relation heads
       (``relation_kl``: Q-Q, K-K, V-V relations over ``relation_heads`` heads)
    -> fine-tuning on the task (the grid, gold labels)

CPU-budget options (the paper distils task-agnostically only): ``intermediate_step`` runs the same last-layer
objectives from the fine-tuned teacher on the task's training set before fine-tuning (TinyBERT's task step 1 with
MiniLM's losses); ``task_distillation`` adds the prediction-layer extra step after it (`Recipe.plan`).

The teacher assistant is used for M <= L/2 and d' <= d/2 (``teacher_assistant: auto``), always (``on``) or never
(``off``). No official training code exists; see ``reference/official-code.md``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from distillery.recipes.base import Recipe, RecipeError, StageContext, StudentStage
from distillery.recipes.checks import student_dims
from distillery.recipes.registry import register_recipe
from distillery.shape import Dims


@register_recipe
class MiniLMRecipe(Recipe):
    """MiniLM: last-layer attention and value-relation KL, an optional teacher assistant, then fine-tuning."""

    recipe: Literal["minilm"] = "minilm"
    relation_heads: int = Field(12, ge=1)         # MiniLMv2 relation heads (objective relation_kl)
    teacher_assistant: Literal["auto", "on", "off"] = "auto"  # Sec. 3.3

    OBJECTIVES: ClassVar[dict[str, float]] = {"attention_kl": 1.0, "value_relation_kl": 1.0, "relation_kl": 0.0}
    STUDENT_STAGES: ClassVar[dict[str, str]] = {"teacher_assistant": "assistant", "general_distillation": "general"}
    OPTIONS: ClassVar[tuple[str, ...]] = ("teacher_train_mode", "relation_heads")
    TASK_LAYER_WISE: ClassVar[bool] = True

    def loss_options(self):
        from distillery.objectives.registry import LossOptions

        return LossOptions(n_relation_heads=self.relation_heads)

    def map_layers(self, n_student: int, n_teacher: int):
        from distillery.layer_map import build_layer_map

        return build_layer_map("last", n_student, n_teacher)

    def assistant_dims(self, teacher: Dims, key: str = "student") -> Dims | None:
        """Sec. 3.3: for M <= L/2 and d' <= d/2 (``auto``) or always (``on``), an L-layer, d'-wide assistant with
        the student's heads and FFN size; None when no assistant is used."""
        if not self.runs_general or self.teacher_assistant == "off":
            return None
        s = student_dims(self, teacher, key)
        if self.teacher_assistant == "auto" and not (2 * s.layers <= teacher.layers and 2 * s.hidden <= teacher.hidden):
            return None
        return Dims(teacher.layers, s.hidden, s.heads, s.intermediate, teacher.vocab, "bert")

    def check(self, teacher: Dims, key: str) -> None:
        super().check(teacher, key)
        s = student_dims(self, teacher, key)
        ta = self.assistant_dims(teacher, key)
        names = set(self.weights.active())
        pairs = [("teacher", teacher, s)] if ta is None else [("teacher", teacher, ta), ("teacher assistant", ta, s)]
        if ta is not None and self.intermediate_step:  # step 1 distils from the fine-tuned teacher itself
            pairs.append(("teacher", teacher, s))
        for what, big, small in pairs:
            if {"attention_kl", "value_relation_kl"} & names and big.heads != small.heads:
                raise RecipeError(
                    f"{key}.objectives: attention_kl / value_relation_kl compare heads one by one: the student has "
                    f"{small.heads} heads, the {what} {big.heads} (use relation_kl with relation_heads)")
            if "relation_kl" in names:
                for who, d in (("student", small), (what, big)):
                    if d.hidden % self.relation_heads:
                        raise RecipeError(f"{key}.relation_heads: {self.relation_heads} relation heads do not divide "
                                          f"the {who}'s width {d.hidden}")

    def stages(self, teacher: Dims) -> dict[str, StudentStage]:
        first = {"teacher_assistant": StudentStage(self.assistant_stage)} if self.assistant_dims(teacher) else {}
        return {**first, **super().stages(teacher)}

    def assistant_stage(self, ctx: StageContext) -> dict[str, Any]:
        """The teacher assistant: an L-layer, d'-wide model distilled from the teacher with the student's
        objectives; the student's general distillation then reads it instead of the teacher."""
        from transformers import AutoModel, AutoTokenizer

        from distillery.models import build_student
        from distillery.recipes.base import corpus_dataset
        from distillery.training.distill import distill
        from distillery.training.spec import TrainRun

        tokenizer = AutoTokenizer.from_pretrained(ctx.teacher)
        teacher = AutoModel.from_pretrained(ctx.teacher)
        dims = self.assistant_dims(Dims.of_config(teacher.config))
        shape = {"layers": dims.layers, "hidden": dims.hidden, "heads": dims.heads, "intermediate": dims.intermediate}
        assistant = build_student(shape, len(tokenizer), head="base", base=teacher.config)
        train, n = corpus_dataset(ctx, tokenizer)
        distill(teacher, assistant, self.layer_wise_spec(dims.layers, dims.layers),
                TrainRun(ctx.out, train, tokenizer=tokenizer, args=ctx.args))
        return {"metrics": {"sequences": n, "layers": dims.layers, "hidden": dims.hidden}}
