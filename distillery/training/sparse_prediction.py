"""Masked-LM training that predicts only the masked positions, as ModernBERT's "sparse prediction" does.

A masked LM's loss reads its vocabulary logits at the ~15% of positions that carry a label (the collator's -100
elsewhere), yet transformers' ``*ForMaskedLM`` runs its prediction head (a dense layer, GELU, LayerNorm and the
decoder to every word of the vocabulary) on every position, and its cross-entropy's softmax over (positions, vocabulary)
logits: with all-MiniLM-L6-v2's 30,522 words the head is as costly as the six layers below it. The head is
position-wise and the cross-entropy a mean over the labelled positions, so the head on the labelled positions alone
gives the same loss (`used`): the same products of the same operands, in another order of summation, to float rounding
(tests/test_sparse_prediction.py holds loss and gradients to the full head's in float64). Only a training forward with
labels changes; evaluation and inference get every position's logits as before.

`distillery.training.trainer` enters it for every model it trains directly (MLM pre-training, the IB teacher's
continued MLM); a Distiller's student is left as it is, since its objectives read its logits.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.modeling_outputs import MaskedLMOutput

#: model types whose ``*ForMaskedLM`` is ``head(base_model(...)[0])`` with a mean cross-entropy over the labels, and
#: the attribute of that head
HEADS = {"bert": "cls", "roberta": "lm_head", "xlm-roberta": "lm_head", "camembert": "lm_head", "mobilebert": "cls"}
#: the label the collator gives a position the loss does not read
IGNORED = -100


def applies(model: nn.Module | None) -> bool:
    """Whether `model` is a ``*ForMaskedLM`` whose head `used` can run on its labelled positions alone."""
    config = getattr(model, "config", None)
    head = HEADS.get(getattr(config, "model_type", None))
    return (head is not None and type(model).__name__.endswith("ForMaskedLM") and isinstance(getattr(model, head, None),
            nn.Module) and getattr(model, "_compiled_call_impl", None) is None)


@contextmanager
def used(model: nn.Module | None) -> Iterator[bool]:
    """Within the block, a training forward of `model` with labels runs its prediction head on the labelled positions
    only: hooks (which Accelerate's wrapping of ``forward`` leaves in place) take the labels from the call, give the
    head the labelled positions' states and put the loss of their logits in the output (its ``logits`` then those
    positions', (labelled positions, vocabulary)). Every other forward is unchanged. Yields whether `applies`."""
    if not applies(model):
        yield False
        return
    held: list[Tensor] = []  # the labels of the forward in progress

    def take(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        held.clear()
        labels = kwargs.get("labels")
        if not model.training or labels is None or args or kwargs.get("return_dict") is False:
            return None
        held.append(labels)
        return args, {k: v for k, v in kwargs.items() if k != "labels"}

    def gather(_module: nn.Module, args: tuple) -> tuple | None:
        return (args[0][held[0] != IGNORED], *args[1:]) if held else None

    def loss(_module: nn.Module, _args: tuple, _kwargs: dict, output: Any) -> Any:
        if not held:
            return None
        labels = held.pop()
        scores = output.logits
        exact = scores.to(torch.promote_types(scores.dtype, torch.float32))  # as autocast runs the cross-entropy
        return MaskedLMOutput(loss=F.cross_entropy(exact, labels[labels != IGNORED]), logits=scores,
                              hidden_states=output.hidden_states, attentions=output.attentions)

    hooks = [model.register_forward_pre_hook(take, with_kwargs=True),
             getattr(model, HEADS[model.config.model_type]).register_forward_pre_hook(gather),
             model.register_forward_hook(loss, with_kwargs=True)]
    try:
        yield True
    finally:
        for hook in hooks:
            hook.remove()
