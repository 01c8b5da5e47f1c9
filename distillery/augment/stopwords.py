"""The fixed English stop-word list of TinyBERT's data augmentation.

Eligible words for replacement (TinyBERT, Jiao et al. 2020, Algorithm 1) are purely alphabetic words
that are not stop-words. The official script (huawei-noah/Pretrained-Language-Model,
TinyBERT/data_augmentation.py, ``StopWordsList``) hard-codes NLTK's English stop-word list
(``nltk.corpus.stopwords.words("english")`` of 2019, 179 entries) without the eight
question words what/which/who/whom/when/where/why/how, plus ``'s`` and ``'re``: 173 entries. The
NLTK corpus is a separate download that is not available offline, so the list is reproduced here.
Only entries matching ``[a-z]+`` can ever matter (the other words are never eligible), but the list
is kept whole so that it can be compared with the source.
"""

from __future__ import annotations

STOPWORDS: frozenset[str] = frozenset(
    """
    i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself yourselves
    he him his himself she she's her hers herself it it's its itself they them their theirs themselves
    this that that'll these those am is are was were be been being have has had
    having do does did doing a an the and but if or because as until while of at by for with about
    against between into through during before after above below to from up down in out on off over
    under again further then once here there all any both each few more most other
    some such no nor not only own same so than too very s t can will just don don't should should've
    now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't hasn
    hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan shan't shouldn
    shouldn't wasn wasn't weren weren't won won't wouldn wouldn't 's 're
    """.split()
)


def is_eligible(word: str) -> bool:
    """True when `word` (already lower-cased) may be replaced: purely ``[a-z]`` and not a stop-word."""
    return bool(word) and word.isascii() and word.isalpha() and word.lower() not in STOPWORDS
