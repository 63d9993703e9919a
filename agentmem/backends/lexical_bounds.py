"""Safe early termination for BM25 top-k: when the documents holding *every* query term already fill the top k,
and no document missing a term can reach the k-th score, the top k is those documents — without scoring the
thousands that hold only one common term.

Why it is exact: a document's BM25 is a sum over the query terms it holds, each term's part at most
``idf(t) * f(max_tf(t), min_len)`` (``f`` grows with the term frequency and falls with the document length). A
document missing at least one term therefore scores at most ``sum(UB) - min(UB)``; if the k-th best score among
the documents holding every term is above that, no other document can enter the top k (ties at the cut aside).
Both catalogs use it: SQLite scores with FTS5's own ``bm25()`` (the conjunctive query gives a document exactly the
score the disjunctive one gives it), PostgreSQL from its postings.

The bounds are kept at write time and only ever loosened (a deletion leaves them: a bound that is too generous
is still a bound). PostgreSQL keeps the exact maximum term frequency per term; SQLite cannot see FTS5's stemmed
terms, so it keeps, per token prefix, the most tokens one document has with that prefix — Porter stemming only
rewrites suffixes, so every token that stems to a term of two or more letters starts with that term's first two
letters (see :func:`prefix_of`).

Example:
    >>> ub = [term_bound(2.0, max_tf=1, min_len=10, avg_len=10.0)] * 2    # two terms, each part at most 2.0
    >>> can_stop(theta=3.9, bounds=ub)     # the k-th document holding both scores 3.9 > 2.0: nothing else fits
    True
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

K1, B = 1.2, 0.75  # FTS5's bm25() defaults, used by both catalogs
# FTS5 unicode61's token characters: letters, numbers and private-use characters (categories L*, N*, Co)
_TOKEN = re.compile(r"(?:[^\W_]|[\uE000-\uF8FF])+")
WILDCARD = "*"  # tokens whose prefix cannot be told apart from an ASCII query word's: counted under every prefix


def idf(n_docs: int, df: int) -> float:
    """FTS5's idf: ``log((N - df + 0.5) / (df + 0.5))``, floored at 1e-6 (terms in over half the documents).

    Example:
        >>> round(idf(100, 10), 3)
        2.154
    """
    value = math.log((n_docs - df + 0.5) / (df + 0.5))
    return value if value > 0 else 1e-6


def term_bound(idf_: float, *, max_tf: int, min_len: int, avg_len: float) -> float:
    """The most one term can add to a document's BM25: its idf × the saturation at the largest term frequency
    and the shortest document (``f`` rises with tf and falls with length, so no document exceeds it).

    Example:
        >>> term_bound(1.0, max_tf=1, min_len=10, avg_len=10.0)
        1.0
    """
    tf = max(int(max_tf), 1)
    return idf_ * tf * (K1 + 1) / (tf + K1 * (1 - B + B * max(min_len, 0) / avg_len))


def can_stop(*, theta: float, bounds: Sequence[float]) -> bool:
    """Whether documents missing at least one query term all score below ``theta`` (the k-th best score of the
    documents holding every term): then those documents are the whole top k.

    A relative margin of 1e-9 keeps floating-point rounding on the safe side.

    Example:
        >>> can_stop(theta=2.5, bounds=[1.0, 2.0])    # a document with only the second term may reach 2.0
        True
        >>> can_stop(theta=1.9, bounds=[1.0, 2.0])
        False
    """
    if len(bounds) < 2:
        return False
    limit = sum(bounds) - min(bounds)
    return theta > limit * (1 + 1e-9) + 1e-12


def token_count(text: str) -> int:
    """Tokens in a document as FTS5's unicode61 tokenizer counts them: BM25's document length, stop words included.

    Example:
        >>> token_count("On day 3 I visited the heron's lake.")
        9
    """
    return len(_TOKEN.findall(text))


def _fold(token: str) -> str:
    # unicode61 lowercases and removes diacritics (remove_diacritics=1): NFKD, then drop the combining marks
    return "".join(c for c in unicodedata.normalize("NFKD", token) if not unicodedata.combining(c)).lower()


def prefix_of(word: str) -> str:
    """The prefix bucket a query word's stem falls in: its first two letters from five letters on (Porter never
    shortens a word of five or more letters below two, nor changes a stem's first two letters), else its first.

    Example:
        >>> prefix_of("kayaking"), prefix_of("runs")
        ('ka', 'r')
    """
    word = word.lower()
    return word[:2] if len(word) >= 5 else word[:1]


def prefix_counts(text: str) -> Counter[str]:
    """Per prefix bucket (first letter, and first two letters), how many of ``text``'s tokens start with it; tokens
    that do not fold to ASCII letters and digits count under :data:`WILDCARD` (they bound every bucket).

    Example:
        >>> sorted(prefix_counts("Heron, herons; Hé!").items())
        [('h', 3), ('he', 3)]
    """
    out: Counter[str] = Counter()
    for token in _TOKEN.findall(text):
        folded = _fold(token)
        if not folded[:2].isascii() or not folded[:2].isalnum():
            out[WILDCARD] += 1
            continue
        out[folded[:1]] += 1
        if len(folded) >= 2:
            out[folded[:2]] += 1
    return out


def doc_bounds(texts: Iterable[str]) -> tuple[int | None, dict[str, int]]:
    """For a batch of documents: the shortest length, and per prefix the most tokens one document has with it.

    Example:
        >>> doc_bounds(["heron heron lake", "a b"])
        (2, {'h': 2, 'he': 2, 'l': 1, 'la': 1, 'a': 1, 'b': 1})
    """
    min_len: int | None = None
    most: dict[str, int] = {}
    for text in texts:
        n = token_count(text)
        min_len = n if min_len is None else min(min_len, n)
        for prefix, count in prefix_counts(text).items():
            if count > most.get(prefix, 0):
                most[prefix] = count
    return min_len, most


__all__ = ["B", "K1", "WILDCARD", "can_stop", "doc_bounds", "idf", "prefix_counts", "prefix_of", "term_bound",
           "token_count"]
