"""TinyBERT data augmentation (Jiao et al. 2020, Algorithm 1): MLM + GloVe word replacement.

`Augmenter` runs the algorithm (faithful batched path, per-position reference, opt-in fast mode);
`augment_dataset` / `augment_file` stream an augmented TSV; `load_word_vectors` reads GloVe.
"""

from distillery.augment.algorithm import (
    DEFAULT_N_AUG, TASK_N_AUG, AugmentConfig, Augmenter, SentenceAnalysis, default_n_aug, sample_variants,
    sentence_rng,
)
from distillery.augment.dataset import augment_dataset, augment_file
from distillery.augment.fast import candidate_overlap
from distillery.augment.glove import WordVectors, WordVectorsFormatError, load_word_vectors
from distillery.augment.io import read_augmented, write_augmented
from distillery.augment.mlm import MaskedCopy, MaskedLM, build_masked_input, load_masked_lm
from distillery.augment.stopwords import STOPWORDS, is_eligible

__all__ = [
    "DEFAULT_N_AUG", "TASK_N_AUG", "AugmentConfig", "Augmenter", "SentenceAnalysis", "default_n_aug",
    "sample_variants", "sentence_rng", "augment_dataset", "augment_file", "candidate_overlap", "WordVectors",
    "WordVectorsFormatError", "load_word_vectors", "read_augmented", "write_augmented", "MaskedCopy",
    "MaskedLM", "build_masked_input", "load_masked_lm", "STOPWORDS", "is_eligible",
]
