"""The general corpus: raw text -> one sentence per line, blank line between documents.

This is the input format of TinyBERT's general distillation (and BERT's pre-training data). Sentence
splitting uses NLTK's Punkt *trained on the corpus itself* (unsupervised), so no downloaded NLTK data is
needed. Raw files may carry a UTF-8 BOM, CRLF line ends, Project Gutenberg headers/footers and
WikiText headings; all are handled.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np

from distillery.io import atomic_path

if TYPE_CHECKING:
    from nltk.tokenize.punkt import PunktSentenceTokenizer

_GUTENBERG_START = re.compile(r"^\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG", re.I)
_GUTENBERG_END = re.compile(r"^\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG", re.I)
_WIKI_HEADING = re.compile(r"^\s*=+ .* =+\s*$")


def read_documents(path: str | Path) -> Iterator[str]:
    """Yield paragraphs ("documents") of a raw text file, whitespace-normalised."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    lines = path.read_text(encoding="utf-8-sig", errors="replace").replace("\r\n", "\n").split("\n")
    start = next((i + 1 for i, l in enumerate(lines) if _GUTENBERG_START.match(l)), 0)
    end = next((i for i, l in enumerate(lines) if _GUTENBERG_END.match(l)), len(lines))
    paragraph: list[str] = []
    for line in lines[start:end]:
        if not line.strip() or _WIKI_HEADING.match(line):
            if paragraph:
                yield " ".join(paragraph)
                paragraph = []
            continue
        paragraph.append(line.strip())
    if paragraph:
        yield " ".join(paragraph)


def sentence_splitter(sample: str) -> PunktSentenceTokenizer:
    """A Punkt splitter trained (unsupervised) on `sample`; needs no NLTK data download."""
    from nltk.tokenize.punkt import PunktSentenceTokenizer, PunktTrainer  # lazy: ~2 s of imports only a split needs

    trainer = PunktTrainer()
    trainer.INCLUDE_ALL_COLLOCS = True
    trainer.train(sample, finalize=True)
    return PunktSentenceTokenizer(trainer.get_params())


def prepare_corpus(
    paths: Iterable[str | Path], out_path: str | Path, *, max_sentences: int | None = None,
    min_words: int = 3, train_chars: int = 2_000_000,
) -> dict[str, int]:
    """Write one sentence per line, a blank line between documents; returns counts."""
    documents = [d for p in paths for d in read_documents(p)]
    if not documents:
        raise ValueError(f"no text found in corpus files: {list(map(str, paths))}")
    sample = "\n\n".join(documents)[:train_chars]
    splitter = sentence_splitter(sample)
    n_sent = n_doc = 0
    with atomic_path(out_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for doc in documents:
            sentences = [s.strip() for s in splitter.tokenize(doc) if len(s.split()) >= min_words]
            if max_sentences is not None:
                sentences = sentences[: max_sentences - n_sent]
            if not sentences:
                continue
            f.write("\n".join(sentences) + "\n\n")
            n_sent += len(sentences)
            n_doc += 1
            if max_sentences is not None and n_sent >= max_sentences:
                break
    return {"documents": n_doc, "sentences": n_sent}


def read_sentences(path: str | Path) -> list[list[str]]:
    """Documents (lists of sentences) of a prepared corpus file."""
    docs: list[list[str]] = [[]]
    for line in Path(path).read_text(encoding="utf-8").split("\n"):
        if line.strip():
            docs[-1].append(line.strip())
        elif docs[-1]:
            docs.append([])
    return [d for d in docs if d]


def pack_sequences(documents: list[list[str]], tokenizer, max_length: int) -> list[str]:
    """Greedily pack consecutive sentences of a document into texts of at most `max_length` pieces."""
    budget = max_length - 2  # [CLS] ... [SEP]
    texts: list[str] = []
    for doc in documents:
        lengths = [len(ids) for ids in tokenizer(doc, add_special_tokens=False)["input_ids"]]
        current, used = [], 0
        for sentence, n in zip(doc, lengths):
            if current and used + n > budget:
                texts.append(" ".join(current))
                current, used = [], 0
            current.append(sentence)
            used += n
        if current:
            texts.append(" ".join(current))
    return texts


def sentence_pairs(
    documents: list[list[str]], tokenizer, max_length: int, *, seed: int = 0, random_next: float = 0.5,
) -> list[tuple[str, str, int]]:
    """Next-sentence-prediction pairs ``(A, B, label)`` (BERT, Devlin et al. 2019, Sec. 3.1 "Task #2"; the pair
    construction of BERT's ``create_pretraining_data.py``, simplified): consecutive sentences of one document are
    packed into chunks of at most ``max_length - 3`` pieces; each chunk is split at a random sentence boundary into
    A and B. With probability ``random_next`` (always for a one-sentence chunk) B is replaced by as many sentences,
    from a random position of *another* document: label 1 ("random"); otherwise B is A's true continuation from
    the same document: label 0 (transformers' convention). Pairs never cross a document boundary except as a
    random B."""
    import random

    rng = random.Random(seed)
    budget = max_length - 3  # [CLS] A [SEP] B [SEP]
    docs = [d for d in documents if d]
    lengths = [[len(ids) for ids in tokenizer(d, add_special_tokens=False)["input_ids"]] for d in docs]
    pairs: list[tuple[str, str, int]] = []
    for i, (doc, lens) in enumerate(zip(docs, lengths)):
        chunks: list[list[int]] = [[]]
        used = 0
        for j, n in enumerate(lens):
            if chunks[-1] and used + n > budget:
                chunks.append([])
                used = 0
            chunks[-1].append(j)
            used += n
        for chunk in chunks:
            if not chunk:
                continue
            is_random = len(docs) > 1 and (len(chunk) == 1 or rng.random() < random_next)
            if len(chunk) == 1 and not is_random:
                continue  # a one-sentence chunk of the only document has no B
            split = rng.randint(1, len(chunk) - 1) if len(chunk) > 1 else 1
            a = " ".join(doc[j] for j in chunk[:split])
            if is_random:
                other = rng.choice([k for k in range(len(docs)) if k != i])
                start = rng.randrange(len(docs[other]))
                n_b = max(1, len(chunk) - split)
                b = " ".join(docs[other][start:start + n_b])
            else:
                b = " ".join(doc[j] for j in chunk[split:])
            pairs.append((a, b, int(is_random)))
    return pairs


def learn_word_vectors(
    corpus_path: str | Path, out_path: str | Path, *, dim: int = 50, max_words: int = 20_000, window: int = 2,
) -> dict[str, int]:
    """Word vectors from a prepared corpus (PPMI of window co-occurrences + truncated SVD), written in
    the GloVe text format. This is the offline stand-in for a downloaded GloVe file: same format, same
    use (nearest neighbours of multi-piece words in augmentation)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import svds

    word_re = re.compile(r"[a-z]+")
    sentences = [word_re.findall(s.lower()) for doc in read_sentences(corpus_path) for s in doc]
    counts = Counter(w for s in sentences for w in s)
    vocab = [w for w, _ in counts.most_common(max_words)]
    index = {w: i for i, w in enumerate(vocab)}
    pairs: Counter = Counter()
    for s in sentences:
        ids = [index[w] for w in s if w in index]
        for i, a in enumerate(ids):
            for b in ids[max(0, i - window) : i]:
                pairs[(a, b)] += 1
                pairs[(b, a)] += 1
    rows, cols = zip(*pairs) if pairs else ((), ())
    vals = np.fromiter(pairs.values(), dtype=np.float64, count=len(pairs))
    n = len(vocab)
    m = coo_matrix((vals, (rows, cols)), shape=(n, n)).tocsr()
    total = m.sum()
    row_sum = np.asarray(m.sum(axis=1)).ravel()
    col_sum = np.asarray(m.sum(axis=0)).ravel() ** 0.75  # context-distribution smoothing
    col_sum = col_sum / col_sum.sum() * total
    m = m.tocoo()
    pmi = np.log(m.data * total / (row_sum[m.row] * col_sum[m.col]))
    ppmi = coo_matrix((np.maximum(pmi, 0), (m.row, m.col)), shape=(n, n)).tocsr()
    k = min(dim, n - 2)
    u, s, _ = svds(ppmi, k=k, random_state=0)  # its own start vector: no global random state
    vectors = u * np.sqrt(s)
    if k < dim:
        vectors = np.pad(vectors, ((0, 0), (0, dim - k)))
    with atomic_path(out_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for w, v in zip(vocab, vectors):
            f.write(w + " " + " ".join(f"{x:.6f}" for x in v) + "\n")
    return {"words": n, "dim": dim}


def train_wordpiece(corpus_path: str | Path, out_dir: str | Path, *, vocab_size: int) -> Path:
    """Train an uncased WordPiece vocabulary on a corpus and save a BERT tokenizer (save_pretrained)."""
    import tempfile

    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    from distillery.io import atomic_dir

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wp = BertWordPieceTokenizer(lowercase=True, strip_accents=True)
    # The trainer numbers the continuation pieces ("##x") in hash-map order and breaks ties between equally
    # frequent merges by those numbers, so two trainings on one corpus differ (huggingface/tokenizers#1794).
    # Declaring every "##x" up front numbers them in a fixed order; the pieces are renumbered in a fixed order too.
    chars = set()
    with open(corpus_path, encoding="utf-8") as f:
        for line in f:
            chars.update(wp.normalizer.normalize_str(line))
    continuation = [f"##{c}" for c in sorted(chars) if not c.isspace()]
    wp.train([str(corpus_path)], vocab_size=vocab_size, min_frequency=1,
             show_progress=False, special_tokens=specials + continuation)
    pieces = specials + sorted(set(wp.get_vocab()) - set(specials))
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp) / "vocab.txt"
        vocab_file.write_text("".join(f"{piece}\n" for piece in pieces), encoding="utf-8")
        # transformers 5: `vocab=` (a `vocab_file=` keyword is silently ignored)
        tokenizer = BertTokenizerFast(vocab=str(vocab_file), do_lower_case=True)
    with atomic_dir(out_dir) as tmp_dir:
        tokenizer.save_pretrained(tmp_dir)
    return Path(out_dir)
