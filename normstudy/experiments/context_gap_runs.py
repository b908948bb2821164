"""What a trained masked-prediction model takes from context beyond a window: each run's loss on
its evaluation rows, intact and with every token beyond `window` positions of the predicted
segment taken from another document (normstudy.data.splice), row by row.

  rows = measure(run_dir, window=2)     # one dict per evaluation row of the run
  write_rows(workdir, window)           # every finished run below workdir -> context_gap_rows.csv

The run's parameters are those of its program's newest checkpoint (run.json's `checkpoints` and
`program_index`), its evaluation rows the loop's own (the first train.eval_steps batches of
validation rows, masked by train.eval_seed), and each row's donor the validation row as many rows
later as there are evaluation rows: another document when a document spans at most that many
rows (the synthetic languages' 4,096-token documents are 64 rows of 64 tokens; `make attention`
evaluates 512 rows). The tests over these rows are normstudy.analysis.context_gap_report's.
"""

import csv
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from normstudy.core import steps as steps_lib
from normstudy.data import batches as batches_lib
from normstudy.data import sources
from normstudy.data import splice
from normstudy.engine import checkpoints
from normstudy.engine import platform
from normstudy.errors import UserError
from normstudy.records import rundir
from normstudy.records import schema

CHUNK = 256  # rows per forward pass


def run_parameters(run_dir: str):
  """(config, parameters) of a run: its config.json and its program's newest checkpoint,
  at the run's index on the stacked run axis."""
  info = rundir.RunDir(run_dir).info()
  if info.checkpoints is None or info.program_index is None:
    raise UserError(f"{run_dir}: run.json does not say where the run's checkpoints are "
                    "(written before `checkpoints` was recorded); train it again")
  directory = os.path.normpath(os.path.join(run_dir, info.checkpoints))
  steps = rundir.checkpointed_steps(directory)
  if not steps:
    raise UserError(f"{run_dir}: no checkpoint in {directory}")
  state = checkpoints.read_on_host(directory, max(steps))
  params = jax.tree.map(lambda x: np.asarray(x)[info.program_index], state["params"])
  config = ml_collections.ConfigDict(rundir.RunDir(run_dir).saved_config())
  return config, params


def _token_losses(config, params):
  """A compiled fn(tokens, mask) -> float32 [rows, length]: minus each token's log probability
  under the model (deterministic: no dropout)."""
  choices = platform.choices(jax.devices())
  outputs = steps_lib.make_output_step(config, choices.fusion_boundaries)  # as the loop's eval

  def token_losses(tokens, mask):
    logp = jax.nn.log_softmax(outputs(params, {"tokens": tokens, "mask": mask}), axis=-1)
    return -jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]

  losses = jax.jit(token_losses, compiler_options=choices.compiler_options)

  def in_chunks(tokens, mask):
    pad = -len(tokens) % CHUNK  # one compiled shape
    tokens = np.concatenate([tokens, np.repeat(tokens[-1:], pad, 0)])
    mask = np.concatenate([mask, np.repeat(mask[-1:], pad, 0)])
    out = [np.asarray(losses(tokens[i:i + CHUNK], mask[i:i + CHUNK]))
           for i in range(0, len(tokens), CHUNK)]
    return np.concatenate(out)[:len(tokens) - pad]

  return in_chunks


def measure(run_dir: str, window: int) -> list[dict]:
  """Per evaluation row of the run: its masked tokens' count and their summed loss intact and
  spliced (each segment on its own spliced row)."""
  config, params = run_parameters(run_dir)
  if config.model.causal:
    raise UserError(f"{run_dir}: a causal model; the context gap is measured on masked "
                    "prediction (an encoder)")
  splits = sources.load_splits(config)
  evals = batches_lib.eval_batches(config, splits)
  tokens = np.concatenate([b["tokens"] for b in evals])
  mask = np.concatenate([b["mask"] for b in evals]).astype(bool)
  rows = len(tokens)
  if len(splits.validation) < 2 * rows:
    raise UserError(f"{run_dir}: {len(splits.validation)} validation rows, fewer than twice "
                    f"the {rows} evaluation rows: no donor rows beyond them")
  np.testing.assert_array_equal(tokens, splits.validation[:rows])  # the loop's rows, in order
  donors = splits.validation[rows:2 * rows]
  token_losses = _token_losses(config, params)
  intact = token_losses(tokens, mask)
  spliced = splice.splice_segments(tokens, mask, donors, window)
  spliced_losses = token_losses(spliced["tokens"], spliced["mask"])
  spliced_sum = np.zeros(rows)
  np.add.at(spliced_sum, spliced["row"], (spliced_losses * spliced["target"]).sum(axis=1))
  info = rundir.RunDir(run_dir).info()
  return [{"run": info.name, "arm": info.arm, "seed": int(config.train.seed), "window": window,
           "row": r, "tokens": int(mask[r].sum()),
           "loss_intact_sum": float((intact[r] * mask[r]).sum()),
           "loss_spliced_sum": float(spliced_sum[r])} for r in range(rows)]


def finished_runs(workdir: str) -> list[str]:
  """The directories of the finished runs below `workdir`, sorted."""
  found = []
  for root, _, files in os.walk(workdir):
    if schema.RUN in files and rundir.RunDir(root).info().status == schema.FINISHED:
      found.append(root)
  return sorted(found)


def write_rows(workdir: str, window: int) -> str:
  """Measures every finished run below `workdir`; writes context_gap_rows.csv there; returns
  its path."""
  runs = finished_runs(workdir)
  if not runs:
    raise UserError(f"no finished run below {workdir}")
  path = os.path.join(workdir, schema.CONTEXT_GAP_ROWS)
  rows = []
  for run_dir in runs:
    rows += measure(run_dir, window)
  with open(path + ".tmp", "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, schema.CONTEXT_GAP_ROWS_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
  os.replace(path + ".tmp", path)
  return path
