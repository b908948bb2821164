"""A run's life inside the train step: the codes the step keeps a run's status under, the
status (normstudy.records.schema) each stands for, and the reason a halted run gives.

The train step (normstudy.core.steps) stores a code in the train state, deciding inside the
compiled step whether a run finished or halted and why; the loop turns codes into the statuses
and reasons run.json records.
"""

from normstudy.records import schema

# The codes of `TrainState.status`: the status the compiled step decides, with the halt's cause.
CODE_RUNNING, CODE_FINISHED, CODE_HALTED_NONFINITE, CODE_HALTED_SKIPS, CODE_HALTED_SCALE = range(5)
# Each halting code's kind (normstudy.records.schema.HaltKind: run.json's words and value).
HALT_KINDS = {CODE_HALTED_NONFINITE: schema.HaltKind.NONFINITE,
              CODE_HALTED_SKIPS: schema.HaltKind.SKIPS,
              CODE_HALTED_SCALE: schema.HaltKind.LOSS_SCALE}


def status_of(code: int) -> str:
  """The status a train-state code stands for."""
  code = int(code)
  if code == CODE_RUNNING:
    return schema.RUNNING
  return schema.FINISHED if code == CODE_FINISHED else schema.HALTED


def halt_description(config, code: int, record: dict) -> tuple[schema.HaltKind, str, str]:
  """(the kind, short reason for run.json, the sentence of the halt line) of a run halted with
  `code`, from its last record (step, loss, grad_norm)."""
  kind = HALT_KINDS[int(code)]
  step = record["step"]
  values = f"loss={record['loss']}, grad_norm={record['grad_norm']}"
  if kind is schema.HaltKind.LOSS_SCALE:
    min_scale = config.optimizer.loss_scale.min_scale
    return (kind, f"{kind.words} ({min_scale:g})",
            f"fp16 gradients overflowed again at step {step} with the loss scale at its minimum "
            f"({min_scale:g}, config.optimizer.loss_scale.min_scale)")
  if kind is schema.HaltKind.SKIPS:
    limit = config.train.max_consecutive_skips
    return (kind, f"{limit + 1} {kind.words}",
            f"non-finite gradient at step {step} ({values}): {limit + 1} consecutive skipped "
            f"updates, more than config.train.max_consecutive_skips={limit}")
  return (kind, kind.words,
          f"non-finite gradient at step {step} ({values}); config.train.on_nonfinite=halt")
