"""Print the tables the README and docs quote from ``llava_normaligned.diagnostics.memory`` (the memory table of
reference architectures, the training table at the paper's shape, the model card's table and the CPU time table),
to paste where a test says they differ (``tests/test_readme.py``, ``tests/test_memory_card.py``).

    python .ci/doc_tables.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llava_normaligned.diagnostics.memory import card_table, reference_table, time_table, training_table  # noqa: E402


def main() -> int:
    print("\n\n".join([reference_table(), training_table(), card_table(), time_table()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
