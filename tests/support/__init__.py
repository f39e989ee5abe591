"""What the tests share: builders, checks and the layout's rules (no test lives here)."""
