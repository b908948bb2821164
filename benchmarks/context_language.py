"""What reading the whole row is worth on the context language, exactly: its loss floors against
the Bayes bound of any model that sees a window of tokens around the one it predicts.

  python benchmarks/context_language.py [--config=configs/context.py] [--half=2]

Printed for the config's language and for the seed figure's chain at the same masking, from the
same FLOOR_ROWS fresh rows and masks the runs' floors come from (normstudy.data.floors.floor_rows):
the unigram entropy (no context), the masked loss floor with its standard error (the whole row), the
window bound (normstudy.data.synthetic.window_loss_floor: the visible tokens within --half
positions, what a model without attention sees through a conv of width 2 half + 1; the miniature's
conv positions have width 5, half 2) and, for a causal model, the entropy floor.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from normstudy.data import floors as floors_lib  # noqa: E402
from normstudy.data import synthetic  # noqa: E402
from normstudy.experiments import grid  # noqa: E402


def floors(config, half: int) -> dict:
  data_cfg, model = config.data, config.model
  matrices = synthetic.dialect_matrices(model.vocab_size, data_cfg.branching, data_cfg.seed,
                                        data_cfg.dialects, data_cfg.dialect_weight)
  rows, masks = floors_lib.floor_rows(matrices, data_cfg, model.max_len)
  floor, stderr = synthetic.masked_loss_floor(matrices, rows, masks)
  return {"unigram": synthetic.mixture_unigram_entropy(matrices), "masked": floor,
          "stderr": stderr, "window": synthetic.window_loss_floor(matrices, rows, masks, half),
          "causal": synthetic.causal_loss_floor(matrices, rows)[0]}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/context.py")
  parser.add_argument("--half", type=int, default=2)
  args = parser.parse_args()
  path, _, variant = args.config.partition(":")
  declared = grid.load_experiment(path)
  config = declared.get_config(variant or None)
  chain = declared.get_config(variant or None)
  chain.data.dialects = 1
  print(f"{floors_lib.FLOOR_ROWS} fresh rows of {config.model.max_len} tokens, masking "
        f"p={config.data.mask_prob} length {config.data.mask_length}; window: +-{args.half} "
        "tokens")
  for name, cfg in (("context language", config), ("Markov chain", chain)):
    start = time.time()
    f = floors(cfg, args.half)
    print(f"{name} (dialects={cfg.data.dialects}, weight={cfg.data.dialect_weight:g}): "
          f"unigram entropy {f['unigram']:.3f}, masked floor {f['masked']:.3f} +- "
          f"{f['stderr']:.3f}, window bound {f['window']:.3f} (gap {f['window'] - f['masked']:.3f}"
          f" nats), causal floor {f['causal']:.3f}  [{time.time() - start:.0f} s]", flush=True)


if __name__ == "__main__":
  main()
