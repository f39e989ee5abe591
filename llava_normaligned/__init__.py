"""llava-normaligned: train, diagnose, publish and serve norm-aligned LLaVA models."""
