"""Training data (one module per concern: ``common``, ``rows``, ``columns``, ``images``, ``llava_json``,
``hub``): LLaVA JSON conversations and Hugging Face datasets, as TRL's messages + images rows.

Two sources, one output format (what TRL's ``SFTTrainer`` takes for a vision-language model):

    {"id": str, "messages": [{"role": "user" | "assistant" | "system", "content": str}, ...], "images": [PIL, ...]}

* ``load_llava_json``: the format of LLaVA-558K and llava_v1_5_mix665k
  (``{"id", "image", "conversations": [{"from": "human", "value": "<image>\\n..."}, {"from": "gpt", ...}]}``),
  multi-turn, text-only rows (no ``image`` key) allowed.
* ``load_messages_dataset``: a saved dataset folder, a parquet/JSON folder or file, or a Hub dataset id, in TRL's
  messages + images format or in LLaVA's conversation format as the Hub publishes it (``lmms-lab/LLaVA-NeXT-Data``,
  ``lmms-lab/LLaVA-ReCap-558K``: ``id``, ``conversations`` [{``from``, ``value``}], ``image`` with embedded bytes).

Images are placed before the first user message and the ``<image>`` tags are removed from the text, which is what
LLaVA-1.5's own preprocessing does (``preprocess_multimodal`` moves the tag to the front) and what TRL expects.

Every row's text is checked here, before training starts, so that nothing fails hours into a run: a malformed row
is an error naming the row (file, index, id), or, with ``on_bad_row="skip"``, a dropped row counted in the returned
``DataReport``. Images are checked as ``check_images`` says (``"auto"``: every header opened up to
``AUTO_OPEN_LIMIT`` images; above, one ``stat`` per file, or the byte count of each embedded image plus the headers
of a sample): a missing or unreadable image is an error naming its row, or a dropped row with
``on_bad_image="skip"``. An image that passes the check and still fails to decode is met by the collator.

At the paper's scale (558K-779K rows) every pass here is linear and vectorised where it can be (Arrow arrays built
in chunks, no per-row dataset indexing), and logs its count and rate. The parsed rows are cached (``cache_dir``:
an Arrow file named by a hash of the input files' bytes and the options), so the same run again memory-maps them
instead of parsing; embedded image bytes are never copied or decoded up front.
"""

from __future__ import annotations

from .columns import (
    MESSAGE_TYPE,
    with_decode,
)
from .common import (
    BAD_IMAGE_POLICIES,
    BAD_ROW_POLICIES,
    CHAT_ROLES,
    CHUNK_ROWS,
    IMAGE_CHECKS,
    LLAVA_ROLES,
    LOADED_FORMAT,
    MAX_LISTED,
    PROGRESS_SECONDS,
    DataError,
    DataReport,
    default_cache_dir,
    log_phase,
    split_paths,
)
from .hub import (
    load_messages_dataset,
)
from .images import (
    AUTO_OPEN_LIMIT,
    AUTO_SAMPLE,
    ImageRefs,
    count_images,
    find_bad_images,
    resolve_check,
)
from .llava_json import (
    JSON_BUFFER,
    PARSE_FIELDS,
    READ_BLOCK,
    load_llava_json,
)

__all__ = [
    "AUTO_OPEN_LIMIT",
    "AUTO_SAMPLE",
    "BAD_IMAGE_POLICIES",
    "BAD_ROW_POLICIES",
    "CHAT_ROLES",
    "CHUNK_ROWS",
    "DataError",
    "DataReport",
    "IMAGE_CHECKS",
    "ImageRefs",
    "JSON_BUFFER",
    "LLAVA_ROLES",
    "LOADED_FORMAT",
    "MAX_LISTED",
    "MESSAGE_TYPE",
    "PARSE_FIELDS",
    "PROGRESS_SECONDS",
    "READ_BLOCK",
    "count_images",
    "default_cache_dir",
    "find_bad_images",
    "load_llava_json",
    "load_messages_dataset",
    "log_phase",
    "resolve_check",
    "split_paths",
    "with_decode",
]
