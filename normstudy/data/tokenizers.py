"""Tokenizers of the text datasets: byte-level tokens, or a SentencePiece model (given, or
trained from the training split on first use, as flax's lm1b example does)."""

import os

def sentencepiece_path(data_cfg, vocab_size: int) -> str:
  """Where a trained SentencePiece model is saved: beside the data, named by dataset and size."""
  import tensorflow_datasets as tfds
  root = data_cfg.data_dir or tfds.core.constants.DATA_DIR
  return os.path.join(os.path.expanduser(root),
                      f"{data_cfg.name.replace('/', '_')}_sp{vocab_size}.model")


def tokenizer(data_cfg, vocab_size: int, training_texts, model_path: str | None = None):
  """(encode: str -> list[int], separator ids) for config.data.tokenizer: bytes, a SentencePiece
  model's path, or "train": a unigram SentencePiece model trained on first use from the texts
  `training_texts()` yields (at most data.tokenizer_train_bytes of the training split) and saved
  beside the data (`model_path`, by default `sentencepiece_path`). Training is deterministic:
  one thread, the texts in the order given (the same texts and vocabulary size give the same
  model, tests/test_data.py)."""
  if data_cfg.tokenizer == "bytes":
    return (lambda text: list(text.encode("utf-8"))), [10]
  import sentencepiece as spm
  path = data_cfg.tokenizer
  if path == "train":
    path = model_path or sentencepiece_path(data_cfg, vocab_size)
    if not os.path.exists(path):  # trained once from the training split, as flax's lm1b does
      os.makedirs(os.path.dirname(path), exist_ok=True)
      texts = training_texts()
      prefix = f"{path[: -len('.model')]}.{os.getpid()}.partial"
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(texts), model_prefix=prefix,
          vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
          hard_vocab_limit=False, minloglevel=2, num_threads=1, shuffle_input_sentence=False)
      os.replace(f"{prefix}.model", path)  # whole or not at all, for a run killed meanwhile
      os.remove(f"{prefix}.vocab")
  elif not os.path.exists(path):
    raise ValueError(f"config.data.tokenizer={path!r}: no such SentencePiece model")
  processor = spm.SentencePieceProcessor(model_file=path)
  if processor.get_piece_size() > vocab_size:
    raise ValueError(f"the SentencePiece model {path} has {processor.get_piece_size()} pieces, "
                     f"more than config.model.vocab_size={vocab_size}")
  separator = [processor.eos_id()] if processor.eos_id() >= 0 else []
  return processor.encode, separator
