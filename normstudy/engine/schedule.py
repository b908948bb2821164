"""When the loop does what, from the config alone: which steps evaluate, checkpoint, log, take
telemetry, go alone, and where a block of steps ends (normstudy.engine.train's dispatches)."""


def due(every: int, step: int, last_steps: frozenset) -> bool:
  """Every `every`-th step (0: never) and each run's last step; never for -1 (a checkpoint
  interval that keeps no state at all)."""
  if every < 0:
    return False
  return bool(every and step % every == 0) or step in last_steps


def telemetry_due(train_cfg, step: int) -> bool:
  every = train_cfg.telemetry_every
  return bool(every) and step % every == 0


def steps_alone(train_cfg, last_steps: frozenset, step: int) -> bool:
  """Whether `step` is dispatched alone through the one-step programs: it takes telemetry,
  measures an update size, or the config steps one at a time (train.steps_per_dispatch 1).
  Every other step goes through the block program, a block of one included, so a plain step
  is always the same compiled computation however the steps are split into blocks."""
  return (train_cfg.steps_per_dispatch <= 1 or telemetry_due(train_cfg, step)
          or step <= train_cfg.update_size_steps or step > max(last_steps))


def dispatch_end(train_cfg, last_steps: frozenset, step: int) -> int:
  """The last step of the dispatch that begins at `step`: `step` itself when it goes alone;
  otherwise the block's: at most steps_per_dispatch steps, ending at the first step that
  evaluates, checkpoints or ends a run, or before a step that goes alone."""
  if steps_alone(train_cfg, last_steps, step):
    return step
  last = min(step + train_cfg.steps_per_dispatch - 1, max(last_steps))
  for s in range(step, last):
    if (due(train_cfg.eval_every, s, last_steps) or due(train_cfg.checkpoint_every, s, last_steps)
        or steps_alone(train_cfg, last_steps, s + 1)):
      return s
  return last
