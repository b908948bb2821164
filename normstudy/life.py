"""A run's life, in one place: its statuses, the codes the train step keeps them under, the
reason a halted run gives, where it first went non-finite, and what follows from each status.

Plain Python (no jax): the train step (normstudy.steps) stores a code in the train state, the loop
turns codes into statuses and reasons for run.json, the orchestration asks which runs still need
training, and the analysis asks which runs failed.

  running    training, or stopped before it was done (killed: the same command continues it)
  finished   reached its num_steps
  halted     stopped by its non-finite policy, its consecutive-skip limit, or the fp16 loss
             scale reaching its floor (the newest checkpoint holds the last good state)
  preempted  stopped by SIGTERM/SIGINT or a preemption notice after checkpointing its step
These are the only statuses the loop writes (run.json, sweep.json). The analysis adds one
judgement of its own, derived from the records: `diverged` (normstudy.analysis.detectors).
"""

import dataclasses

RUNNING = "running"
FINISHED = "finished"
HALTED = "halted"
PREEMPTED = "preempted"
STATUSES = (FINISHED, HALTED, PREEMPTED, RUNNING)

# The codes of `TrainState.status`: the status the compiled step decides, with the halt's cause.
CODE_RUNNING, CODE_FINISHED, CODE_HALTED_NONFINITE, CODE_HALTED_SKIPS, CODE_HALTED_SCALE = range(5)


def status_of(code: int) -> str:
  """The status a train-state code stands for."""
  code = int(code)
  if code == CODE_RUNNING:
    return RUNNING
  return FINISHED if code == CODE_FINISHED else HALTED


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


# Where a forward pass can first go non-finite, in the order it computes them: the site ids the
# model's locate probe sows (normstudy.telemetry) and run.json's `nonfinite_site` stores, and
# their words (the halt line, run.json's `nonfinite_at`, the analysis's kinds of death).
# "backward" is no forward site: every forward value was finite and a gradient was not.
SITE_WORDS = {
    "embedding": "embedding",
    "attn_scores": "attention scores",
    "attn_out": "attention output",
    "resid_attn": "residual stream after attention",
    "mlp_preact": "MLP pre-activation",
    "mlp_out": "MLP output",
    "resid_mlp": "residual stream after the MLP",
    "logits": "output logits",
    "backward": "backward pass only",
}
# The sites inside each layer, in the order a layer computes them.
LAYER_SITES = ("attn_scores", "attn_out", "resid_attn", "mlp_preact", "mlp_out", "resid_mlp")


@dataclasses.dataclass(frozen=True)
class Site:
  """Where a forward pass first went non-finite: `layer` (None outside the layers) and `site`,
  an id of SITE_WORDS ("backward" when every forward site was finite)."""
  layer: int | None
  site: str

  @property
  def words(self) -> str:
    return SITE_WORDS[self.site]

  def sentence(self) -> str:
    """'layer 3 residual stream after attention', 'output logits': the halt line's text."""
    return self.words if self.layer is None else f"layer {self.layer} {self.words}"

  def as_json(self) -> dict:
    return {"layer": self.layer, "site": self.site}


BACKWARD_ONLY = Site(None, "backward")
