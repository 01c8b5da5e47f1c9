"""Layer maps (TinyBERT Sec. 3.1 / 4.4; MiniLM last-layer)."""

import pytest

from distillery.layer_map import LayerMap, LayerMapError, build_layer_map, validate_layer_map


def test_uniform_tinybert4_of_bert_base_matches_official_map():
    lm = build_layer_map("uniform", 4, 12)
    assert lm.attention == ((0, 2), (1, 5), (2, 8), (3, 11))
    assert lm.hidden == ((0, 0), (1, 3), (2, 6), (3, 9), (4, 12))


def test_uniform_six_of_twelve_and_without_embedding():
    lm = build_layer_map("uniform", 6, 12, embedding=False)
    assert lm.teacher_layers == (1, 3, 5, 7, 9, 11)
    assert lm.hidden == tuple((i, 2 * i) for i in range(1, 7))


def test_uniform_non_divisible_rounds_and_keeps_last_on_last():
    lm = build_layer_map("uniform", 4, 6)
    assert lm.teacher_states == (0, 2, 3, 5, 6)
    assert lm.teacher_layers == (1, 2, 4, 5)
    assert lm.attention[-1] == (3, 5)


def test_top_and_bottom():
    top = build_layer_map("top", 4, 12)
    assert top.attention == ((0, 8), (1, 9), (2, 10), (3, 11))
    assert top.hidden == ((0, 0), (1, 9), (2, 10), (3, 11), (4, 12))
    bottom = build_layer_map("bottom", 4, 12)
    assert bottom.attention == ((0, 0), (1, 1), (2, 2), (3, 3))
    assert bottom.hidden == tuple((i, i) for i in range(5))


def test_last_is_minilm():
    lm = build_layer_map("last", 6, 12)
    assert lm.attention == ((5, 11),)
    assert lm.hidden == ()


def test_explicit_pairs_and_lists():
    lm = build_layer_map("explicit", 2, 4, explicit={"attention": [[0, 1], [1, 3]], "hidden": [0, 2, 4]})
    assert lm.attention == ((0, 1), (1, 3))
    assert lm.hidden == ((0, 0), (1, 2), (2, 4))
    assert LayerMap(**{k: tuple(map(tuple, v)) for k, v in lm.to_dict().items()}) == lm


@pytest.mark.parametrize(
    "args, kwargs, needle",
    [
        (("uniform", 6, 4), {}, "more layers"),
        (("explicit", 6, 4), {"explicit": {"attention": [[0, 1]]}}, "more layers"),
        (("explicit", 2, 4), {"explicit": {"attention": [[0, 4]]}}, "teacher layer 4 out of range"),
        (("explicit", 2, 4), {"explicit": {"attention": [[2, 1]]}}, "student layer 2 out of range"),
        (("explicit", 2, 4), {"explicit": {"hidden": [[0, 5]]}}, "teacher state 5 out of range"),
        (("explicit", 2, 4), {"explicit": {"attention": [[0, 1], [0, 3]]}}, "duplicate student attention-layer"),
        (("explicit", 2, 4), {"explicit": {"hidden": [[1, 2], [2, 2]]}}, "duplicate teacher hidden-state"),
        (("explicit", 2, 4), {"explicit": {"atention": [[0, 1]]}}, "unknown key"),
        (("explicit", 2, 4), {"explicit": {"attention": [[0, "a"]]}}, r"'attention'\[0\]"),
        (("explicit", 2, 4), {}, "needs an explicit dict"),
        (("sideways", 2, 4), {}, "unknown layer map kind"),
        (("uniform", 0, 4), {}, "n_student"),
    ],
)
def test_impossible_maps_raise(args, kwargs, needle):
    with pytest.raises(LayerMapError, match=needle):
        build_layer_map(*args, **kwargs)


def test_head_mismatch_only_matters_for_head_wise_losses():
    lm = build_layer_map("uniform", 4, 12)
    validate_layer_map(lm, 4, 12, student_heads=4, teacher_heads=12)  # fine: not head-wise
    with pytest.raises(LayerMapError, match="4 heads.*12"):
        validate_layer_map(lm, 4, 12, student_heads=4, teacher_heads=12, head_wise=True)
    validate_layer_map(lm, 4, 12, student_heads=12, teacher_heads=12, head_wise=True)


def test_layer_map_error_is_value_error():
    assert issubclass(LayerMapError, ValueError)
