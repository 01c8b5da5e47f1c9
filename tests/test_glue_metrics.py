import math

import numpy as np
import pytest

from distillery.glue import compute_metrics, main_score

# Hand-computed: preds/labels below give TP=2 (i0, i3), TN=1 (i1), FP=1 (i2), FN=1 (i4).
PRED = [1, 0, 1, 1, 0]
GOLD = [1, 0, 0, 1, 1]
ACC = 3 / 5
F1 = 2 / 3  # precision 2/3, recall 2/3
MCC = (2 * 1 - 1 * 1) / math.sqrt((2 + 1) * (2 + 1) * (1 + 1) * (1 + 1))  # = 1/6


def test_accuracy_f1_mrpc_and_main_score():
    m = compute_metrics("mrpc", PRED, GOLD)
    assert set(m) == {"accuracy", "f1"}
    assert m["accuracy"] == pytest.approx(ACC)
    assert m["f1"] == pytest.approx(F1)
    assert main_score("mrpc", m) == pytest.approx((ACC + F1) / 2)
    assert main_score("mrpc", m, selection="accuracy") == pytest.approx(ACC)
    assert main_score("qqp", compute_metrics("qqp", PRED, GOLD)) == pytest.approx((ACC + F1) / 2)
    with pytest.raises(ValueError):
        main_score("mrpc", m, selection="f1")


def test_f1_positive_label_is_one():
    # Swapping the classes changes F1 (TP=1, FP=1, FN=1 for class 0 -> 1/2), so class 1 must be positive.
    m = compute_metrics("mrpc", [1 - p for p in PRED], [1 - g for g in GOLD])
    assert m["f1"] == pytest.approx(0.5)


def test_mcc_cola():
    m = compute_metrics("cola", PRED, GOLD)
    assert set(m) == {"mcc"}
    assert m["mcc"] == pytest.approx(1 / 6)
    assert MCC == pytest.approx(1 / 6)
    assert main_score("cola", m) == pytest.approx(1 / 6)


def test_accuracy_from_logits_three_classes():
    logits = np.array([[3.0, 0.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 1.0], [5.0, 1.0, 0.0]])
    m = compute_metrics("mnli", logits, [0, 1, 1, 2])  # argmax 0,1,2,0 -> 2 of 4 right
    assert m == {"accuracy": pytest.approx(0.5)}
    assert main_score("mnli", m) == pytest.approx(0.5)
    assert main_score("rte", compute_metrics("rte", [0, 1, 1], [0, 1, 0])) == pytest.approx(2 / 3)


def test_pearson_spearman_stsb():
    pred = [1.0, 2.0, 3.0, 10.0]
    gold = [1.0, 3.0, 2.0, 4.0]
    # Pearson: deviations (-3,-2,-1,6) and (-1.5,.5,-.5,1.5): cov 13, var 50 and 5 -> 13/sqrt(250).
    # Spearman: ranks (1,2,3,4) vs (1,3,2,4): Pearson of ranks = 4/5.
    m = compute_metrics("stsb", np.array(pred)[:, None], gold)
    assert set(m) == {"pearson", "spearman"}
    assert m["pearson"] == pytest.approx(13 / math.sqrt(250))
    assert m["spearman"] == pytest.approx(0.8)
    assert main_score("stsb", m) == pytest.approx((13 / math.sqrt(250) + 0.8) / 2)


def test_constant_prediction_correlation_is_zero_not_nan():
    m = compute_metrics("stsb", [2.0, 2.0, 2.0], [1.0, 2.0, 3.0])
    assert m == {"pearson": 0.0, "spearman": 0.0}


def test_bad_inputs():
    with pytest.raises(ValueError, match="unlabeled"):
        compute_metrics("sst2", [0, 1], [0, -1])
    with pytest.raises(ValueError, match="shape"):
        compute_metrics("sst2", [0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="classes"):
        compute_metrics("sst2", np.zeros((2, 3)), [0, 1])
    with pytest.raises(ValueError, match="unlabeled rows"):
        compute_metrics("stsb", [1.0, 2.0], [math.nan, 2.0])
    with pytest.raises(KeyError, match="f1"):
        main_score("mrpc", {"accuracy": 0.5})


def test_trivial_baseline_is_the_training_majority_class():
    from distillery.glue import trivial_baseline

    # majority of the training labels is 1; dev has 3 of 5 positives -> accuracy 0.6, MCC 0 (a constant)
    m = trivial_baseline("cola", [1, 1, 0, 1], [1, 0, 1, 0, 1])
    assert m == {"mcc": 0.0}
    m = trivial_baseline("sst2", [0, 0, 1], [1, 0, 1, 0, 0])
    assert m["accuracy"] == pytest.approx(0.6)


def test_trivial_baseline_for_regression_is_a_constant_with_zero_correlation():
    from distillery.glue import trivial_baseline

    assert trivial_baseline("stsb", [1.0, 3.0], [0.5, 4.0, 2.0]) == {"pearson": 0.0, "spearman": 0.0}


def test_trivial_baseline_needs_training_labels():
    from distillery.glue import trivial_baseline

    with pytest.raises(ValueError, match="no training labels"):
        trivial_baseline("sst2", [], [0, 1])
