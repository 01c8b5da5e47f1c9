"""A registered span student (SQuAD) as an MLflow pyfunc model (MLflow "models from code": this file is logged with the
model and run when it is loaded). The library's SQuAD windows and answer extraction (`distillery.squad.features`,
`distillery.squad.postprocess`) travel with the model (`code_paths`), so it answers as the evaluate stage scored it.

    model = mlflow.pyfunc.load_model("models:/<student>-squad@champion")
    model.predict(pd.DataFrame({"question": ["who wrote it?"], "context": ["It was written by Ann in 1990."]}))

answers one row per question: `answer` (the text, taken from the context; "" = no answer, SQuAD v2.0 only), `score`
(its probability among the n-best candidates), `start` / `end` (its character offsets in the context, end
exclusive). The model configuration (`version`, `max_length`, `doc_stride`, `max_query_length`, `null_threshold`)
is the logged `model_config`; for SQuAD v2.0 `null_threshold` is the student's dev best-F1 threshold (the official
evaluation's `best_f1_thresh`), so a served question gets "" when its null odds exceed it, as BERT's tuned
`null_score_diff_threshold`.
"""

from __future__ import annotations

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class SpanReader(PythonModel):
    """Windows (question, context) as the student was trained and extracts each question's best answer span."""

    def load_context(self, context) -> None:
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        from distillery.squad.features import FeatureConfig

        cfg = dict(context.model_config or {})
        path = context.artifacts["model"]
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForQuestionAnswering.from_pretrained(path).eval()
        self.features = FeatureConfig(max_length=int(cfg.get("max_length", 384)),
                                      doc_stride=int(cfg.get("doc_stride", 128)),
                                      max_query_length=int(cfg.get("max_query_length", 64)))
        self.version = str(cfg.get("version", "1.1"))
        self.null_threshold = float(cfg.get("null_threshold", 0.0))
        self.batch_size = int(cfg.get("batch_size", 32))

    def _rows(self, model_input) -> pd.DataFrame:
        df = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(
            [model_input] if isinstance(model_input, dict) and all(isinstance(v, str) for v in model_input.values())
            else model_input)
        missing = [c for c in ("question", "context") if c not in df.columns]
        if missing:
            raise ValueError(f"missing column(s) {missing}: give question and context")
        for i, (q, c) in enumerate(zip(df["question"], df["context"])):
            if not isinstance(c, str) or not c.strip():
                raise ValueError(f"row {i}: the question {q!r} has no context")
            if not isinstance(q, str) or not q.strip():
                raise ValueError(f"row {i}: empty question")
        return df

    # the type hint tells MLflow the input is tabular (its signature is logged explicitly): no type-hint advice
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        import datasets

        from distillery.squad.evaluate import predict_span_logits
        from distillery.squad.features import eval_features
        from distillery.squad.postprocess import postprocess

        df = self._rows(model_input)
        if df.empty:
            return pd.DataFrame({"answer": [], "score": [], "start": [], "end": []})
        ids = [str(i) for i in range(len(df))]
        questions = {"id": ids, "question": df["question"].tolist(), "context": df["context"].tolist()}
        features = eval_features(questions, self.tokenizer, self.features)
        logits = predict_span_logits(self.model, self.tokenizer, datasets.Dataset.from_dict(features),
                                     batch_size=self.batch_size)
        answers = postprocess(questions, features, logits[:, 0], logits[:, 1], version=self.version,
                              null_threshold=self.null_threshold)
        chosen = [answers[i] for i in ids]
        return pd.DataFrame({"answer": [a.text for a in chosen], "score": [float(a.score) for a in chosen],
                             "start": [int(a.start) for a in chosen], "end": [int(a.end) for a in chosen]})


mlflow.models.set_model(SpanReader())
