"""CTC outputs (an OCR recognizer's character scores per position) judged by the text they decode to.

A CRNN or SVTR recognizer scores every class at every position, and the application reads the
greedy CTC decoding: the best class per position, repeats collapsed, the blank removed. A change
of which of two positions carries a character, or of a blank between repeats that stay apart,
changes per-position top-1 and no text; a character lost, added or swapped changes the text. So
the metric is the character error rate (edit distance over the fp32 text's length), the measure
OCR is evaluated by.

The blank is found from the data: on text lines most positions hold it (PP-OCRv4 and ddddocr:
index 0, Keras' CTC: the last index).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

MIN_BLANK_SHARE = 0.5  # the share of positions one class must hold to be taken for CTC's blank


def blank_class(ref: np.ndarray) -> int | None:
    """The class most positions hold, where it holds at least ``MIN_BLANK_SHARE`` of them and other
    classes appear too (text to read); else None (not a CTC output, or nothing decoded)."""
    if ref.ndim != 3 or ref.shape[-1] < 3:
        return None
    counts = np.bincount(ref.argmax(-1).ravel(), minlength=ref.shape[-1])
    blank = int(counts.argmax())
    return blank if counts[blank] >= MIN_BLANK_SHARE * counts.sum() and counts[blank] < counts.sum() else None


def error_rate(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray], blank: int) -> dict[str, Any]:
    """Character error rate of the candidate's decoded texts against the reference's, batch by batch
    (a batch is ``[N, T, C]``, or ``[T, 1, C]`` as a CRNN exported at batch 1 gives it)."""
    from rapidfuzz.distance import Levenshtein  # here: every CLI command imports the metric names

    edits = characters = texts = changed = 0
    for ref, cand in zip(reference, candidate, strict=True):
        for a, b in zip(_positions(ref), _positions(cand), strict=True):
            truth, read = _decode(a, blank), _decode(b, blank)
            distance = Levenshtein.distance(truth, read)
            edits += distance
            characters += len(truth)
            texts += 1
            changed += distance > 0
    return {
        "character_error_rate": edits / max(characters, 1),
        "texts": texts,
        "texts_changed": changed,
        "characters_fp32": characters,
        "ctc_blank": blank,
    }


def _positions(batch: np.ndarray) -> np.ndarray:
    """Best class per position, one row per text."""
    classes = batch.argmax(-1)
    return classes.T if classes.shape[1] == 1 and classes.shape[0] > 1 else classes


def _decode(positions: np.ndarray, blank: int) -> list[int]:
    kept = positions[np.r_[True, positions[1:] != positions[:-1]]]
    return kept[kept != blank].tolist()
