"""Data: sources of token rows (the synthetic languages, text files, TFDS catalog datasets),
tokenizers, loss floors and batches. Imports the core, the records and the errors."""
