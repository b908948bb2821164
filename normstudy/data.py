"""Input pipeline: token documents -> packed rows of `max_len` -> shuffled batches (grain).

Every batch is a pure function of (config, batch index): rows are packed once in memory, grain's
`MapDataset` shuffles by seed per epoch, and encoder span masks come from `random_map`, whose
generator is seeded by the element index. The iterator's state is therefore just a position,
saved with each checkpoint, and a resumed run sees exactly the batches it would have seen.
"""

import dataclasses
import glob
from typing import Optional

import grain
import numpy as np

DATASETS = ("synthetic", "text_files")


@dataclasses.dataclass
class TokenSplits:
  train: np.ndarray  # int32 [rows, max_len]
  validation: np.ndarray  # int32 [rows, max_len]
  entropy_floor: Optional[float]  # nats per token; None when the source does not know it
  source: str


def pack(documents, max_len: int) -> np.ndarray:
  """Concatenates documents and cuts the stream into full rows of `max_len` tokens."""
  stream = np.concatenate([np.asarray(d, np.int32).ravel() for d in documents])
  rows = len(stream) // max_len
  if rows == 0:
    raise ValueError(f"only {len(stream)} tokens, fewer than one row of max_len={max_len}")
  return stream[: rows * max_len].reshape(rows, max_len)


def _synthetic(data_cfg, max_len: int, vocab_size: int) -> TokenSplits:
  from normstudy import synthetic  # imports tensorflow_datasets; only needed here
  builder = synthetic.builder(data_cfg, vocab_size)
  builder.download_and_prepare(file_format="array_record")
  splits = {}
  for split in ("train", "validation"):
    source = builder.as_data_source(split=split)
    splits[split] = pack((source[i]["tokens"] for i in range(len(source))), max_len)
  return TokenSplits(splits["train"], splits["validation"],
                     float(builder.info.metadata["entropy_rate"]),
                     f"synthetic_markov/{builder.builder_config.name}")


def _text_files(data_cfg, max_len: int) -> TokenSplits:
  paths = sorted(glob.glob(data_cfg.files, recursive=True))
  if not paths:
    raise ValueError(f"config.data.files={data_cfg.files!r} matches no file")
  stream = np.concatenate(
      [np.frombuffer(open(p, "rb").read(), np.uint8) for p in paths]).astype(np.int32)
  cut = int(len(stream) * (1 - data_cfg.validation_fraction))
  return TokenSplits(pack([stream[:cut]], max_len), pack([stream[cut:]], max_len), None,
                     f"text_files:{data_cfg.files}")


def load_splits(config) -> TokenSplits:
  name = config.data.name
  if name == "synthetic":
    return _synthetic(config.data, config.model.max_len, config.model.vocab_size)
  if name == "text_files":
    return _text_files(config.data, config.model.max_len)
  raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}")


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
    seed = config.train.seed if train else config.train.seed + 1_000_003

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


def _process():
  import jax  # the process layout; jax is initialised by then
  return {"process_index": jax.process_index(), "process_count": jax.process_count()}


def train_iterator(config, splits: TokenSplits) -> grain.DatasetIterator:
  """The training iterator; `get_state`/`set_state` (or orbax's grain handler) resume it."""
  return iter(batches(config, splits.train, train=True, **_process()).to_iter_dataset())


def eval_batches(config, splits: TokenSplits):
  """The same `eval_steps` validation batches at every evaluation, so evals are comparable."""
  ds = batches(config, splits.validation, train=False, **_process())
  return [ds[i] for i in range(config.train.eval_steps)]
