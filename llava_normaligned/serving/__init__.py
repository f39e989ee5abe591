"""Serving norm-aligned checkpoints with inference engines (vLLM: ``vllm_plugin``, ``vllm_model``; the check of a
vLLM install against transformers is ``llava_normaligned.commands.vllm_check``). Importing this package imports nothing else: each
module is imported where it is used. Generation in this process is ``llava_normaligned.generation`` (the
``generate`` command: ``llava_normaligned.commands.generate``)."""
