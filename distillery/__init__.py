"""distillery: BERT distillation (TinyBERT, MiniLM, MobileBERT, DistilBERT) in pure PyTorch + transformers.

The library never imports Prefect, DVC or MLflow; those live in `tasks/` and `flows/`.
"""

__version__ = "0.1.0"
