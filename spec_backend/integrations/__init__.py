"""Host-engine integrations (vLLM)."""
