"""A registered student as an MLflow pyfunc model (MLflow "models from code": this file is logged with the model
and run when it is loaded, so it imports nothing from this project).

    model = mlflow.pyfunc.load_model("models:/<student>-<task>@champion")
    model.predict(["a sentence", ...])                                           # single-sentence tasks
    model.predict(pd.DataFrame({"text": ["premise"], "text_pair": ["hypothesis"]}))  # pair tasks: both are used

Classification answers a DataFrame with `label` (the task's label names) and `score` (its probability);
regression (STS-B) answers `score`, the raw predicted similarity, as a float. The model configuration
(`labels`, `regression`, `pair`, `max_length`, `form`) is the logged `model_config`. `form` is the deployed form the
model runs in: `fp32` (PyTorch), `bf16` (PyTorch under bf16 autocast) or `int8` (the int8 ONNX export, artifact
`onnx`, on ONNX Runtime; the `model` artifact then holds the tokenizer and config without weights).
"""

from __future__ import annotations

import inspect

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class SequenceClassifier(PythonModel):
    """Tokenises (text[, text_pair]) as the student was trained and returns labels or scores."""

    def load_context(self, context) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        cfg = dict(context.model_config or {})
        path = context.artifacts["model"]
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.form = str(cfg.get("form", "fp32"))
        if self.form == "int8":
            import onnxruntime as ort

            opts = ort.SessionOptions()  # u8s8 products saturate on x86 CPUs without VNNI: u8u8 there instead
            opts.add_session_config_entry("session.x64quantprecision", "1")
            self.session = ort.InferenceSession(context.artifacts["onnx"], opts, providers=["CPUExecutionProvider"])
            self.accepts = {i.name for i in self.session.get_inputs()}
        else:
            self.model = AutoModelForSequenceClassification.from_pretrained(path).eval()
            self.accepts = set(inspect.signature(self.model.forward).parameters)
        self.labels = [str(label) for label in cfg.get("labels") or []]
        self.regression = bool(cfg.get("regression", False))
        self.pair = bool(cfg.get("pair", False))
        self.max_length = int(cfg.get("max_length", 128))
        self.batch_size = int(cfg.get("batch_size", 64))

    def _columns(self, model_input) -> tuple[list[str], list[str] | None]:
        df = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(
            [model_input] if isinstance(model_input, dict) and all(isinstance(v, str) for v in model_input.values())
            else model_input)
        cols = list(df.columns)
        if not cols:
            raise ValueError("no input column: give text (and text_pair for a sentence-pair task)")
        first = "text" if "text" in cols else cols[0]
        rest = [c for c in cols if c != first]
        second = "text_pair" if "text_pair" in cols else (rest[0] if rest and self.pair else None)
        if self.pair and second is None:
            raise ValueError("this model scores sentence pairs: give the columns text and text_pair")
        return _texts(df, first), _texts(df, second) if self.pair else None

    # the type hint tells MLflow the input is tabular (its signature is logged explicitly): no type-hint advice
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        import torch

        texts, pairs = self._columns(model_input)
        chunks = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(texts[i : i + self.batch_size],
                                     None if pairs is None else pairs[i : i + self.batch_size],
                                     truncation=True, max_length=self.max_length, padding=True, return_tensors="pt")
                chunks.append(self._logits({k: v for k, v in enc.items() if k in self.accepts}))
        n_out = 1 if self.regression else max(len(self.labels), 1)
        logits = torch.cat(chunks) if chunks else torch.zeros(0, n_out)
        if self.regression:
            return pd.DataFrame({"score": logits[:, 0].double().numpy()})
        probs = logits.softmax(-1)
        ids = probs.argmax(-1).tolist()
        labels = [self.labels[i] if i < len(self.labels) else str(i) for i in ids]
        return pd.DataFrame({"label": labels, "score": probs.max(-1).values.double().numpy()})

    def _logits(self, enc):
        import torch

        if self.form == "int8":
            feeds = {n: enc[n].numpy() if n in enc else torch.zeros_like(enc["input_ids"]).numpy()
                     for n in self.accepts}
            return torch.from_numpy(self.session.run(None, feeds)[0]).float()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.form == "bf16"):
            return self.model(**enc).logits.float()


def _texts(df: pd.DataFrame, column: str) -> list[str]:
    """The column's values, each a string: a missing one (None, NaN) is refused, never scored as an empty text."""
    values = df[column].tolist()
    if bad := next(((i, v) for i, v in enumerate(values) if not isinstance(v, str)), None):
        raise ValueError(f"row {bad[0]}: {column} is {bad[1]!r}, not a text (a missing one, None or NaN, is refused: "
                         "give \"\" for an empty text)")
    return values


mlflow.models.set_model(SequenceClassifier())
