"""Two-stage training of norm-aligned LLaVA models with TRL."""
