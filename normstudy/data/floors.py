"""The loss floors of the synthetic languages, estimated once per dataset and masking from
FLOOR_ROWS fresh rows of the generator (normstudy.data.synthetic: exact per row, Monte Carlo over
rows) and cached beside the dataset."""

import json
import os

import numpy as np

from normstudy.data import batches

# Fresh rows of the generator the masked loss floor is estimated from: about 5 s at the seed
# figure's size, standard error about 0.005 nats (512 rows gave 0.025, and a draw 1.5 standard
# errors low). Computed once per dataset and masking, then read from the dataset's directory.
FLOOR_ROWS = 8192
FLOOR_SEED = 7_000_003  # the fresh rows' and masks' seed: neither the splits' nor an eval set's


def floor_rows(matrices, data_cfg, max_len: int) -> tuple[np.ndarray, np.ndarray]:
  """The FLOOR_ROWS fresh rows of the language and their masks (masked as training masks) that
  the loss floors are estimated from."""
  from normstudy.data import synthetic  # imports tensorflow_datasets; only needed here
  rows = synthetic.sample_mixture_documents(matrices, FLOOR_ROWS, max_len, seed=FLOOR_SEED)
  masks = batches.span_mask(np.random.default_rng(FLOOR_SEED), FLOOR_ROWS, max_len,
                            data_cfg.mask_prob, data_cfg.mask_length)
  return rows, masks


def _cached_floor(path: str, compute) -> tuple[float, float]:
  """(floor, standard error) read from `path`, else computed and written there atomically
  (workers may compute it together; a read-only dataset directory computes it each time)."""
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


def masked_floor(data_dir: str, matrices, data_cfg, max_len: int) -> tuple[float, float]:
  """(masked loss floor, its standard error) from FLOOR_ROWS fresh rows of the language
  (normstudy.data.synthetic.masked_loss_floor); cached beside the dataset, keyed by everything it
  depends on."""
  from normstudy.data import synthetic

  def compute():
    rows, masks = floor_rows(matrices, data_cfg, max_len)
    return synthetic.masked_loss_floor(matrices, rows, masks)
  return _cached_floor(os.path.join(
      data_dir, f"masked_floor_L{max_len}_p{data_cfg.mask_prob}_m{data_cfg.mask_length}"
      f"_n{FLOOR_ROWS}_s{FLOOR_SEED}.json"), compute)


def causal_floor(data_dir: str, matrices, data_cfg, max_len: int) -> float:
  """The context language's causal loss floor (normstudy.data.synthetic.causal_loss_floor) from the
  FLOOR_ROWS fresh rows; cached beside the dataset."""
  from normstudy.data import synthetic

  def compute():
    return synthetic.causal_loss_floor(matrices, floor_rows(matrices, data_cfg, max_len)[0])
  return _cached_floor(os.path.join(
      data_dir, f"causal_floor_L{max_len}_n{FLOOR_ROWS}_s{FLOOR_SEED}.json"), compute)[0]


def language_floors(config, half: int) -> dict:
  """What reading the whole row is worth on a synthetic language (the context language's
  question, `python -m normstudy.context_gap --floors`): from the FLOOR_ROWS fresh rows and
  masks the runs' floors come from, its unigram entropy (no context), the masked loss floor with
  its standard error (the whole row), the Bayes bound of a model that sees --half tokens either
  side (synthetic.window_loss_floor: what a model without attention sees through a position
  convolution of width 2 half + 1) and the causal entropy floor."""
  from normstudy.data import synthetic  # pylint: disable=import-outside-toplevel
  data_cfg, model = config.data, config.model
  matrices = synthetic.dialect_matrices(model.vocab_size, data_cfg.branching, data_cfg.seed,
                                        data_cfg.dialects, data_cfg.dialect_weight)
  rows, masks = floor_rows(matrices, data_cfg, model.max_len)
  floor, stderr = synthetic.masked_loss_floor(matrices, rows, masks)
  return {"unigram": synthetic.mixture_unigram_entropy(matrices), "masked": floor,
          "stderr": stderr, "window": synthetic.window_loss_floor(matrices, rows, masks, half),
          "causal": synthetic.causal_loss_floor(matrices, rows)[0]}
