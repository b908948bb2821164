"""Batches: packed rows -> shuffled, masked batches, every one a pure function of (config, batch
index) (grain's MapDataset).

The stream of rows is shuffled by seed per epoch and encoder span masks come from `random_map`,
whose generator is seeded by the element index. A run at step s reads batch s - 1, so a resumed
run sees exactly the batches it would have seen, and the runs of a sweep each read their own
order.
"""

import grain
import numpy as np

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


def train_batches(config, splits) -> grain.MapDataset:
  """This process's share of training batch i at index i, for every i: a run at step s reads
  index s - 1, so a resumed run (and each run of a sweep, with its own seed) needs no iterator
  state beyond its step."""
  return batches(config, splits.train, train=True, **_process())


def eval_batches(config, splits):
  """The same `eval_steps` validation batches at every evaluation, so evals are comparable."""
  ds = batches(config, splits.validation, train=False, **_process())
  return [ds[i] for i in range(config.train.eval_steps)]
