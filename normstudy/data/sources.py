"""Where a run's tokens come from: a source's documents -> packed rows of `max_len` in a train
and a validation split (`load_splits`), with the reference losses the source knows.

Sources: `synthetic` (normstudy.data.synthetic, generated locally; its floors:
normstudy.data.floors), `text_files` (UTF-8 files, byte-level tokens), the real-text corpora
`shakespeare` and `kjv` (normstudy.data.corpora, installed from pinned packages) and TFDS
catalog datasets (the last two tokenized by normstudy.data.tokenizers). Rows become batches in normstudy.data.batches.
"""

import contextlib
import dataclasses
import glob
import hashlib
import io
import json
import os
from typing import Optional

from absl import logging
import numpy as np

from normstudy import errors
from normstudy.data import floors
from normstudy.data import tokenizers

# Besides any TFDS catalog dataset with a text feature; the real-text corpora are
# normstudy.data.corpora's (kept in step by tests/test_data.py).
DATASETS = ("synthetic", "text_files", "shakespeare", "kjv")


@dataclasses.dataclass
class TokenSplits:
  train: np.ndarray  # int32 [rows, max_len]
  validation: np.ndarray  # int32 [rows, max_len]
  entropy_floor: Optional[float]  # nats per token; None when the source does not know it
  source: str
  # The synthetic chain's reference losses (None elsewhere): the unigram entropy H(pi) (a model
  # that uses no context), and for masked prediction the Bayes-optimal loss under the run's
  # masking with its Monte Carlo standard error (normstudy.data.synthetic.masked_loss_floor).
  unigram_entropy: Optional[float] = None
  masked_loss_floor: Optional[float] = None
  masked_loss_floor_stderr: Optional[float] = None


def pack(documents, max_len: int) -> np.ndarray:
  """Concatenates documents and cuts the stream into full rows of `max_len` tokens."""
  stream = np.concatenate([np.asarray(d, np.int32).ravel() for d in documents])
  rows = len(stream) // max_len
  if rows == 0:
    raise ValueError(f"only {len(stream)} tokens, fewer than one row of max_len={max_len}")
  return stream[: rows * max_len].reshape(rows, max_len)


# normstudy.data.synthetic.DOC_LENGTH (the generator writes whole documents), known here so that
# validation sizes a split without importing tensorflow_datasets; synthetic cannot import it
# back (data imports synthetic), so tests/test_reliability.py checks the two agree.
SYNTHETIC_DOC_LENGTH = 4096


def synthetic_tokens(requested: int) -> int:
  """The tokens a synthetic split holds for `requested`: whole documents, at least one."""
  return max(1, -(-requested // SYNTHETIC_DOC_LENGTH)) * SYNTHETIC_DOC_LENGTH


def _synthetic(config) -> TokenSplits:
  from normstudy.data import synthetic  # imports tensorflow_datasets; only needed here
  data_cfg, max_len, vocab_size = config.data, config.model.max_len, config.model.vocab_size
  builder = synthetic.builder(data_cfg, vocab_size)
  if not os.path.isdir(builder.data_dir):
    logging.info("generating the synthetic language %s into %s", builder.builder_config.name,
                 builder.data_dir)
  # tfds prints "Downloading and preparing dataset ..." to stdout for every builder; nothing is
  # downloaded here, so its words are kept off the terminal.
  with contextlib.redirect_stdout(io.StringIO()):
    builder.download_and_prepare(file_format="array_record")
  splits = {}
  for split in ("train", "validation"):
    source = builder.as_data_source(split=split)
    splits[split] = pack((source[i]["tokens"] for i in range(len(source))), max_len)
  matrices = builder.matrices()
  floor = stderr = None
  if not config.model.causal:
    floor, stderr = floors.masked_floor(builder.data_dir, matrices, data_cfg, max_len)
  # The chain's floor is its entropy rate; the context language's, the Bayes loss of a causal
  # model that sees one row (the dialect is inferred from the row).
  entropy_floor = (float(builder.info.metadata["entropy_rate"]) if data_cfg.dialects == 1 else
                   floors.causal_floor(builder.data_dir, matrices, data_cfg, max_len))
  return TokenSplits(splits["train"], splits["validation"], entropy_floor,
                     f"synthetic_markov/{builder.builder_config.name}",
                     unigram_entropy=synthetic.mixture_unigram_entropy(matrices),
                     masked_loss_floor=floor, masked_loss_floor_stderr=stderr)


def _read_utf8(path: str) -> bytes:
  """A text file's bytes; ValueError naming the file and the first byte that is not UTF-8."""
  with open(path, "rb") as f:
    content = f.read()
  try:
    content.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{path} is not UTF-8 text (byte {e.start} is {content[e.start]:#04x}); "
                     "config.data.files must match UTF-8 text files") from None
  return content


def _text_file_paths(data_cfg) -> list:
  paths = sorted(p for p in glob.glob(data_cfg.files, recursive=True) if os.path.isfile(p))
  if not paths:
    raise ValueError(f"config.data.files={data_cfg.files!r} matches no file")
  return paths


def _check_size(data_cfg, total: int, files: int, max_len: int) -> int:
  """Where the corpus of `total` bytes is cut into training and validation; ValueError unless
  each part holds a row."""
  cut = int(total * (1 - data_cfg.validation_fraction))
  need = 2 * max_len / min(data_cfg.validation_fraction, 1 - data_cfg.validation_fraction)
  if cut < max_len or total - cut < max_len:
    raise ValueError(
        f"config.data.files={data_cfg.files!r} holds {total} bytes in {files} "
        f"file(s): too little for one training and one validation row of config.model.max_len="
        f"{max_len} bytes with config.data.validation_fraction={data_cfg.validation_fraction} "
        f"(needs about {int(need)} bytes)")
  return cut


def check_files(config) -> None:
  """ConfigError unless the files a text_files config names are there, are UTF-8 and hold a
  training and a validation row (what loading them would find, asked before a run's directory
  is created)."""
  data_cfg = config.data
  if data_cfg.name != "text_files":
    return
  try:
    paths = _text_file_paths(data_cfg)
    for path in paths:
      _read_utf8(path)
    _check_size(data_cfg, sum(os.path.getsize(p) for p in paths), len(paths),
                config.model.max_len)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None
  except OSError as e:
    raise errors.ConfigError(f"config.data.files={data_cfg.files!r}: {e.filename} cannot be "
                             f"read ({e.strerror})") from None


def _text_files(data_cfg, max_len: int) -> TokenSplits:
  paths = _text_file_paths(data_cfg)
  stream = np.concatenate(
      [np.frombuffer(_read_utf8(p), np.uint8) for p in paths]).astype(np.int32)
  cut = _check_size(data_cfg, len(stream), len(paths), max_len)
  return TokenSplits(pack([stream[:cut]], max_len), pack([stream[cut:]], max_len), None,
                     f"text_files:{data_cfg.files}")


def _corpus_cache(config, corpus) -> str:
  """Where a corpus's encoded splits (and its trained SentencePiece model) are kept: beside the
  dataset, named by what decides them (the archive, the split, the tokenizer)."""
  data_cfg = config.data
  if data_cfg.tokenizer in ("bytes", "train"):
    tokenizer = "bytes" if data_cfg.tokenizer == "bytes" else f"sp{config.model.vocab_size}"
  elif not os.path.exists(data_cfg.tokenizer):
    raise ValueError(f"config.data.tokenizer={data_cfg.tokenizer!r}: no such SentencePiece model")
  else:
    with open(data_cfg.tokenizer, "rb") as f:
      tokenizer = "sp-" + hashlib.sha256(f.read()).hexdigest()[:12]
  root = os.path.expanduser(data_cfg.data_dir or default_dir())
  return os.path.join(root, "corpora", f"{corpus.name}-{corpus.sha256[:12]}-"
                      f"val{data_cfg.validation_fraction:g}-{tokenizer}")


def _corpus(config) -> TokenSplits:
  """A real-text corpus (normstudy.data.corpora), split by document, tokenized, cached."""
  from normstudy.data import corpora
  data_cfg, max_len = config.data, config.model.max_len
  corpus = corpora.CORPORA[data_cfg.name]
  stem = _corpus_cache(config, corpus)
  cached = f"{stem}.npz"
  if not os.path.exists(cached):
    train, validation = corpora.split_documents(corpora.documents(corpus),
                                                data_cfg.validation_fraction)
    # SentencePiece trains on lines (it skips a "sentence" longer than 4192 bytes).
    encode, separator = tokenizers.tokenizer(
        data_cfg, config.model.vocab_size,
        lambda: [line for _, text in train for line in text.splitlines() if line],
        model_path=f"{stem}.model")
    streams = {name: np.concatenate([np.asarray(encode(text) + separator, np.int32)
                                     for _, text in docs])
               for name, docs in (("train", train), ("validation", validation))}
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    partial = f"{stem}.{os.getpid()}.partial.npz"
    np.savez(partial, **streams,
             documents=np.array(json.dumps({"train": [n for n, _ in train],
                                            "validation": [n for n, _ in validation]})))
    os.replace(partial, cached)
  with np.load(cached) as saved:
    streams = {name: saved[name] for name in ("train", "validation")}
  if streams["train"].max() >= config.model.vocab_size:
    raise ValueError(f"data.name={corpus.name} with data.tokenizer={data_cfg.tokenizer!r} has "
                     f"token ids up to {int(streams['train'].max())}: config.model.vocab_size="
                     f"{config.model.vocab_size} must be above that")
  return TokenSplits(pack([streams["train"]], max_len), pack([streams["validation"]], max_len),
                     None, f"{corpus.name}:{corpus.requirement}:{data_cfg.tokenizer}",
                     unigram_entropy=corpora.unigram_entropy(streams["train"]))


def corpus_documents(config) -> dict:
  """{"train": [...], "validation": [...]}: the names of the documents in each split of a
  corpus's cached splits (after load_splits built them)."""
  from normstudy.data import corpora
  with np.load(f"{_corpus_cache(config, corpora.CORPORA[config.data.name])}.npz") as saved:
    return json.loads(str(saved["documents"]))


def check_corpus(config) -> None:
  """ConfigError unless a corpus config's archive is installed and intact (asked before a run's
  directory is created)."""
  from normstudy.data import corpora
  corpus = corpora.CORPORA.get(config.data.name)
  if corpus is None:
    return
  try:
    corpora.read_archive(corpus)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from None


def is_catalog_dataset(name: str) -> bool:
  """Whether `name` is in the TFDS catalog, in tfds's own syntax ("lm1b", "c4/en",
  "lm1b:1.1.0", a community "namespace:name"). Community datasets are listed only for a
  namespaced name: listing them imports TensorFlow and asks the network (seconds, and a stall
  offline, with tensorflow-datasets 4.9.10); the catalog that ships with tfds is listed
  without either."""
  import tensorflow_datasets as tfds
  try:
    dataset, _ = tfds.core.naming.parse_builder_name_kwargs(name)
  except ValueError:
    return False
  if dataset.namespace:
    return str(dataset) in tfds.list_builders(with_community_datasets=True)
  return dataset.name in tfds.list_builders(with_community_datasets=False)


def read_texts(data_cfg, split: str, budget_bytes: int):
  """Texts of a TFDS split, in order, until about `budget_bytes` bytes (never the whole of c4)."""
  import tensorflow_datasets as tfds
  ds = tfds.load(data_cfg.name, split=split, data_dir=data_cfg.data_dir, shuffle_files=False)
  total = 0
  for example in tfds.as_numpy(ds):
    if data_cfg.text_feature not in example:
      raise ValueError(f"config.data.text_feature={data_cfg.text_feature!r} is not a feature of "
                       f"{data_cfg.name}; features: {', '.join(sorted(example))}")
    text = example[data_cfg.text_feature]
    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
    yield text
    total += len(text.encode("utf-8")) + 1
    if total >= budget_bytes:
      return


def _validation_split(data_cfg) -> str:
  if data_cfg.validation_split:
    return data_cfg.validation_split
  import tensorflow_datasets as tfds
  known = list(tfds.builder(data_cfg.name, data_dir=data_cfg.data_dir).info.splits)
  return next((s for s in ("validation", "test") if s in known), "validation")


def _catalog(config) -> TokenSplits:
  data_cfg, max_len = config.data, config.model.max_len
  encode, separator = tokenizers.tokenizer(
      data_cfg, config.model.vocab_size,
      lambda: read_texts(data_cfg, "train", data_cfg.tokenizer_train_bytes))
  splits = {}
  for split, tokens in (("train", data_cfg.train_tokens),
                        (_validation_split(data_cfg), data_cfg.validation_tokens)):
    # A token is at most a few bytes; read generously, then cut the packed rows to size.
    docs = [np.asarray(encode(t) + separator, np.int32)
            for t in read_texts(data_cfg, split, 4 * tokens)]
    rows = pack(docs, max_len)
    splits[split] = rows[: max(1, -(-tokens // max_len))]
  train, validation = splits.values()
  return TokenSplits(train, validation, None, f"tfds:{data_cfg.name}:{data_cfg.tokenizer}")


def default_dir() -> str:
  """Where TFDS keeps datasets when config.data.data_dir is None (~/tensorflow_datasets, or
  $TFDS_DATA_DIR)."""
  import tensorflow_datasets as tfds
  return os.path.expanduser(tfds.core.constants.DATA_DIR)


def check_name(name: str) -> None:
  """ConfigError unless `name` is a built-in source or a TFDS catalog dataset."""
  if name not in DATASETS and not is_catalog_dataset(name):
    raise errors.not_allowed("data.name", name, f"{', '.join(DATASETS)} or a TFDS catalog "
                             "dataset with a text feature (lm1b, c4/en, ...)")


def load_splits(config) -> TokenSplits:
  """The config's train and validation rows, building the dataset first where it is generated
  or prepared (under `data.data_dir`); a disk that fills meanwhile is one line naming it."""
  name = config.data.name
  check_name(name)
  if name == "text_files":
    return _text_files(config.data, config.model.max_len)
  try:
    if name in ("shakespeare", "kjv"):
      return _corpus(config)
    return _synthetic(config) if name == "synthetic" else _catalog(config)
  except Exception as exc:
    if errors.disk_full(exc):
      raise errors.UserError(
          f"disk full while building the dataset {name} in config.data.data_dir="
          f"{config.data.data_dir or '(the TFDS default, ~/tensorflow_datasets)'!r}; free space "
          "on that filesystem, or set --config.data.data_dir to another, then run the same "
          "command") from None
    raise


