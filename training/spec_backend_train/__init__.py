"""Training draft heads from the target's own hidden states (EAGLE-3 with training-time test).

Pipeline: ``corpus`` cuts installed packages' sources into chats and ``data.respond`` has the target
answer the instruction prompts of ``prompts`` (self-distillation: the head learns the text the target
itself writes); ``data.extract`` runs those sequences through the engine with
``extract_hidden_states`` (the three auxiliary layers and the last layer's pre-norm output, one
safetensors file per prompt); ``vocab.draft_vocabulary`` picks the reduced draft vocabulary from
token frequencies; ``eagle3.Eagle3Trainer`` trains a head against the target's own next-token
distribution at every position and writes it in the ``speculators`` format the loader (and vLLM) read.
"""
