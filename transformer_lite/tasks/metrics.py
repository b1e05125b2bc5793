"""How good is a translation? Exact match, BLEU and chrF (chapter 7).

Exact match counts the outputs equal to the reference, character for
character. BLEU (Papineni et al., 2002) is the geometric mean of the
1- to 4-gram word precisions of the whole test set, times a brevity
penalty for outputs shorter than the references, from 0 to 100. chrF
(Popovic, 2015) is an F-score of character n-grams, kinder to an output
that gets most of a word right. BLEU and chrF come from ``sacrebleu``
(Post, 2018), the reference implementation, with its default settings,
so that scores compare with published ones.
"""

from collections.abc import Sequence

from transformer_lite.extras import require

sacrebleu = require("sacrebleu", "translate")

__all__ = ["bleu", "chrf", "errors", "exact_match_rate", "scores"]


def _check(hypotheses: Sequence[str], refs: Sequence[str]) -> None:
    for name, texts in (("hypotheses", hypotheses), ("references", refs)):
        text_only = all(isinstance(t, str) for t in texts)
        if isinstance(texts, str) or not text_only:
            raise ValueError(f"{name} must be a sequence of str")
    if len(hypotheses) != len(refs) or not refs:
        raise ValueError(
            f"need as many hypotheses as references, and at least one: got "
            f"{len(hypotheses)} and {len(refs)}"
        )


def exact_match_rate(
    hypotheses: Sequence[str], references: Sequence[str]
) -> float:
    """The fraction of hypotheses equal to their reference, in [0, 1]."""
    _check(hypotheses, references)
    same = sum(h == r for h, r in zip(hypotheses, references, strict=True))
    return same / len(references)


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU, 0 to 100, one reference per sentence (sacrebleu)."""
    _check(hypotheses, references)
    return sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF, 0 to 100, one reference per sentence (sacrebleu)."""
    _check(hypotheses, references)
    return sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score


def scores(
    hypotheses: Sequence[str], references: Sequence[str]
) -> dict[str, float]:
    """Exact match (as a percentage), BLEU and chrF in one dict."""
    return {
        "exact match": 100 * exact_match_rate(hypotheses, references),
        "BLEU": bleu(hypotheses, references),
        "chrF": chrf(hypotheses, references),
    }


def errors(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
) -> list[dict[str, str]]:
    """The examples whose hypothesis differs from the reference, in order,
    each as ``{"source", "output", "reference"}`` (a table's rows)."""
    _check(hypotheses, references)
    if len(sources) != len(references):
        raise ValueError(
            f"{len(sources)} sources for {len(references)} references"
        )
    return [
        {"source": s, "output": h, "reference": r}
        for s, h, r in zip(sources, hypotheses, references, strict=True)
        if h != r
    ]
