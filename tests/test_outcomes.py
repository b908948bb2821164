"""The failure rule (normstudy.records.outcomes) on recorded trajectories: a recovered skip, a
persistent overflow, a slow divergence, a short spike at the end, and each judged at a horizon
below the run's end. Expectations are worked out by hand from the rule's words."""

import math

import pytest

from normstudy.records import outcomes
from normstudy.records import schema

INF, NAN = math.inf, math.nan
# A run's reference losses: unigram entropy 4.0, masked floor 2.0, so learning is below 3.0.
FACTS = dict(unigram_entropy=4.0, masked_loss_floor=2.0, entropy_floor=1.8)


def _info(**life):
  return schema.RunInfo(**FACTS, **{"status": schema.FINISHED, **life})


def _run(losses, skipped=(), every=1):
  """steps every `every` from `every`, their losses, and skipped flags at the given steps."""
  steps = [every * (i + 1) for i in range(len(losses))]
  return steps, losses, [step in skipped for step in steps]


def test_a_skip_the_scaler_recovers_from_is_a_recovery_not_a_death():
  # fp16: after a doubling the scale overflows twice (the loss itself non-finite), halves twice,
  # and the run goes on to learn (final eval 2.5 < 3.0).
  losses = [5.0] * 49 + [INF, INF] + [4.0] * 49
  steps, losses, skipped = _run(losses, skipped={50, 51})
  ended = outcomes.judge(steps, losses, skipped, {100: 2.5}, _info(), warmup_steps=20)
  assert (ended.kind, ended.failed, ended.failed_at, ended.recoveries) == (
      outcomes.LEARNING, False, None, 1)
  # Three separate stretches, one skip without a non-finite loss among them: three recoveries.
  steps, losses, skipped = _run([5.0] * 100, skipped={10, 30, 31, 70})
  ended = outcomes.judge(steps, losses, skipped, {100: 3.5}, _info(), warmup_steps=20)
  assert (ended.kind, ended.recoveries) == (outcomes.NOT_LEARNING, 3)


def test_a_persistent_overflow_halts_by_the_loss_scale_and_fails_at_its_step():
  losses = [5.0] * 60 + [INF] * 30
  steps, losses, skipped = _run(losses, skipped=set(range(61, 91)))
  info = _info(status=schema.HALTED, halt_step=90, halt_reason="loss scale at its minimum (1)")
  ended = outcomes.judge(steps, losses, skipped, {}, info, warmup_steps=20)
  # It failed where the overflows it never left began, not where the scale hit its floor.
  assert (ended.kind, ended.failed, ended.failed_at) == (outcomes.HALTED_SCALE, True, 61)
  # Within 60 steps it had not yet failed: alive (no eval by then), no recovery either.
  early = outcomes.judge(steps, losses, skipped, {}, info, warmup_steps=20, horizon=60)
  assert (early.kind, early.failed) == (outcomes.ALIVE, False)
  # Within 75 it was 15 steps into an overflow that lasted to the horizon: diverged there.
  middle = outcomes.judge(steps, losses, skipped, {}, info, warmup_steps=20, horizon=75)
  assert (middle.kind, middle.failed_at) == (outcomes.DIVERGED_NONFINITE, 61)


def test_a_non_finite_halt_without_a_loss_scale():
  steps, losses, skipped = _run([5.0] * 40 + [NAN], skipped={41})
  info = _info(status=schema.HALTED, halt_step=41, halt_reason="non-finite gradient")
  ended = outcomes.judge(steps, losses, skipped, {}, info, warmup_steps=20)
  assert (ended.kind, ended.failed_at) == (outcomes.HALTED_NONFINITE, 41)
  assert ended.status == schema.HALTED


def test_the_halt_kind_is_run_jsons_field_and_the_words_only_for_older_files():
  """Issue 87: halt kinds lived in three vocabularies (the step's codes, phrases parsed back
  with startswith/endswith, outcome strings). normstudy.core.life maps each code to one
  schema.HaltKind, run.json records its value, and the outcome comes from it; the words are
  read only from a run.json written before halt_kind was."""
  from normstudy.core import life
  assert set(life.HALT_KINDS.values()) == set(schema.HaltKind)
  losses = [5.0] * 60 + [INF] * 30
  steps, losses, skipped = _run(losses, skipped=set(range(61, 91)))
  # The field decides, whatever the reason's words say.
  recorded = _info(status=schema.HALTED, halt_step=90, halt_kind="loss_scale",
                   halt_reason="anything")
  ended = outcomes.judge(steps, losses, skipped, {}, recorded, warmup_steps=20)
  assert ended.kind == outcomes.HALTED_SCALE == schema.HaltKind.LOSS_SCALE.outcome
  nonfinite = _info(status=schema.HALTED, halt_step=90, halt_kind="nonfinite",
                    halt_reason="loss scale at its minimum (1)")
  ended = outcomes.judge(steps, losses, skipped, {}, nonfinite, warmup_steps=20)
  assert ended.kind == outcomes.HALTED_NONFINITE
  # What the loop writes for each code round-trips through run.json.
  class Config:
    class optimizer:
      class loss_scale:
        min_scale = 1e-4
    class train:
      max_consecutive_skips = 8
  for code, kind in life.HALT_KINDS.items():
    got, reason, _ = life.halt_description(Config, code, {"step": 9, "loss": INF,
                                                          "grad_norm": INF})
    info = schema.RunInfo.from_json({"halt_kind": got.value, "halt_reason": reason})
    older = schema.RunInfo.from_json({"halt_reason": reason})
    assert got is kind and schema.halt_kind(info) is kind and schema.halt_kind(older) is kind


def test_a_slow_divergence_is_a_loss_that_stays_above_its_start():
  # Logged every 5 steps: 5.5 at the start, down to 4.0, then above 5.5 from step 70 to 120.
  losses = [5.5] + [4.0] * 12 + [5.6, 5.9, 6.3, 6.0, 6.8, 7.0, 7.5, 8.0, 8.4, 8.9, 9.0]
  steps, losses, skipped = _run(losses, every=5)
  assert steps[13] == 70 and steps[-1] == 120
  ended = outcomes.judge(steps, losses, skipped, {120: 9.0}, _info(), warmup_steps=20)
  assert (ended.kind, ended.failed_at, ended.status) == (
      outcomes.DIVERGED_LOSS_UP, 70, schema.DIVERGED)
  # At 75 steps it had been above its start for 6 steps: fewer than PERSIST_STEPS, not yet.
  assert outcomes.PERSIST_STEPS == 10
  early = outcomes.judge(steps, losses, skipped, {120: 9.0}, _info(), warmup_steps=20,
                         horizon=75)
  assert not early.failed and early.kind == outcomes.ALIVE
  at_80 = outcomes.judge(steps, losses, skipped, {120: 9.0}, _info(), warmup_steps=20,
                         horizon=80)
  assert (at_80.kind, at_80.failed_at) == (outcomes.DIVERGED_LOSS_UP, 70)
  # Before the warm-up's end a loss above the start is no divergence.
  warm = outcomes.judge(steps, losses, skipped, {120: 9.0}, _info(), warmup_steps=500)
  assert warm.kind == outcomes.NOT_LEARNING


def test_a_short_non_finite_stretch_at_the_end_fails_only_when_nothing_was_applied_since():
  # 5 NaN steps at the end, every update skipped: its parameters are those that went
  # non-finite, so it cannot recover: failed where the stretch began, though shorter than
  # PERSIST_STEPS.
  steps, losses, skipped = _run([5.0] * 95 + [NAN] * 5, skipped=set(range(96, 101)))
  ended = outcomes.judge(steps, losses, skipped, {100: 3.2}, _info(), warmup_steps=20)
  assert (ended.kind, ended.failed, ended.failed_at, ended.recoveries) == (
      outcomes.DIVERGED_NONFINITE, True, 96, 0)
  # The same stretch with an update applied inside it (step 98): it may still recover, so it
  # is neither failed nor finished well: in trouble, censored at its end.
  steps, losses, skipped = _run([5.0] * 95 + [NAN] * 5, skipped={96, 97, 99, 100})
  ended = outcomes.judge(steps, losses, skipped, {100: 3.2}, _info(), warmup_steps=20)
  assert (ended.kind, ended.failed, ended.failed_at) == (outcomes.IN_TROUBLE, False, None)
  assert ended.status == schema.FINISHED
  # Skipped steps with finite losses at the end are the scaler at work, not trouble.
  steps, losses, skipped = _run([5.0] * 100, skipped={98, 99, 100})
  ended = outcomes.judge(steps, losses, skipped, {100: 3.2}, _info(), warmup_steps=20)
  assert (ended.kind, ended.failed) == (outcomes.NOT_LEARNING, False)
  steps, losses, skipped = _run([5.0] * 90 + [NAN] * 10, skipped=set(range(91, 101)))
  ended = outcomes.judge(steps, losses, skipped, {100: NAN}, _info(), warmup_steps=20)
  assert (ended.kind, ended.failed_at) == (outcomes.DIVERGED_NONFINITE, 91)


def test_a_ten_step_run_non_finite_from_step_2_is_failed_at_step_2_not_finished():
  # The case: lr 1e3 for 10 steps, the loss NaN from step 2, every update skipped and
  # the scale still halving when the run reaches its end (finished, its eval loss NaN). Before,
  # its 9-step stretch was shorter than PERSIST_STEPS: "finished, not learning".
  steps, losses, skipped = _run([5.5] + [NAN] * 9, skipped=set(range(2, 11)))
  ended = outcomes.judge(steps, losses, skipped, {10: NAN}, _info(), warmup_steps=5)
  assert (ended.kind, ended.failed, ended.failed_at) == (outcomes.DIVERGED_NONFINITE, True, 2)
  # Judged at a horizon inside the stretch, the same.
  early = outcomes.judge(steps, losses, skipped, {10: NAN}, _info(), warmup_steps=5, horizon=4)
  assert (early.kind, early.failed_at) == (outcomes.DIVERGED_NONFINITE, 2)


@pytest.mark.parametrize("final,kind", [(2.99, outcomes.LEARNING), (3.0, outcomes.NOT_LEARNING),
                                        (NAN, outcomes.NOT_LEARNING)])
def test_learning_is_below_halfway_from_the_unigram_entropy_to_the_floor(final, kind):
  steps, losses, skipped = _run([5.0] * 20)
  assert outcomes.judge(steps, losses, skipped, {20: final}, _info(), 5).kind == kind
  # A causal run's floor is the entropy rate: (4.0 + 1.8) / 2 = 2.9.
  causal = schema.RunInfo(unigram_entropy=4.0, entropy_floor=1.8, status=schema.FINISHED)
  assert causal.learning_threshold == pytest.approx(2.9)
  no_floor = schema.RunInfo(status=schema.FINISHED)
  assert outcomes.judge(steps, losses, skipped, {20: final}, no_floor, 5).kind == outcomes.ALIVE


def test_a_run_still_running_is_unfinished():
  steps, losses, skipped = _run([5.0] * 30)
  running = schema.RunInfo(**FACTS, status=schema.RUNNING)
  assert outcomes.judge(steps, losses, skipped, {}, running, 5).kind == outcomes.UNFINISHED
  assert outcomes.judge(steps, losses, skipped, {}, running, 5, horizon=20).kind == (
      outcomes.ALIVE)
