"""Input pipeline: token documents -> packed rows of `max_len` -> shuffled batches (grain).

Every batch is a pure function of (config, batch index): rows are packed once in memory, grain's
`MapDataset` shuffles by seed per epoch, and encoder span masks come from `random_map`, whose
generator is seeded by the element index. A run at step s reads batch s - 1, so a resumed run sees
exactly the batches it would have seen, and the runs of a sweep each read their own order.
"""

import contextlib
import dataclasses
import glob
import io
import os
from typing import Optional

from absl import logging
import grain
import numpy as np

from normstudy import errors

DATASETS = ("synthetic", "text_files")  # besides any TFDS catalog dataset with a text feature


@dataclasses.dataclass
class TokenSplits:
  train: np.ndarray  # int32 [rows, max_len]
  validation: np.ndarray  # int32 [rows, max_len]
  entropy_floor: Optional[float]  # nats per token; None when the source does not know it
  source: str
  # The synthetic chain's reference losses (None elsewhere): the unigram entropy H(pi) (a model
  # that uses no context), and for masked prediction the Bayes-optimal loss under the run's
  # masking with its Monte Carlo standard error (normstudy.synthetic.masked_loss_floor).
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


# Fresh rows of the generator the masked loss floor is estimated from: about 5 s at the seed
# figure's size, standard error about 0.005 nats (512 rows gave 0.025, and a draw 1.5 standard
# errors low). Computed once per dataset and masking, then read from the dataset's directory.
FLOOR_ROWS = 8192
FLOOR_SEED = 7_000_003  # the fresh rows' and masks' seed: neither the splits' nor an eval set's


# normstudy.synthetic.DOC_LENGTH (the generator writes whole documents), known here so that
# validation sizes a split without importing tensorflow_datasets; synthetic cannot import it
# back (data imports synthetic), so tests/test_reliability.py checks the two agree.
SYNTHETIC_DOC_LENGTH = 4096


def synthetic_tokens(requested: int) -> int:
  """The tokens a synthetic split holds for `requested`: whole documents, at least one."""
  return max(1, -(-requested // SYNTHETIC_DOC_LENGTH)) * SYNTHETIC_DOC_LENGTH


def _synthetic(config) -> TokenSplits:
  from normstudy import synthetic  # imports tensorflow_datasets; only needed here
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
    floor, stderr = _masked_floor(builder.data_dir, matrices, data_cfg, max_len)
  # The chain's floor is its entropy rate; the context language's, the Bayes loss of a causal
  # model that sees one row (the dialect is inferred from the row).
  entropy_floor = (float(builder.info.metadata["entropy_rate"]) if data_cfg.dialects == 1 else
                   _causal_floor(builder.data_dir, matrices, data_cfg, max_len))
  return TokenSplits(splits["train"], splits["validation"], entropy_floor,
                     f"synthetic_markov/{builder.builder_config.name}",
                     unigram_entropy=synthetic.mixture_unigram_entropy(matrices),
                     masked_loss_floor=floor, masked_loss_floor_stderr=stderr)


def floor_rows(matrices, data_cfg, max_len: int) -> tuple[np.ndarray, np.ndarray]:
  """The FLOOR_ROWS fresh rows of the language and their masks (masked as training masks) that
  the loss floors are estimated from."""
  from normstudy import synthetic
  rows = synthetic.sample_mixture_documents(matrices, FLOOR_ROWS, max_len, seed=FLOOR_SEED)
  masks = span_mask(np.random.default_rng(FLOOR_SEED), FLOOR_ROWS, max_len, data_cfg.mask_prob,
                    data_cfg.mask_length)
  return rows, masks


def _cached_floor(path: str, compute) -> tuple[float, float]:
  """(floor, standard error) read from `path`, else computed and written there atomically
  (workers may compute it together; a read-only dataset directory computes it each time)."""
  import json
  try:
    with open(path) as f:
      cached = json.load(f)
    return cached["floor"], cached["stderr"]
  except (OSError, ValueError, KeyError):
    pass
  floor, stderr = compute()
  try:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
      json.dump({"floor": floor, "stderr": stderr, "rows": FLOOR_ROWS}, f)
    os.replace(temporary, path)
  except OSError:
    pass
  return floor, stderr


def _masked_floor(data_dir: str, matrices, data_cfg, max_len: int) -> tuple[float, float]:
  """(masked loss floor, its standard error) from FLOOR_ROWS fresh rows of the language
  (normstudy.synthetic.masked_loss_floor); cached beside the dataset, keyed by everything it
  depends on."""
  from normstudy import synthetic

  def compute():
    rows, masks = floor_rows(matrices, data_cfg, max_len)
    return synthetic.masked_loss_floor(matrices, rows, masks)
  return _cached_floor(os.path.join(
      data_dir, f"masked_floor_L{max_len}_p{data_cfg.mask_prob}_m{data_cfg.mask_length}"
      f"_n{FLOOR_ROWS}_s{FLOOR_SEED}.json"), compute)


def _causal_floor(data_dir: str, matrices, data_cfg, max_len: int) -> float:
  """The context language's causal loss floor (normstudy.synthetic.causal_loss_floor) from the
  FLOOR_ROWS fresh rows; cached beside the dataset."""
  from normstudy import synthetic

  def compute():
    return synthetic.causal_loss_floor(matrices, floor_rows(matrices, data_cfg, max_len)[0])
  return _cached_floor(os.path.join(
      data_dir, f"causal_floor_L{max_len}_n{FLOOR_ROWS}_s{FLOOR_SEED}.json"), compute)[0]


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


def _read_texts(data_cfg, split: str, budget_bytes: int):
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


def sentencepiece_path(data_cfg, vocab_size: int) -> str:
  """Where a trained SentencePiece model is saved: beside the data, named by dataset and size."""
  import tensorflow_datasets as tfds
  root = data_cfg.data_dir or tfds.core.constants.DATA_DIR
  return os.path.join(os.path.expanduser(root),
                      f"{data_cfg.name.replace('/', '_')}_sp{vocab_size}.model")


def _tokenizer(data_cfg, vocab_size: int):
  """(encode: str -> list[int], separator ids) for config.data.tokenizer."""
  if data_cfg.tokenizer == "bytes":
    return (lambda text: list(text.encode("utf-8"))), [10]
  import sentencepiece as spm
  path = data_cfg.tokenizer
  if path == "train":
    path = sentencepiece_path(data_cfg, vocab_size)
    if not os.path.exists(path):  # trained once from the training split, as flax's lm1b does
      os.makedirs(os.path.dirname(path), exist_ok=True)
      texts = _read_texts(data_cfg, "train", data_cfg.tokenizer_train_bytes)
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(texts), model_prefix=path[: -len(".model")],
          vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
          hard_vocab_limit=False, minloglevel=2)
  elif not os.path.exists(path):
    raise ValueError(f"config.data.tokenizer={path!r}: no such SentencePiece model")
  processor = spm.SentencePieceProcessor(model_file=path)
  if processor.get_piece_size() > vocab_size:
    raise ValueError(f"the SentencePiece model {path} has {processor.get_piece_size()} pieces, "
                     f"more than config.model.vocab_size={vocab_size}")
  separator = [processor.eos_id()] if processor.eos_id() >= 0 else []
  return processor.encode, separator


def _catalog(config) -> TokenSplits:
  data_cfg, max_len = config.data, config.model.max_len
  encode, separator = _tokenizer(data_cfg, config.model.vocab_size)
  splits = {}
  for split, tokens in (("train", data_cfg.train_tokens),
                        (_validation_split(data_cfg), data_cfg.validation_tokens)):
    # A token is at most a few bytes; read generously, then cut the packed rows to size.
    docs = [np.asarray(encode(t) + separator, np.int32)
            for t in _read_texts(data_cfg, split, 4 * tokens)]
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
    return _synthetic(config) if name == "synthetic" else _catalog(config)
  except Exception as exc:
    if errors.disk_full(exc):
      raise errors.UserError(
          f"disk full while building the dataset {name} in config.data.data_dir="
          f"{config.data.data_dir or '(the TFDS default, ~/tensorflow_datasets)'!r}; free space "
          "on that filesystem, or set --config.data.data_dir to another, then run the same "
          "command") from None
    raise


def span_mask(rng: np.random.Generator, batch: int, length: int, mask_prob: float,
              mask_length: int) -> np.ndarray:
  """HuBERT/MERT span masking: per row, about mask_prob * length / mask_length span starts
  (stochastic rounding), drawn without replacement; each masks `mask_length` positions."""
  mask = np.zeros((batch, length), bool)
  mask_length = min(mask_length, length)
  for row in mask:
    num_spans = int(mask_prob * length / mask_length + rng.random())
    num_spans = min(max(num_spans, 1), length - mask_length + 1)
    for start in rng.choice(length - mask_length + 1, num_spans, replace=False):
      row[start:start + mask_length] = True
  return mask


def batches(config, rows: np.ndarray, *, train: bool, process_index: int = 0,
            process_count: int = 1) -> grain.MapDataset:
  """This process's share of every global batch: {"tokens"} (causal) or {"tokens", "mask"}
  (encoder), indexable and endless.

  The stream of rows is shuffled by seed (per epoch) and each row's span mask is seeded by its
  position in the stream, so global batch i is rows [i*B, (i+1)*B) of the stream whatever the
  number of processes; process p reads only rows i*B + p*B/P ... of each.
  """
  ds = grain.MapDataset.source(rows)
  if train:
    ds = ds.shuffle(seed=config.train.seed)
  ds = ds.repeat()
  if config.model.causal:
    ds = ds.map(lambda tokens: {"tokens": tokens})
  else:
    data_cfg = config.data
    seed = config.train.seed if train else eval_mask_seed(config.train)

    def add_mask(tokens, rng):
      mask = span_mask(rng, 1, len(tokens), data_cfg.mask_prob, data_cfg.mask_length)[0]
      return {"tokens": tokens, "mask": mask}

    ds = ds.random_map(add_mask, seed=seed)
  global_batch = config.train.batch_size
  if process_count == 1:
    return ds.batch(global_batch, drop_remainder=True)
  local_batch = global_batch // process_count
  stream = ds

  def local_row(k):
    step, j = divmod(k, local_batch)
    return stream[step * global_batch + process_index * local_batch + j]

  return grain.MapDataset.range(2**62).map(local_row).batch(local_batch, drop_remainder=True)


def eval_mask_seed(train_cfg) -> int:
  """The seed of the eval rows' span masks: config.train.eval_seed's, or with -1 the run's own
  train.seed's (older runs); offset so that no eval mask repeats a training row's."""
  eval_seed = train_cfg.get("eval_seed", -1)
  return (train_cfg.seed if eval_seed == -1 else eval_seed) + 1_000_003


def _process():
  import jax  # the process layout; jax is initialised by then
  return {"process_index": jax.process_index(), "process_count": jax.process_count()}


def train_batches(config, splits: TokenSplits) -> grain.MapDataset:
  """This process's share of training batch i at index i, for every i: a run at step s reads
  index s - 1, so a resumed run (and each run of a sweep, with its own seed) needs no iterator
  state beyond its step."""
  return batches(config, splits.train, train=True, **_process())


def eval_batches(config, splits: TokenSplits):
  """The same `eval_steps` validation batches at every evaluation, so evals are comparable."""
  ds = batches(config, splits.validation, train=False, **_process())
  return [ds[i] for i in range(config.train.eval_steps)]
