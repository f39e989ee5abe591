"""The CPU demo (``llava-normaligned demo``, ``make-data``): the synthetic dataset, the tiny pre-trained parts, the
runs of the paper's variants, their scoring and report. It uses the training package; training does not use it."""
