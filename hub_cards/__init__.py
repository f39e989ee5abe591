"""Model cards and Hub push/pull."""
