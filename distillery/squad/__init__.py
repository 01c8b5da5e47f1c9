"""SQuAD v1.1 / v2.0 reading comprehension: data (official JSON files, the Hub, a by-article split), features
(windows of the context with answer positions or offsets), postprocessing (logits -> answer spans), and the official
evaluation, predictions files and the sentence baseline."""

from distillery.squad.data import (
    FEATURES, HUB_PATHS, SquadFile, SquadFileError, article_groups, gold_answers, load_hub, load_squad_file,
    load_squad_split, read_squad, split_by_article, squad_stats, to_dataset,
)
from distillery.squad.features import (
    FeatureConfig, eval_features, prepare_eval_features, prepare_train_features, train_features, truncate_questions,
)
from distillery.squad.metrics import (
    evaluate, evaluate_v1, evaluate_v2, exact_match, f1_score, find_best_thresh, normalize_answer, read_null_odds,
    read_predictions, sentence_baseline, split_sentences, write_predictions,
)
from distillery.squad.postprocess import Answer, null_odds, postprocess, prediction_texts

__all__ = [
    "FEATURES", "HUB_PATHS", "Answer", "FeatureConfig", "SquadFile", "SquadFileError", "article_groups",
    "eval_features", "evaluate", "evaluate_v1", "evaluate_v2", "exact_match", "f1_score", "find_best_thresh",
    "gold_answers", "load_hub", "load_squad_file", "load_squad_split", "normalize_answer", "null_odds",
    "postprocess", "prediction_texts", "prepare_eval_features", "prepare_train_features", "read_null_odds",
    "read_predictions", "read_squad", "sentence_baseline", "split_by_article", "split_sentences", "squad_stats",
    "to_dataset", "train_features", "truncate_questions", "write_predictions",
]
