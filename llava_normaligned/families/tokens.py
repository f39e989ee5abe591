"""The LLaVA image placeholder (standard library only, so the data code can import it without torch)."""

# The tag that marks an image in LLaVA-format text (`conversations` rows) and the special token `compose` adds to a
# tokenizer for it; `tiny.py`'s tokenizer and chat template use it too.
IMAGE_TOKEN = "<image>"
