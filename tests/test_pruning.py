"""Width from the teacher (issue 41, item 1): structured pruning of heads, FFN neurons and hidden channels by
activation importance (Minitron), checked against the teacher itself in float64."""

from __future__ import annotations

import pytest
import torch
import transformers

from distillery.pruning import PruningError, measure_importance, prune_teacher


def teacher(head=transformers.BertForSequenceClassification, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, num_labels=3)
    return head(cfg).double().eval()


def batches(n: int = 3, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 60, (4, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[0, 8:] = 0  # a padded row: its pads are not measured
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)})
    return out


def test_keeping_every_head_neuron_and_channel_is_the_teacher():
    t = teacher()
    imp = measure_importance(t, batches(), [0, 1, 2])
    s = prune_teacher(t, [0, 1, 2], hidden=32, heads=4, intermediate=64, importance=imp)
    b = batches(1, seed=5)[0]
    with torch.no_grad():
        assert torch.allclose(s(**b).logits, t(**b).logits, atol=1e-12, rtol=0)


def test_pruned_heads_and_neurons_are_the_teacher_without_them():
    """Keep every channel and head (a head cannot go without its channels: hidden = heads x head size), drop half
    the neurons and a layer: the student equals the teacher whose dropped neurons' activations are zeroed and whose
    skipped layer passes its input through (float64). With heads and channels pruned too, every matrix is the
    teacher's rows and columns of the kept heads, neurons and channels."""
    t = teacher()
    imp = measure_importance(t, batches(), [0, 2])
    s = prune_teacher(t, [0, 2], hidden=32, heads=4, intermediate=32, importance=imp)
    s2 = prune_teacher(t, [0, 2], hidden=16, heads=2, intermediate=32, importance=imp)
    assert s2.config.hidden_size == 16 and s2.config.num_attention_heads == 2 and s2.config.num_hidden_layers == 2
    ch = torch.sort(torch.topk(imp.channels, 16).indices).values
    kept = torch.sort(torch.topk(imp.heads[2], 2).indices).values
    dims = (kept[:, None] * 8 + torch.arange(8)).reshape(-1)
    neurons = torch.sort(torch.topk(imp.neurons[2], 32).indices).values
    theirs, ours = t.bert.encoder.layer[2], s2.bert.encoder.layer[1]
    assert torch.equal(ours.attention.self.key.weight, theirs.attention.self.key.weight[dims][:, ch])
    assert torch.equal(ours.attention.output.dense.weight, theirs.attention.output.dense.weight[ch][:, dims])
    assert torch.equal(ours.output.dense.weight, theirs.output.dense.weight[ch][:, neurons])
    assert torch.equal(s2.bert.embeddings.word_embeddings.weight, t.bert.embeddings.word_embeddings.weight[:, ch])
    assert torch.equal(s2.classifier.weight, t.classifier.weight[:, ch])
    keep_n = {t_i: torch.sort(torch.topk(imp.neurons[t_i], 32).indices).values for t_i in (0, 2)}
    hooks = []
    for t_i in (0, 2):
        mask = torch.zeros(64, dtype=torch.float64)
        mask[keep_n[t_i]] = 1
        hooks.append(t.bert.encoder.layer[t_i].intermediate.register_forward_hook(
            lambda _m, _i, out, mask=mask: out * mask))
    # the skipped teacher layer 1: the student's layers are the teacher's 0 and 2, in order
    layer1 = t.bert.encoder.layer[1]
    hooks.append(layer1.register_forward_hook(lambda _m, inp, out: (inp[0],) + tuple(out[1:])
                                              if isinstance(out, tuple) else inp[0]))
    b = batches(1, seed=7)[0]
    try:
        with torch.no_grad():
            expected = t(**b).logits
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        assert torch.allclose(s(**b).logits, expected, atol=1e-10, rtol=0)


def test_importance_ranks_a_planted_head_neuron_and_channel_first():
    t = teacher()
    with torch.no_grad():
        layer = t.bert.encoder.layer[1]
        layer.attention.self.value.weight[16:24] *= 50  # head 2 of layer 1 writes a large context
        layer.intermediate.dense.weight[7] *= 50         # neuron 7 fires hard
        t.bert.embeddings.LayerNorm.weight[5] = 40.0      # channel 5 is large after the embedding LayerNorm
    imp = measure_importance(t, batches(), [1])
    assert int(imp.heads[1].argmax()) == 2 and int(imp.neurons[1].argmax()) == 7
    assert int(imp.channels.argmax()) == 5
    s = prune_teacher(t, [1], hidden=8, heads=1, intermediate=4, importance=imp)
    assert torch.equal(s.bert.encoder.layer[0].attention.self.value.bias,
                       t.bert.encoder.layer[1].attention.self.value.bias[16:24])


def test_another_head_and_bad_shapes():
    t = teacher()
    imp = measure_importance(t, batches(), [0, 1])
    base = prune_teacher(t, [0, 1], hidden=16, heads=2, intermediate=32, importance=imp, head="base")
    assert isinstance(base, transformers.BertModel) and base.config.hidden_size == 16
    qa = prune_teacher(teacher(transformers.BertForQuestionAnswering), [0, 1], hidden=16, heads=2, intermediate=32,
                       importance=imp)
    assert qa.qa_outputs.weight.shape[1] == 16 and qa.config.num_hidden_layers == 2
    with pytest.raises(PruningError, match="head size 8"):
        prune_teacher(t, [0, 1], hidden=16, heads=4, intermediate=32, importance=imp)
    with pytest.raises(PruningError, match="cuts widths down"):
        prune_teacher(t, [0, 1], hidden=64, heads=8, intermediate=32, importance=imp)


def test_a_recipe_starts_its_student_pruned_from_the_teacher(tmp_path):
    """`init: {pruned: {teacher_layers: [0, 2]}}` of any recipe: the student of its shape, cut from the teacher on
    the rows it is given; checked against the teacher's dims before any work."""
    import datasets

    from distillery.recipes import RECIPES, RecipeError, TinyBertRecipe
    from distillery.shape import Dims

    t = teacher()
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(55)]) + "\n")
    tok = transformers.BertTokenizerFast(vocab_file=str(vocab))
    rows = datasets.Dataset.from_dict({"input_ids": [[2, 7, 9, 11, 3], [2, 8, 3]], "labels": [0, 1]})
    recipe = TinyBertRecipe(shape={"layers": 2, "hidden": 16, "heads": 2, "intermediate": 32},
                            init={"pruned": {"teacher_layers": [0, 2], "samples": 2}},
                            objectives={"attention_loss": 0.0, "hidden_loss": 1.0, "embedding_loss": 1.0})  # fewer heads
    dims = Dims.of_config(t.config)
    recipe.check(dims, "students.s")
    student = recipe.start_student(t, tok, head="sequence-classification", data=rows, num_labels=3)
    assert isinstance(student, transformers.BertForSequenceClassification)
    assert (student.config.num_hidden_layers, student.config.hidden_size, student.config.num_attention_heads) == (2, 16, 2)
    with pytest.raises(RecipeError, match="keeps its head size 8"):
        TinyBertRecipe(shape={"layers": 2, "hidden": 16, "heads": 4, "intermediate": 32},
                       init="pruned").check(dims, "students.s")
    with pytest.raises(RecipeError, match="this stage gave none"):
        recipe.start_student(t, tok, head="base")
    assert RECIPES["pkd"](shape={"layers": 2, "hidden": 32, "heads": 4, "intermediate": 32},
                     init="pruned").init.kind == "pruned"


def test_a_pruned_students_projection_starts_as_the_selection_of_its_channels():
    """TinyBERT's W_h for a student pruned from the teacher starts as the selection of its kept channels (CoFi's
    identity start): kept channel j lands on teacher channel kept[j], the others on zero. Nothing pruned: W_h is
    the identity and the hidden loss starts at 0 (float64); pruned: it starts below a fresh W_h's."""
    from distillery.models import num_layers
    from distillery.objectives.tinybert import HiddenProjection, hidden_loss
    from distillery.recipes import TinyBertRecipe
    from distillery.training.plan import kept_channel_projection

    def projection(recipe, student, teacher):  # what task step 1 continues from (`steps.intermediate`)
        spec = recipe.layer_wise_spec(num_layers(student), num_layers(teacher))
        return kept_channel_projection(student, teacher, spec)

    t = teacher()
    imp = measure_importance(t, batches(), [0, 1, 2])
    b = batches(1, seed=5)[0]

    def start_loss(student, proj):
        with torch.no_grad():
            hs = student(**b, output_hidden_states=True).hidden_states
            ht = t(**b, output_hidden_states=True).hidden_states
            n = len(hs) - 1
            pairs = [(i, i * (len(ht) - 1) // n) for i in range(n + 1)]
            return float(hidden_loss([hs[i] for i, _ in pairs], [ht[j] for _, j in pairs], proj,
                                     attention_mask=b["attention_mask"]))

    recipe = TinyBertRecipe(shape={"layers": 3, "hidden": 16, "heads": 2, "intermediate": 32}, init="pruned",
                            objectives={"attention_loss": 0.0, "hidden_loss": 1.0, "embedding_loss": 1.0})
    same = prune_teacher(t, [0, 1, 2], hidden=32, heads=4, intermediate=64, importance=imp)
    identity = projection(recipe, same, t).double()
    assert torch.equal(identity.layers[0].weight, torch.eye(32, dtype=torch.float64))
    assert start_loss(same, identity) == 0.0

    narrow = prune_teacher(t, [0, 1, 2], hidden=16, heads=2, intermediate=32, importance=imp)
    kept = narrow.kept_channels
    proj = projection(recipe, narrow, t).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    y = proj(x)
    assert torch.equal(y[..., kept], x)
    assert not y[..., [c for c in range(32) if c not in set(kept.tolist())]].any()
    torch.manual_seed(0)
    fresh = HiddenProjection(16, 32).double()
    assert start_loss(narrow, proj) < start_loss(narrow, fresh)
    assert projection(recipe, t, t) is None  # a student not pruned: a fresh W_h
    per_layer = projection(TinyBertRecipe(shape={"layers": 3, "hidden": 16, "heads": 2, "intermediate": 32},
                                          init="pruned", per_layer_projection=True), narrow, t)
    assert per_layer.n_states == 4 and all(torch.equal(m.weight, proj.layers[0].weight.float()) for m in per_layer.layers)
    with pytest.raises(ValueError, match="distinct teacher channels"):
        HiddenProjection.selecting(torch.tensor([0, 0]), 32)
