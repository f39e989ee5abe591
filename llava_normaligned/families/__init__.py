"""What the package knows about vision-language model families: where each keeps its parts (``anatomy``), how its
processor is built (``processors``), its token positions (``positions``, M-RoPE), how many image tokens an image
becomes (``sizes``), where it is probed (``probe_points``) and the LLaVA image placeholder (``tokens``).

The second layer of the package: it imports only torch, transformers and the model (``modeling_llava_normaligned``);
the core and the applications import it. A new family is one ``anatomy.Family`` entry in ``anatomy.FAMILIES`` (and a
processor builder in ``processors`` when ``AutoProcessor`` cannot load its folder).
"""
