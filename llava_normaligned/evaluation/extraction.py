"""Answer extraction: a model's free text -> the answer the benchmark scores.

Rules, in the order they are tried, follow the community's evaluators (lmms-eval, MMBench's and POPE's own
scripts) without their LLM-judge fallback: an answer no rule can read is "unparsed" (None) and scores as wrong,
never as a random guess.
"""

from __future__ import annotations

import re
import string

# The option letter after a keyword: upper-case, or any case when nothing but punctuation follows it ("the answer is
# a dog" states no letter).
_LETTER_AFTER = r"\s*[:：]?\s*\(?(?:([A-Z])\)?(?![A-Za-z])|([a-z])\)?(?=[\s.,;:!)]*$))"
# A stated answer: "The answer is (B).", "Answer: B", "answer: (b)", "the correct option is B". The keyword in any case.
_STATED = re.compile(
    r"\b(?i:answer|(?:correct|right|best)\s+(?:option|choice))(?:\s+(?i:is|would\s+be|should\s+be))?" + _LETTER_AFTER
)
# A mention: "Option B", "choice (C)". Weaker than a stated answer: "Option A is wrong; the answer is B." is B.
_MENTION = re.compile(r"\b(?i:option|choice)" + _LETTER_AFTER)
# What makes a mention or a leading letter a rejection: "Option A is wrong", "A is not correct", "B isn't".
_REJECTED_AFTER = re.compile(
    r"^[\s,)]*(?:(?:is|was|seems|looks|would\s+be)\s+)?(?:not|wrong|incorrect|false|invalid|unlikely)\b"
    r"|^[\s,)]*(?:is|was)n[’']t\b",
    re.IGNORECASE,
)
# Words that negate an option text just after them: "It is not red", "no red square", "neither red nor green".
_NEGATIONS = frozenset({"not", "no", "never", "neither", "nor", "without", "isn't", "isn’t", "aren't", "cannot", "can't"})
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

    Tried in order: a stated answer ("The answer is (B).", the last one when there are several), a mentioned option
    ("Option B", when all mentions not rejected as in "Option A is wrong" agree), a leading letter ("B", "(B)",
    "B. cat", not "A is wrong"), exactly one standalone letter token (MMBench's rule; "A" is ignored in sentences
    longer than three words, where it is likely the article), then the option's text instead of its letter
    (exact, else the only option named without a negation before it: "It is not red" names none).
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

    stated = _letters(_STATED, text, letters)
    if stated:
        return stated[-1]  # "The answer is A. No wait, the answer is B." is B
    mentioned = {c for c in _letters(_MENTION, text, letters, skip_rejected=True)}
    if len(mentioned) == 1:
        return mentioned.pop()

    leading = _LEADING.match(text)
    if leading and leading.group(1) in letters and not _REJECTED_AFTER.match(text[leading.end(1):].lstrip(").:")):
        # "A cat is on the mat" starts with the article A, not the option.
        if not (leading.group(1) == "A" and re.match(r"^A\s+[a-z]", text) and len(text.split()) > 3):
            return leading.group(1)

    tokens = text.split()
    # a letter token followed by a rejection ("A is wrong") is not a pick
    picks = [t for i, t in enumerate(tokens) if not _REJECTED_AFTER.match(" " + " ".join(tokens[i + 1 :]))]
    for prefix, suffix in _AFFIXES:
        found = {c for c in letters if f"{prefix}{c}{suffix}" in picks}
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
        contained = [k for k, v in valid.items() if _affirmed(v, norm_pred)]
        if len(contained) == 1:
            return contained[0]
        # "cat" and "black cat" both contained: the longest one, if it is the only one that long
        if len(contained) > 1:
            longest = max(len(valid[k]) for k in contained)
            top = [k for k in contained if len(valid[k]) == longest]
            if len(top) == 1 and all(valid[k] in valid[top[0]] for k in contained):
                return top[0]
    return None


def _letters(pattern: re.Pattern, text: str, letters: str, skip_rejected: bool = False) -> list[str]:
    """The letters among ``letters`` that ``pattern`` finds, in order; with ``skip_rejected``, not those followed by
    a rejection ("Option A is wrong")."""
    found = []
    for m in pattern.finditer(text):
        letter = (m.group(1) or m.group(2)).upper()
        if letter in letters and not (skip_rejected and _REJECTED_AFTER.match(text[m.end():])):
            found.append(letter)
    return found


def _affirmed(option: str, prediction: str) -> bool:
    """Whether the (normalized) option text occurs in the prediction as whole words at least once without a
    negation among the two words before it ("it is not red" does not pick red)."""
    for m in re.finditer(rf"(?<!\w){re.escape(option)}(?!\w)", prediction):
        before = prediction[: m.start()].split()[-2:]
        if not _NEGATIONS.intersection(before):
            return True
    return False


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
