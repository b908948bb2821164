"""The critical value of a field by bisection, per grid point: the learning rate at which a run
stops surviving, found by search instead of read off a grid.

  Search.parse(text, rounds, probe_decades)   --search=optimizer.learning_rate:LOW,HIGH,
                               --rounds=N and --probe_decades=D
  Bracket                      one point's (low, high): low survived, high failed
  round_values(bracket)        the values a point trains at in its next round
  advance(bracket, outcomes)   the bracket after a round's outcomes {value: failed}
  probe_values(bracket, d)     the probe round's values: D decades either side of the midpoint
  run(search, points, train_round, after_round)   every round, a pure loop over `train_round`

Round 1 checks each point's bracket: it trains LOW and HIGH. A LOW that fails moves the
bracket down (low / WIDEN_FACTOR, the failed LOW its new high), a HIGH that survives moves it up
(high x WIDEN_FACTOR), each at most MAX_WIDENINGS times, one widening a round; a point whose
bracket is still not established after them is reported as such (its critical value lies beyond).
Each later round trains every established point at the geometric midpoint of its bracket and
keeps the half that still straddles: after r bisection rounds the bracket spans
(HIGH / LOW)^(1 / 2^r). A point's estimate is its final bracket's geometric midpoint.

Failure is a noisy function of the value, not a step (normstudy.analysis.transition fits P(fail)
to every probe of an arm), and bisection's probes crowd the middle of the transition: with
--probe_decades=D a probe round after the N rounds trains every established point at its final
midpoint x 10^(-D) and x 10^(+D), just outside its bracket, where they inform the transition's
width. It changes no bracket. In a simulated world with a known logistic transition (4 rounds
from [0.1, 1] and D = 1/8 decade, 6 points) the fitted center's and width's 95% intervals cover
the truth in 93-100% of 300 searches, against 86-99% for 5 rounds without it
(tests/test_transition.py).

Nothing here trains or reads files: normstudy.experiments.search_runner trains each round's runs
(one program per structure, the searched value per-run data) and judges each run by the failure
rule (normstudy.records.outcomes); the same outcomes always give the same rounds, so a killed
search resumes by replaying its rounds from the runs' records, and more rounds continue it.
"""

import dataclasses
import math

from normstudy.errors import UserError
from normstudy.core import experiment

WIDEN_FACTOR = 10.0
MAX_WIDENINGS = 2
DEFAULT_ROUNDS = 5  # --rounds's default (launch/sweep.sh reads it to submit every round)


@dataclasses.dataclass(frozen=True)
class Search(experiment.Search):
  """What to search (normstudy.core.experiment.Search's fields: `field` from [`low`, `high`]
  over `rounds` bisection rounds, then, with `probe_decades` > 0, one probe round, which
  `total_rounds` counts), and its parsing from the command line."""

  @property
  def total_rounds(self) -> int:
    return self.rounds + (1 if self.probe_decades > 0 else 0)

  @classmethod
  def parse(cls, text: str, rounds: int, probe_decades: float = 0.0) -> "Search":
    """From --search=FIELD:LOW,HIGH, --rounds and --probe_decades; one line for what is
    wrong."""
    field, sep, bounds = text.partition(":")
    parts = bounds.split(",")
    if not sep or not field or len(parts) != 2:
      raise UserError(f"--search={text!r} is not FIELD:LOW,HIGH (e.g. "
                      "--search=optimizer.learning_rate:0.1,1)")
    try:
      low, high = float(parts[0]), float(parts[1])
    except ValueError:
      raise UserError(f"--search={text!r}: LOW and HIGH must be numbers") from None
    if not (0 < low < high) or not math.isfinite(high):
      raise UserError(f"--search={text!r}: allowed: 0 < LOW < HIGH (finite)")
    if rounds < 1:
      raise UserError(f"--rounds={rounds} is not allowed; allowed: an integer >= 1 (round 1 "
                      "checks the bracket, each later one halves it)")
    _check_searchable(text, field)
    if _rounded(low) != low or _rounded(high) != high:
      raise UserError(f"--search={text!r}: LOW and HIGH must have at most 6 significant "
                      "digits (as run names write them), e.g. 0.1,1")
    most = max_rounds(low, high)
    if rounds > most:
      raise UserError(f"--rounds={rounds} is not allowed for [{low:g}, {high:g}]; allowed: 1 "
                      f"to {most} (later rounds would halve the bracket below the 6 "
                      "significant digits run names carry)")
    if not (0 <= probe_decades <= 1) or not math.isfinite(probe_decades):
      raise UserError(f"--probe_decades={probe_decades} is not allowed; allowed: 0 (no probe "
                      "round) or a number of decades in (0, 1], e.g. 0.125")
    return cls(field, low, high, rounds, float(probe_decades))

  def as_json(self) -> dict:
    return {"field": self.field, "low": self.low, "high": self.high, "rounds": self.rounds,
            "widen_factor": WIDEN_FACTOR, "max_widenings": MAX_WIDENINGS,
            "probe_decades": self.probe_decades}


def _check_searchable(text: str, field: str) -> None:
  """UserError unless `field` is a declared config field holding a float (a learning rate, a
  clip norm): bisection needs a continuous value (an integer, a flag or a name cannot be
  halved)."""
  from normstudy.core import config as config_lib
  declared = {f.name: f for f in config_lib.FIELDS}
  if field not in declared:
    raise UserError(f"--search={text!r}: {field} is not a config field; allowed: a float "
                    "field such as optimizer.learning_rate or optimizer.clip_norm")
  default = declared[field].default
  if not isinstance(default, float):
    raise UserError(f"--search={text!r}: {field} holds {type(default).__name__} values, which "
                    "bisection cannot halve; allowed: a float field such as "
                    "optimizer.learning_rate or optimizer.clip_norm")


def max_rounds(low: float, high: float) -> int:
  """The most rounds whose last bracket [low, high]^(1 / 2^(rounds - 1)) still spans more than
  1e-4 relative: what 6 significant digits can name apart (and at most 20)."""
  rounds = 1
  while rounds < 20 and (high / low) ** (1 / 2 ** rounds) - 1 > 1e-4:
    rounds += 1
  return rounds


@dataclasses.dataclass(frozen=True)
class Bracket:
  """low survived and high failed once `established`; before that, the bounds still to check."""
  low: float
  high: float
  low_survived: bool = False
  high_failed: bool = False
  widenings: int = 0

  @property
  def established(self) -> bool:
    return self.low_survived and self.high_failed

  @property
  def midpoint(self) -> float:
    return math.sqrt(self.low * self.high)

  def as_json(self) -> dict:
    return {"low": self.low, "high": self.high, "established": self.established,
            "widenings": self.widenings}


def _rounded(value: float) -> float:
  """Values as the run directories name them (6 significant digits), so that a value is the
  same number in the config, the directory name and sweep.json."""
  return float(f"{value:.6g}")


def initial(search: Search) -> Bracket:
  return Bracket(search.low, search.high)


def round_values(bracket: Bracket) -> list:
  """The values a point trains at in its next round: its unchecked bounds, or its midpoint;
  none for a point whose bracket cannot be established (widened as far as allowed)."""
  if bracket.established:
    return [_rounded(bracket.midpoint)]
  return [v for v, known in ((bracket.low, bracket.low_survived),
                             (bracket.high, bracket.high_failed)) if not known]


def probe_values(bracket: Bracket, decades: float) -> list:
  """The probe round's values of an established point: its midpoint x 10^(-decades) and
  x 10^(+decades); none for a point without a bracket."""
  if not bracket.established:
    return []
  return [_rounded(bracket.midpoint * 10 ** -decades),
          _rounded(bracket.midpoint * 10 ** decades)]


def advance(bracket: Bracket, outcomes: dict) -> Bracket:
  """The bracket after a round: `outcomes` {value: failed} for the values round_values gave."""
  if bracket.established:
    (value, failed), = outcomes.items()
    return dataclasses.replace(bracket, high=value) if failed else dataclasses.replace(
        bracket, low=value)
  low, high, widenings = bracket.low, bracket.high, bracket.widenings
  low_failed = False if bracket.low_survived else outcomes[low]
  high_failed = True if bracket.high_failed else outcomes[high]
  if low_failed or not high_failed:
    if widenings >= MAX_WIDENINGS:  # given up: the critical value lies beyond
      return dataclasses.replace(bracket, widenings=widenings + 1)
    if low_failed:  # LOW failed (whatever HIGH did): it bounds from above; look lower
      return Bracket(_rounded(low / WIDEN_FACTOR), low, False, True, widenings + 1)
    return Bracket(high, _rounded(high * WIDEN_FACTOR), True, False, widenings + 1)
  return Bracket(low, high, True, True, widenings)


def gave_up(bracket: Bracket) -> bool:
  """Widened as often as allowed and still not established: the value lies beyond."""
  return not bracket.established and bracket.widenings > MAX_WIDENINGS


def run(search: Search, points: list, train_round, after_round=None,
        last_round: int | None = None) -> dict:
  """Every round of the search (up to `last_round`, default all: search.total_rounds):
  `train_round(k, {point: [values]})` trains round k's runs and returns {point: {value:
  failed}}; `after_round(history)` is told the history after each round. Returns {point:
  [bracket after each bisection round]} (the history sweep.json records; the probe round adds
  none). Pure: the same outcomes give the same rounds."""
  last = search.total_rounds if last_round is None else last_round
  brackets = {p: initial(search) for p in points}
  history = {p: [] for p in points}
  for k in range(1, min(last, search.rounds) + 1):
    todo = {p: round_values(b) for p, b in brackets.items() if not gave_up(b)}
    todo = {p: v for p, v in todo.items() if v}
    outcomes = train_round(k, todo) if todo else {}
    for p in points:
      if p in outcomes:
        brackets[p] = advance(brackets[p], outcomes[p])
      history[p].append(brackets[p])
    if after_round is not None:
      after_round(history)
  if search.probe_decades > 0 and last > search.rounds:
    todo = {p: probe_values(b, search.probe_decades) for p, b in brackets.items()}
    todo = {p: v for p, v in todo.items() if v}
    if todo:
      train_round(search.rounds + 1, todo)
    if after_round is not None:
      after_round(history)
  return history
