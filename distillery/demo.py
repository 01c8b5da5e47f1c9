"""The offline demo: a generated, learnable sentiment task and a generated general corpus.

Both come from one small English grammar with a fixed seed, so a fresh machine with no network can run
every stage of the pipeline on real (if small) models. The task is learnable but not trivial: the label is
the polarity of the evaluative word, flipped by negation ("not", "never", "hardly"), with distractor
clauses that carry no polarity, so a bag-of-words model cannot reach 100%.

Files are written in the GLUE SST-2 layout (`sentence\tlabel`; test: `index\tsentence`) so the GLUE
loader reads them like any other task.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from distillery.io import atomic_path

POSITIVE = (
    "good great wonderful excellent delightful charming brilliant superb lovely moving gripping "
    "beautiful clever funny inspiring remarkable enjoyable splendid marvelous touching"
).split()
NEGATIVE = (
    "bad awful terrible dull boring tedious clumsy bland dreadful lifeless painful weak "
    "forgettable mediocre tiresome disappointing shallow sloppy pointless ugly"
).split()
NEGATIONS = ["not", "never", "hardly", "not at all"]
INTENSIFIERS = ["very", "really", "quite", "truly", "rather", "so", "remarkably", "fairly"]
SUBJECTS = (
    "the film the movie the story the plot the acting the script the cast the ending the music "
    "the director the soundtrack the dialogue the performance the picture the sequel the premise"
).split(" ")
SUBJECTS = [" ".join(SUBJECTS[i : i + 2]) for i in range(0, len(SUBJECTS), 2)]
VERBS = ["is", "was", "seems", "felt", "looks", "remains", "became", "sounds"]
DISTRACTORS = [
    "although it runs long",
    "even with a small budget",
    "from start to finish",
    "in the second half",
    "for most of its length",
    "despite the rain outside",
    "according to my friend",
    "as the critics said",
    "on a quiet sunday",
    "for a family audience",
]
NEUTRAL = [
    "the theatre opened at seven in the evening",
    "we bought tickets at the station",
    "the city council met on tuesday",
    "my brother works at the old library",
    "the river runs past the northern hills",
    "a small train stops near the market",
    "the museum keeps paintings from the last century",
    "children played in the park after school",
    "the bakery sells bread every morning",
    "the author wrote three books about the sea",
    "the road to the village was closed for repairs",
    "she studied music and history at the university",
    "the weather changed quickly in the afternoon",
    "a farmer sold apples and pears at the fair",
    "the captain steered the ship into the harbour",
]


CONCESSIONS = ["although", "even though", "while"]


def _clause(rng: random.Random) -> tuple[str, int]:
    """`subject verb [negation] [intensifier] word` and its value (the word's polarity, flipped by a negation)."""
    positive = rng.random() < 0.5
    negated = rng.random() < 0.3
    parts = [rng.choice(SUBJECTS), rng.choice(VERBS)] + ([rng.choice(NEGATIONS)] if negated else [])
    parts += ([rng.choice(INTENSIFIERS)] if rng.random() < 0.5 else []) + [rng.choice(POSITIVE if positive else NEGATIVE)]
    return " ".join(parts), int(positive != negated)


def _contrast(rng: random.Random) -> tuple[str, int]:
    """Two clauses of opposite value; the main one decides: `A, but B` and `although A, B` -> B; `B, although A` ->
    B. Which clause counts depends on the connective and its place, not on the words: a bag of words cannot tell."""
    while True:
        (a, va), (b, vb) = _clause(rng), _clause(rng)
        if va != vb:
            break
    form = rng.randrange(3)
    concession = rng.choice(CONCESSIONS)
    text = (f"{a}, but {b}", f"{concession} {a}, {b}", f"{b}, {concession} {a}")[form]
    return text, vb


def _sentence(rng: random.Random, contrast: float = 0.0) -> tuple[str, int]:
    if contrast and rng.random() < contrast:
        return _contrast(rng)
    positive = rng.random() < 0.5
    word = rng.choice(POSITIVE if positive else NEGATIVE)
    negated = rng.random() < 0.3
    parts = [rng.choice(SUBJECTS), rng.choice(VERBS)]
    if negated:
        parts.append(rng.choice(NEGATIONS))
    if rng.random() < 0.5:
        parts.append(rng.choice(INTENSIFIERS))
    parts.append(word)
    if rng.random() < 0.4:
        clause = rng.choice(DISTRACTORS)
        parts = [clause + ","] + parts if rng.random() < 0.5 else parts + [clause]
    return " ".join(parts), int(positive != negated)


def make_demo_task(out_dir: str | Path, *, n_train: int, n_dev: int, n_test: int, seed: int = 42,
                   label_noise: float = 0.0, contrast: float = 0.0) -> Path:
    """Write `<out_dir>/{train,dev,test}.tsv` in the SST-2 layout; returns out_dir. `label_noise`: the rate at which
    training labels are flipped (drawn from a generator of their own: the sentences do not change with it);
    `contrast`: the share of sentences of two opposite clauses (`_contrast`)."""
    out_dir = Path(out_dir)
    rng = random.Random(seed)
    flips = random.Random(seed + 7)
    splits = {"train": n_train, "dev": n_dev, "test": n_test}
    for split, n in splits.items():
        with atomic_path(out_dir / f"{split}.tsv") as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar=None, lineterminator="\n")
            if split == "test":
                w.writerow(["index", "sentence"])
                for i in range(n):
                    w.writerow([i, _sentence(rng, contrast)[0]])
            else:
                w.writerow(["sentence", "label"])
                for _ in range(n):
                    text, label = _sentence(rng, contrast)
                    flip = split == "train" and flips.random() < label_noise
                    w.writerow([text, 1 - label if flip else label])
    return out_dir


def make_demo_corpus(path: str | Path, *, n_documents: int, seed: int = 42, contrast: float = 0.0) -> Path:
    """Write a raw-text corpus (paragraphs separated by blank lines) from the demo grammar (`contrast`: as the task's)."""
    rng = random.Random(seed + 1)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for _ in range(n_documents):
            sentences = []
            for _ in range(rng.randint(4, 10)):
                text = _sentence(rng, contrast)[0] if rng.random() < 0.6 else rng.choice(NEUTRAL)
                sentences.append(text[0].upper() + text[1:] + rng.choice([".", ".", ".", "!"]))
            f.write(" ".join(sentences) + "\n\n")
    return Path(path)
