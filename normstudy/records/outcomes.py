"""How a run ended, judged from what it recorded: the failure rule, defined once. A search
bisects on it (normstudy.experiments.search_runner), sweep.json records it (`outcome`), and the
analysis reports it (outcomes.csv, the critical learning rate).

A run fails when it did not recover from what went wrong:
  halted: loss scale    float16's loss scale reached its floor: the overflows kept coming
  halted: non-finite    a non-finite gradient with nothing left to skip (train.on_nonfinite=halt,
                        or more than train.max_consecutive_skips in a row)
  diverged: non-finite  its loss went non-finite and stayed so to its end, for PERSIST_STEPS
                        steps or more, or for fewer with every update since skipped: its
                        parameters no longer change, so it cannot recover (a 10-step run at lr
                        1e3, NaN from step 2, the scale still halving, ends so)
  diverged: loss up     after warm-up its loss stayed above its first logged loss to its end, for
                        PERSIST_STEPS steps or more
Otherwise it survived, and how far it learned is said beside it:
  learning              its final eval loss below the learning threshold (halfway from the
                        unigram entropy, a model that uses no context, to the loss floor)
  not learning          at or above it: alive, on the plateau
  alive                 no threshold is known (a dataset without reference losses)
  in trouble            it ended inside a stretch of non-finite losses shorter than
                        PERSIST_STEPS in which some update was applied: neither failed nor
                        finished well; a survival law counts it right-censored at its end
  unfinished            still running, or preempted before its end
A skipped update or a non-finite stretch the run got past is a recovery, not a failure: fp16 loss
scaling exists to skip such steps. Recoveries are counted (`Outcome.recoveries`: the stretches of
skipped or non-finite steps after which the run went on).

Every judgement can be made at a horizon H below the run's end (`horizon`): the records after H
are left out, so one run of 480 steps says whether it failed within 120, 240 and 480.
"""

import dataclasses
import math

from normstudy.records import schema

# Steps a non-finite loss, or a loss above its start, must persist to the end of a run (or of a
# horizon) to be a divergence rather than a spike the run might still leave.
PERSIST_STEPS = 10

HALTED_SCALE = schema.HaltKind.LOSS_SCALE.outcome
HALTED_NONFINITE = schema.HaltKind.NONFINITE.outcome
DIVERGED_NONFINITE = "diverged: non-finite"
DIVERGED_LOSS_UP = "diverged: loss up"
IN_TROUBLE = "in trouble"
NOT_LEARNING = "not learning"
LEARNING = "learning"
ALIVE = "alive"
UNFINISHED = "unfinished"
FAILURES = (HALTED_SCALE, HALTED_NONFINITE, DIVERGED_NONFINITE, DIVERGED_LOSS_UP)
KINDS = FAILURES + (IN_TROUBLE, NOT_LEARNING, LEARNING, ALIVE, UNFINISHED)


@dataclasses.dataclass(frozen=True)
class Outcome:
  """A run's outcome (`kind`, one of KINDS), the step it did not recover from (`failed_at`: where
  the stretch of trouble it halted or diverged in began; None when it did not fail) and how many
  stretches of skipped or non-finite steps it recovered from (`recoveries`)."""
  kind: str
  failed_at: int | None = None
  recoveries: int = 0

  @property
  def failed(self) -> bool:
    return self.kind in FAILURES

  @property
  def status(self) -> str:
    """The status as summaries show it: halted, diverged, finished (also learning or not),
    running."""
    if self.kind.startswith("halted"):
      return schema.HALTED
    if self.kind.startswith("diverged"):
      return schema.DIVERGED
    return schema.RUNNING if self.kind == UNFINISHED else schema.FINISHED


def _finite(value) -> bool:
  return value is not None and math.isfinite(value)


def _final_stretch(steps, bad):
  """The first step of the stretch of consecutive bad logged steps that ends at the last logged
  step, or None when the last step is fine."""
  first = None
  for step, is_bad in zip(reversed(steps), reversed(bad)):
    if not is_bad:
      break
    first = step
  return first


def _recoveries(steps, troubled, until) -> int:
  """Stretches of consecutive troubled logged steps (skipped or non-finite) that the run went on
  from before `until` (the step it did not recover from; math.inf: its end)."""
  count, inside = 0, False
  for step, is_troubled in zip(steps, troubled):
    if step >= until:
      break
    if inside and not is_troubled:
      count += 1
    inside = is_troubled
  return count


def judge(steps, losses, skipped, eval_losses, info: schema.RunInfo, warmup_steps: int,
          horizon: int | None = None) -> Outcome:
  """The outcome of a run from its records: `steps`, `losses` and `skipped` of its logged steps
  (in order), `eval_losses` {step: eval loss}, its run.json (`info`: status, halt step and
  reason, reference losses) and warm-up; at `horizon` (None: its end) the records after it are
  left out."""
  end = horizon if horizon is not None else math.inf
  beyond = any(step > end for step in steps)
  kept = [i for i, step in enumerate(steps) if step <= end]
  steps = [int(steps[i]) for i in kept]
  losses = [float(losses[i]) for i in kept]
  skipped = [bool(skipped[i]) for i in kept]
  nonfinite = [not _finite(loss) for loss in losses]
  troubled = [s or n for s, n in zip(skipped, nonfinite)]
  if info.status == schema.HALTED and info.halt_step is not None and info.halt_step <= end:
    kind = schema.halt_kind(info).outcome
    # It failed where the trouble it halted in began (a float16 run halts after the scale has
    # halved through a whole stretch of overflows).
    first = _final_stretch(steps, troubled) or int(info.halt_step)
    return Outcome(kind, first, _recoveries(steps, troubled, first))
  if steps:
    start = losses[0]
    bad = [n or (step > warmup_steps and loss > start)
           for step, loss, n in zip(steps, losses, nonfinite)]
    first = _final_stretch(steps, bad)
    if first is not None and steps[-1] - first + 1 >= PERSIST_STEPS:
      kind = DIVERGED_NONFINITE if nonfinite[-1] else DIVERGED_LOSS_UP
      return Outcome(kind, first, _recoveries(steps, troubled, first))
  recoveries = _recoveries(steps, troubled, math.inf)
  reached = info.status == schema.FINISHED or beyond or bool(steps and steps[-1] >= end)
  if not reached:
    return Outcome(UNFINISHED, None, recoveries)
  # A run that ends inside a stretch of non-finite losses too short to call a divergence.
  stuck = _final_stretch(steps, nonfinite)
  if stuck is not None:
    since = [s for step, s in zip(steps, skipped) if step >= stuck]
    if all(since):  # nothing applied since: its parameters are those that went non-finite
      return Outcome(DIVERGED_NONFINITE, stuck, _recoveries(steps, troubled, stuck))
    return Outcome(IN_TROUBLE, None, _recoveries(steps, troubled, stuck))
  threshold = info.learning_threshold
  final = [loss for step, loss in sorted(eval_losses.items()) if step <= end]
  if threshold is None or not final:
    return Outcome(ALIVE, None, recoveries)
  return Outcome(LEARNING if _finite(final[-1]) and final[-1] < threshold else NOT_LEARNING,
                 None, recoveries)
