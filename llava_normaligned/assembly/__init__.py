"""Commands that build a model: ``compose``, ``convert`` and ``align`` (``assembly.commands``)."""
