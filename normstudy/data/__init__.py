"""Data: sources of token rows (the synthetic languages, text files, TFDS catalog datasets),
tokenizers, loss floors and batches. Imports only the errors."""
