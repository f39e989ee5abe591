"""LoRA / QLoRA for stage 2: adapters on the LLM's (and optionally the vision tower's) linear layers, while the
projector and its norm train fully and are saved with the adapter (PEFT ``modules_to_save``).

The projector is small (two matrices and the norm) and is what the paper changes; training it through a low-rank
adapter would leave the norm's gain, the quantity GWC compensates for, frozen.
"""

from __future__ import annotations

from llava_normaligned.families.anatomy import LLAVA, Family

# The LLaVA family's (stock LLaVA and this package's model; other families: anatomy.FAMILIES).
LLM_TARGETS = LLAVA.lora_targets()
VISION_TARGETS = LLAVA.lora_targets(vision=True)
PROJECTOR = LLAVA.projector_module_name


def stage2_lora_config(model_args, *, lora_vision: bool = False, family: Family = LLAVA):
    """A ``peft.LoraConfig`` from TRL's ``ModelConfig`` flags (``--lora_r``, ``--lora_alpha``, ...).

    Targets the LLM's attention and MLP projections (and the vision tower's with ``lora_vision``) unless
    ``--lora_target_modules`` names others; the projector (``multi_modal_projector``) is always in
    ``modules_to_save``. Module paths are the ``family``'s (``llava_normaligned.families.anatomy``).
    """
    from peft import LoraConfig

    targets = model_args.lora_target_modules or family.lora_targets(vision=lora_vision)
    projector = family.projector_module_name
    modules_to_save = list(model_args.lora_modules_to_save or [])
    if projector not in modules_to_save:
        modules_to_save.append(projector)
    return LoraConfig(
        task_type=model_args.lora_task_type,
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=targets,
        modules_to_save=modules_to_save,
        bias="none",
        use_rslora=model_args.use_rslora,
        use_dora=model_args.use_dora,
    )


def merge_adapter(trained_model, output_dir: str, processor, base_loader=None) -> str:
    """Save the base model with the adapter merged into it (projector and norm included) to ``output_dir``.

    A 4-bit/8-bit base cannot hold merged weights: the base is reloaded unquantized by ``base_loader()`` and the
    trained adapter (with the projector copy) applied to it before merging.
    """
    import os
    import tempfile

    from peft import PeftModel

    base = trained_model.get_base_model()
    quantized = getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False)
    if quantized:
        if base_loader is None:
            raise ValueError("merging a quantized adapter needs a loader of the unquantized base model")
        with tempfile.TemporaryDirectory() as adapter_dir:
            trained_model.save_pretrained(adapter_dir)
            merged = PeftModel.from_pretrained(base_loader(), adapter_dir).merge_and_unload()
    else:
        merged = trained_model.merge_and_unload()
    os.makedirs(output_dir, exist_ok=True)
    merged.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    return output_dir


__all__ = ["LLM_TARGETS", "VISION_TARGETS", "merge_adapter", "stage2_lora_config"]
