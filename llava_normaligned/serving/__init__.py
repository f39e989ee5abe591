"""Serving norm-aligned checkpoints with inference engines (vLLM: ``vllm_plugin``, ``vllm_model``)."""
