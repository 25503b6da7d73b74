"""Draft-model architectures for inference (EAGLE heads, ...), loaded from their published formats."""
