"""memzoo natural-language models: GPT (and BERT in a later step)."""
