"""What trained masked-prediction models take from context beyond a window, and what the
language itself makes possible.

  python -m normstudy.context_gap --workdir=DIR [--window=2]
  python -m normstudy.context_gap --floors [--config=configs/context.py] [--window=2]

For every finished run below DIR (an encoder: masked prediction), its evaluation rows' masked
segments are predicted twice: on the intact row, and on a row whose tokens beyond --window
positions of the segment come from another document (normstudy.data.splice). Writes
context_gap_rows.csv (per run and row), context_gap.csv (per run: the losses, the gap, its tests
over rows) and context_gap_tests.csv (per arm, and each pair of arms paired by seed) into DIR.
A model without attention sees only its position convolution's 5-token window: at --window=2
its gap is 0 up to float32 rounding, the control.

With --floors, no runs: for the config's language and for the seed figure's chain at the same
masking (one dialect), the unigram entropy, the masked loss floor with its standard error, the
Bayes bound of a model that sees --window tokens either side (the gap a model can gain from
attention at most) and the causal floor (normstudy.data.floors.language_floors).
"""

# normstudy.cli before the libraries: from its first line, Ctrl-C while they import is one line.
from normstudy import cli  # pylint: disable=g-bad-import-order

from absl import flags

from normstudy import errors

FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("workdir", None, "Directory holding finished runs (searched recursively).")
  flags.DEFINE_integer("window", 2, "Tokens kept on each side of a predicted segment.")
  flags.DEFINE_bool("floors", False, "Print the language's loss floors and window bound "
                    "(--config's, and its one-dialect chain) instead of measuring runs.")
  flags.DEFINE_string("config", "configs/context.py", "With --floors: the config file[:arm] "
                      "whose language is measured.")


def main(argv):
  import os
  if len(argv) > 1:
    raise errors.UserError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.window < 0:
    raise errors.UserError(f"--window={FLAGS.window}: it must be an integer >= 0")
  if FLAGS.floors:
    _print_floors(FLAGS.config, FLAGS.window)
    return
  if FLAGS.workdir is None:
    raise errors.UserError("--workdir=DIR is required (a directory of finished runs), or "
                           "--floors for the language's floors")
  if not os.path.isdir(FLAGS.workdir):
    raise errors.UserError(f"--workdir={FLAGS.workdir} is not a directory")
  from normstudy.analysis import context_gap_report as analysis
  from normstudy.experiments import context_gap_runs
  outputs = {"context_gap_rows": context_gap_runs.write_rows(FLAGS.workdir, FLAGS.window)}
  outputs.update(analysis.analyze(FLAGS.workdir))
  for name, path in outputs.items():
    print(f"{name}: {path}")



def _print_floors(spec: str, half: int) -> None:
  """--floors: the config's language and its one-dialect chain, one line each."""
  import time
  from normstudy.data import floors as floors_lib
  from normstudy.experiments import grid
  path, _, arm = spec.partition(":")
  declared = grid.load_experiment(path)
  config, chain = declared.get_config(arm or None), declared.get_config(arm or None)
  chain.data.dialects = 1
  print(f"{floors_lib.FLOOR_ROWS} fresh rows of {config.model.max_len} tokens, masking "
        f"p={config.data.mask_prob} length {config.data.mask_length}; window: +-{half} tokens")
  for name, cfg in (("context language", config), ("Markov chain", chain)):
    start = time.time()
    f = floors_lib.language_floors(cfg, half)
    print(f"{name} (dialects={cfg.data.dialects}, weight={cfg.data.dialect_weight:g}): "
          f"unigram entropy {f['unigram']:.3f}, masked floor {f['masked']:.3f} +- "
          f"{f['stderr']:.3f}, window bound {f['window']:.3f} (gap {f['window'] - f['masked']:.3f}"
          f" nats), causal floor {f['causal']:.3f}  [{time.time() - start:.0f} s]", flush=True)


if __name__ == "__main__":
  cli.run(main, define_flags)
