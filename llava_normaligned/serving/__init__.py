"""Serving norm-aligned checkpoints: the ``generate`` command (``generate``) and inference engines (vLLM:
``vllm_plugin``, ``vllm_model``). Importing this package imports nothing else: each module is imported where it is
used (the console script imports ``generate`` only when that command runs)."""
