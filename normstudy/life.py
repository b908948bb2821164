"""A run's life, in one place: its statuses, the codes the train step keeps them under, the
reason a halted run gives, where it first went non-finite, and what follows from each status.

Plain Python (no jax): the train step (normstudy.steps) stores a code in the train state, the loop
turns codes into statuses and reasons for run.json, the orchestration asks which runs still need
training, and the analysis asks which runs failed.

  running    training, or stopped before it was done (killed: the same command continues it)
  finished   reached its num_steps
  halted     stopped by its non-finite policy, its consecutive-skip limit, or the fp16 loss
             scale reaching its floor (the newest checkpoint holds the last good state)
  diverged   finished, but the analysis's divergence detector flags its loss (a judgement of
             the records, never written by the loop)
  preempted  stopped by SIGTERM/SIGINT or a preemption notice after checkpointing its step
"""

import dataclasses

RUNNING = "running"
FINISHED = "finished"
HALTED = "halted"
DIVERGED = "diverged"
PREEMPTED = "preempted"
STATUSES = (FINISHED, HALTED, DIVERGED, PREEMPTED, RUNNING)
FAILED = (HALTED, DIVERGED)

# The codes of `TrainState.status`: the status the compiled step decides, with the halt's cause.
CODE_RUNNING, CODE_FINISHED, CODE_HALTED_NONFINITE, CODE_HALTED_SKIPS, CODE_HALTED_SCALE = range(5)


def status_of(code: int) -> str:
  """The status a train-state code stands for."""
  code = int(code)
  if code == CODE_RUNNING:
    return RUNNING
  return FINISHED if code == CODE_FINISHED else HALTED


def failed(status) -> bool:
  """Whether a run's status is a failure (halted or diverged)."""
  return status in FAILED


def halt_description(config, code: int, record: dict) -> tuple[str, str]:
  """(short reason for run.json, the sentence of the halt line) of a run halted with `code`,
  from its last record (step, loss, grad_norm)."""
  step = record["step"]
  values = f"loss={record['loss']}, grad_norm={record['grad_norm']}"
  if code == CODE_HALTED_SCALE:
    min_scale = config.optimizer.loss_scale.min_scale
    return (f"loss scale at its minimum ({min_scale:g})",
            f"fp16 gradients overflowed again at step {step} with the loss scale at its minimum "
            f"({min_scale:g}, config.optimizer.loss_scale.min_scale)")
  if code == CODE_HALTED_SKIPS:
    limit = config.train.max_consecutive_skips
    return (f"{limit + 1} consecutive skipped updates",
            f"non-finite gradient at step {step} ({values}): {limit + 1} consecutive skipped "
            f"updates, more than config.train.max_consecutive_skips={limit}")
  return ("non-finite gradient",
          f"non-finite gradient at step {step} ({values}); config.train.on_nonfinite=halt")


def needs_training(info: dict, num_steps: int) -> bool:
  """Whether a run whose run.json holds `info` needs (more) training to reach `num_steps`:
  False for a halted run, and for one finished at exactly `num_steps`."""
  status = info.get("status")
  if status == HALTED:
    return False
  return not (status == FINISHED and info.get("last_step") == num_steps)


@dataclasses.dataclass(frozen=True)
class Site:
  """Where a forward pass first went non-finite: `layer` (None outside the layers) and `site`
  ("embedding", "attention scores", "residual stream", ..., "output logits", or
  "backward pass only" when every forward site was finite)."""
  layer: int | None
  site: str

  def sentence(self) -> str:
    """'layer 3 residual stream', 'output logits': the text of the halt line."""
    return self.site if self.layer is None else f"layer {self.layer} {self.site}"

  def as_json(self) -> dict:
    return {"layer": self.layer, "site": self.site}


BACKWARD_ONLY = Site(None, "backward pass only")
