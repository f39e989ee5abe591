"""Row conversion: LLaVA conversations and Hub messages into TRL's messages, the ``<image>`` tags moved to the
front, each row's text checked."""

from __future__ import annotations

import logging
import os

from llava_normaligned.families.tokens import IMAGE_TOKEN as IMAGE_TAG  # the tag in LLaVA-format text

from .common import CHAT_ROLES, LLAVA_ROLES, DataReport, _RowProblem

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------- row conversion


def _row_name(path: str, index: int, row_id) -> str:
    return f"{os.path.basename(path)} row {index}" + (f" (id {row_id!r})" if row_id is not None else "")


def _llava_images(row: dict) -> list[str]:
    image = row.get("image")
    if image is None:
        return []
    if isinstance(image, str):
        return [image]
    if isinstance(image, list) and all(isinstance(i, str) for i in image):
        return list(image)
    raise _RowProblem(f"'image' must be a path or a list of paths, got {type(image).__name__}")


def _llava_messages(turns, n_images: int, report: DataReport) -> list[dict]:
    """LLaVA ``conversations`` -> chat messages with string content and the ``<image>`` tags removed."""
    if not isinstance(turns, list) or not turns:
        raise _RowProblem("'conversations' must be a non-empty list")
    messages = []
    for number, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) or "from" not in turn:
            raise _RowProblem(f"turn {number} must be an object with 'from' and a string 'value'")
        role = LLAVA_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise _RowProblem(f"turn {number} has unknown 'from' {turn['from']!r} (expected human/gpt/system)")
        messages.append({"role": role, "content": turn["value"]})
    # LLaVA's preprocess skips a conversation's first turn when it is not the human's; so do we.
    first = 1 if messages[0]["role"] == "system" else 0
    while first < len(messages) and messages[first]["role"] == "assistant":
        messages.pop(first)
        report.leading_assistant_turns_dropped += 1
    return _clean_image_tags(messages, n_images)


def _clean_image_tags(messages: list[dict], n_images: int) -> list[dict]:
    tags = 0
    for m in messages:
        if IMAGE_TAG in m["content"]:
            if m["role"] != "user":
                raise _RowProblem(f"an {IMAGE_TAG} tag outside a user turn")
            tags += m["content"].count(IMAGE_TAG)
    if n_images == 0 and tags:
        raise _RowProblem(f"the text has {tags} {IMAGE_TAG} tag(s) but the row has no image")
    if tags and tags != n_images:
        raise _RowProblem(f"the text has {tags} {IMAGE_TAG} tag(s) for {n_images} image(s)")
    if tags:
        messages = [{"role": m["role"], "content": m["content"].replace(IMAGE_TAG, "").strip()}
                    if m["role"] == "user" and IMAGE_TAG in m["content"] else m for m in messages]
    _check_conversation(messages)
    return messages


def _check_conversation(messages: list[dict]) -> None:
    roles = {m["role"] for m in messages}
    if "assistant" not in roles:
        raise _RowProblem("no assistant turn, nothing to train on")
    if "user" not in roles:
        raise _RowProblem("no user turn")


def _message_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content if isinstance(part, dict) and part.get("type") == "text")


def _hf_messages(messages, n_images: int) -> list[dict]:
    """TRL messages (string or list-of-parts content) -> messages with string content; image parts are counted."""
    if not isinstance(messages, list) or not messages:
        raise _RowProblem("'messages' must be a non-empty list")
    placeholders, out = 0, []
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise _RowProblem(f"message {number} must have a role in {CHAT_ROLES}")
        content = message.get("content")
        if isinstance(content, list):
            placeholders += sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image")
        elif content is not None and not isinstance(content, str):
            raise _RowProblem(f"message {number} content must be a string or a list of parts")
        out.append({"role": message["role"], "content": _message_text(content)})
    if placeholders and placeholders != n_images:
        raise _RowProblem(f"{placeholders} image part(s) in the messages for {n_images} image(s)")
    return _clean_image_tags(out, n_images)
