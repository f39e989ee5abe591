"""Answer extraction: a model's free text -> the answer the benchmark scores.

Rules, in the order they are tried, follow the community's evaluators (lmms-eval, MMBench's and POPE's own
scripts) without their LLM-judge fallback: an answer no rule can read is "unparsed" (None) and scores as wrong,
never as a random guess.
"""

from __future__ import annotations

import re
import string

# "The answer is (B).", "Answer: B", "Option B", "the correct option is B", "answer: (b)". The keyword in any case;
# the letter upper-case, or any case when nothing but punctuation follows it ("the answer is a dog" states no letter).
_STATED = re.compile(
    r"\b(?i:answer|option|choice)(?:\s+(?i:is))?\s*[:：]?\s*\(?(?:([A-Z])\)?(?![A-Za-z])|([a-z])\)?(?=[\s.,;:!)]*$))"
)
# "B", "(B)", "B.", "B)", "B:", "B. cat", "(B) cat": a letter at the start, alone or followed by punctuation/space
_LEADING = re.compile(r"^\(?([A-Z])(?:[\.\):,]|\)\.|\s|$)")
# MMBench's `can_infer_option` affixes around a standalone letter token
_AFFIXES = (("", ""), ("", "."), ("", ","), ("", ":"), ("", ")"), ("", ")."), ("(", ")"), ("(", ")."), (":", ""))


def _norm_text(text: str) -> str:
    text = text.lower().strip()
    text = text.strip(string.punctuation + " ")
    return re.sub(r"\s+", " ", text)


def extract_choice(prediction: str | None, letters: str, options: dict[str, str] | None = None) -> str | None:
    """The option letter a prediction picks among ``letters`` (e.g. "ABCD"), or None.

    Tried in order: a stated answer ("The answer is (B)."), a leading letter ("B", "(B)", "B. cat"), exactly one
    standalone letter token (MMBench's rule; "A" is ignored in sentences longer than three words, where it is
    likely the article), then the option's text instead of its letter (exact, else the only option contained).
    """
    if prediction is None:
        return None
    text = prediction.strip()
    if not text:
        return None
    letters = letters.upper()

    bare = _norm_text(text)
    if len(bare) == 1 and bare.upper() in letters:  # "b", "(c)", "D."
        return bare.upper()

    stated = [(m.group(1) or m.group(2)).upper() for m in _STATED.finditer(text)]
    stated = [c for c in stated if c in letters]
    if stated:
        return stated[0]

    leading = _LEADING.match(text)
    if leading and leading.group(1) in letters:
        # "A cat is on the mat" starts with the article A, not the option.
        if not (leading.group(1) == "A" and re.match(r"^A\s+[a-z]", text) and len(text.split()) > 3):
            return leading.group(1)

    tokens = text.split()
    for prefix, suffix in _AFFIXES:
        found = {c for c in letters if f"{prefix}{c}{suffix}" in tokens}
        if len(found) == 1:
            (letter,) = found
            if not (letter == "A" and len(tokens) > 3 and prefix == "" and suffix == ""):
                return letter

    if options:
        norm_pred = _norm_text(text)
        valid = {k: _norm_text(v) for k, v in options.items() if k in letters and _norm_text(v)}
        exact = [k for k, v in valid.items() if v == norm_pred]
        if len(exact) == 1:
            return exact[0]
        contained = [k for k, v in valid.items() if v in norm_pred]
        if len(contained) == 1:
            return contained[0]
        # "cat" and "black cat" both contained: the longest one, if it is the only one that long
        if len(contained) > 1:
            longest = max(len(valid[k]) for k in contained)
            top = [k for k in contained if len(valid[k]) == longest]
            if len(top) == 1 and all(valid[k] in valid[top[0]] for k in contained):
                return top[0]
    return None


def extract_yes_no(prediction: str | None) -> str | None:
    """"yes", "no" or None. POPE's rule (LLaVA's eval_pope.py): read the first sentence; any "no"/"not" makes it
    "no". Unlike that script, an answer with neither "yes" nor a negation is None (scored wrong), not "yes"."""
    if prediction is None:
        return None
    text = prediction.strip()
    if "." in text:
        text = text.split(".")[0]
    words = text.lower().translate(str.maketrans({c: " " for c in string.punctuation})).split()
    if "no" in words or "not" in words:
        return "no"
    if "yes" in words:
        return "yes"
    return None


def normalize_answer(text: str | None) -> str:
    """Exact-match normalization for short free answers: lowercase, outer punctuation off, spaces collapsed."""
    return "" if text is None else _norm_text(text)


def ocr_match(prediction: str | None, answers: list[str], dataset: str = "") -> bool:
    """OCRBench's rule: an accepted answer is a substring of the prediction, case-insensitively; for handwritten
    math (HME100k) spaces are removed and case is kept."""
    if not prediction:
        return False
    if dataset == "HME100k":
        pred = prediction.strip().replace("\n", " ").replace(" ", "")
        return any(a.strip().replace("\n", " ").replace(" ", "") in pred for a in answers if a.strip())
    pred = prediction.lower().strip().replace("\n", " ")
    return any(a.lower().strip().replace("\n", " ") in pred for a in answers if a.strip())
