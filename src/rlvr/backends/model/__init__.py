"""Models: loading (hub names and folders), the tiny demo model, the live policy, the chat tokenizer."""
