"""The runtime below the drafters: what runs a model for a step, used by the engine loop, the drafters and
the training tools alike.

``loader`` / ``sources`` / ``gguf_cache`` / ``checkpoint_files`` load models (folders, GGUF files, the
bundled SmolLM2); ``kv_cache`` is the ragged KV cache; ``runner`` and ``captured`` run a model's forward
eagerly or from captured graphs; ``hidden`` captures hidden states; ``slots`` moves every cache of a
request in one place; ``hf_compat`` hands transformers its cache under the right name. Nothing here
imports the drafters or the engine loop.
"""
