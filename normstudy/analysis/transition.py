"""The failure threshold as a noisy transition: P(fail | learning rate) rises smoothly, and one
fit says where (the 50% critical learning rate) and how sharply (the transition's width).

Failure is not a step function of the learning rate: on a fine grid one seed of plain Pre-LN
survives 0.205 between failures at 0.191 and 0.221 (docs/results.md). So every probe a search
or a grid made of an arm, each run a draw, is fitted by maximum likelihood with the logistic

    P(fail | lr) = 1 / (1 + exp(-slope * (log10(lr) - center)))

`center` is log10 of the critical learning rate (50% failing); the width, the decades from 10%
to 90% failing, is 2 ln 9 / slope. Each gets a 95% profile-likelihood interval (the values whose
profile log-likelihood is within chi2(1, 0.95) / 2 = 1.92 of the maximum; Venzon and Moolgavkar
1988): the likelihood of an adaptive design such as a bisection is the same function of the
parameters as a fixed design's, so these intervals need no correction for how the search chose
its probes (tests/test_transition.py checks their coverage in a simulated world).

The slope is held within (0, MAX_SLOPE] per decade: when the probes are completely separated
(every failure above every survival) the likelihood keeps rising with the slope, the width's
lower bound is then 2 ln 9 / MAX_SLOPE and the center's interval the gap between them. When
the failures fall with the rate instead (every failure below the survivals), the rising curve's
best is a near-constant failure rate, its center far outside the probes with a shallow slope:
the center's interval is then open at both ends and the width's above.
"""

import dataclasses
import math

import numpy as np
from scipy import stats as scipy_stats

WIDTH_PER_SLOPE = 2 * math.log(9)  # logit(0.9) - logit(0.1)
MAX_SLOPE = 200.0  # per decade: a width of 0.022 decades, below what 1/16-decade probes resolve
CUTOFF = float(scipy_stats.chi2.ppf(0.95, 1)) / 2
# The grids the profiles are read on: the center every GRID_STEP decades over the probes' range
# widened by MARGIN decades each side, the slope log-spaced from MIN_SLOPE to MAX_SLOPE.
GRID_STEP = 0.002
MARGIN = 1.0
MIN_SLOPE = 0.05
SLOPES = 240


@dataclasses.dataclass(frozen=True)
class Transition:
  """The fit of one arm's probes: `runs`, `failed`, the center (log10 lr at 50%) and the width
  (decades from 10% to 90%) with their 95% profile-likelihood intervals. An interval that reaches
  the end of what the probes can say is open: NaN (the center's, beyond the probes' range by
  MARGIN) or inf (the width's upper end, when a flat curve fits as well)."""
  runs: int
  failed: int
  center: float
  center_low: float
  center_high: float
  width: float
  width_low: float
  width_high: float

  @property
  def slope(self) -> float:
    return WIDTH_PER_SLOPE / self.width

  def probability(self, log_lr) -> np.ndarray:
    """The fitted P(fail) at log10 learning rates."""
    return _logistic(self.slope * (np.asarray(log_lr, dtype=float) - self.center))


def log_likelihood(x, y, center, slope):
  """The logistic log-likelihood of outcomes `y` (0/1) at `x` (log10 lr), for arrays of centers
  and slopes broadcast against each other (the probes on a trailing axis)."""
  z = np.asarray(slope)[..., None] * (x - np.asarray(center)[..., None])
  return np.sum(y * z - np.logaddexp(0.0, z), axis=-1)


def _logistic(z):
  """1 / (1 + exp(-z)); where exp(-z) overflows to inf the value is its limit, 0, without
  numpy's overflow warning."""
  with np.errstate(over="ignore"):
    return 1 / (1 + np.exp(-z))


def _best_slope(x, y, centers, iterations: int = 60):
  """For each center, the slope in [0, MAX_SLOPE] that maximises the likelihood (concave in the
  slope: Newton's method, clipped to the bounds)."""
  d = x - centers[:, None]
  slope = np.ones(len(centers))
  for _ in range(iterations):
    p = _logistic(slope[:, None] * d)
    gradient = np.sum((y - p) * d, axis=1)
    curvature = np.sum(p * (1 - p) * d * d, axis=1) + 1e-12
    step = np.clip(gradient / curvature, -50, 50)
    slope = np.clip(slope + step, 0.0, MAX_SLOPE)
    if np.abs(step).max() < 1e-9:
      break
  return slope


def _best_center(x, y, slopes, start, iterations: int = 60):
  """For each slope, the center that maximises the likelihood (concave in the center: Newton's
  method from `start`)."""
  center = np.full(len(slopes), start)
  for _ in range(iterations):
    d = x - center[:, None]
    p = _logistic(slopes[:, None] * d)
    gradient = -slopes * np.sum(y - p, axis=1)
    curvature = slopes ** 2 * np.sum(p * (1 - p), axis=1) + 1e-12
    step = np.clip(gradient / curvature, -0.5, 0.5)
    center = center + step
    if np.abs(step).max() < 1e-10:
      break
  return center


def _interval(grid, profile, best, edges_open, beyond=None):
  """(low, high) of the grid values whose profile is within CUTOFF of `best`; an end at the
  grid's edge is open (`edges_open`: what to report for the low and the high end then). With
  none inside, the likelihood's maximum lies beyond the grid (a center far outside the probes
  with a shallow slope: failure that does not rise with the rate across them): `beyond`, or
  open at both ends."""
  inside = np.flatnonzero(profile >= best - CUTOFF)
  if len(inside) == 0:
    return edges_open if beyond is None else beyond
  low, high = grid[inside[0]], grid[inside[-1]]
  return (edges_open[0] if inside[0] == 0 else low,
          edges_open[1] if inside[-1] == len(grid) - 1 else high)


def profile(log_lr, failed, centers) -> np.ndarray:
  """The profile log-likelihood at each of `centers`: the log-likelihood of the best slope there
  (0 for no probes)."""
  x = np.asarray(log_lr, dtype=float)
  y = np.asarray(failed, dtype=float)
  centers = np.asarray(centers, dtype=float)
  if len(y) == 0:
    return np.zeros(len(centers))
  return log_likelihood(x, y, centers, _best_slope(x, y, centers))


def same_center_lrt(a: tuple, b: tuple) -> tuple[float, float]:
  """(statistic, p) of the likelihood-ratio test that two arms' probes ((log_lr, failed) each)
  share one 50% point, each keeping its own slope: twice the gain in log-likelihood of a center
  each over the best common one (read on a GRID_STEP grid), chi-square with 1 degree of freedom.
  NaN when either arm's transition lies beyond its probes."""
  if fit(*a) is None or fit(*b) is None:
    return math.nan, math.nan
  xs = np.concatenate([np.asarray(a[0], dtype=float), np.asarray(b[0], dtype=float)])
  centers = np.arange(xs.min() - MARGIN, xs.max() + MARGIN + GRID_STEP / 2, GRID_STEP)
  pa, pb = profile(*a, centers), profile(*b, centers)
  statistic = max(0.0, 2 * float(pa.max() + pb.max() - (pa + pb).max()))
  return statistic, float(scipy_stats.chi2.sf(statistic, 1))


def fit(log_lr, failed) -> Transition | None:
  """The transition fitted to probes at `log_lr` (log10 learning rates) that `failed` (0/1), or
  None when they all failed or all survived (the transition lies beyond them)."""
  x = np.asarray(log_lr, dtype=float)
  y = np.asarray(failed, dtype=float)
  if len(y) == 0 or y.sum() in (0, len(y)):
    return None
  centers = np.arange(x.min() - MARGIN, x.max() + MARGIN + GRID_STEP / 2, GRID_STEP)
  slopes = _best_slope(x, y, centers)
  profile_center = log_likelihood(x, y, centers, slopes)
  best = int(np.argmax(profile_center))
  center, slope = float(centers[best]), float(slopes[best])
  for _ in range(5):  # the maximum, refined off the grid
    center = float(_best_center(x, y, np.array([max(slope, 1e-6)]), center)[0])
    slope = float(_best_slope(x, y, np.array([center]))[0])
  slope_grid = np.geomspace(MIN_SLOPE, MAX_SLOPE, SLOPES)
  profile_slope = log_likelihood(x, y, _best_center(x, y, slope_grid, center), slope_grid)
  top = max(float(log_likelihood(x, y, center, slope)), float(profile_center.max()),
            float(profile_slope.max()))
  center_low, center_high = _interval(centers, profile_center, top, (math.nan, math.nan))
  # Beyond the slope grid can only be below its least (the slope is capped at its top): every
  # slope down to 0 is then inside, the width at least 2 ln 9 / MIN_SLOPE, unbounded above.
  slope_low, slope_high = _interval(slope_grid, profile_slope, top, (0.0, MAX_SLOPE),
                                    beyond=(0.0, MIN_SLOPE))
  return Transition(len(y), int(y.sum()), center, float(center_low), float(center_high),
                    WIDTH_PER_SLOPE / max(slope, 1e-12), WIDTH_PER_SLOPE / slope_high,
                    WIDTH_PER_SLOPE / slope_low if slope_low > 0 else math.inf)


# --- Two arms' 50% points against each other: the profile of their log ratio.

EQUIVALENCE_CUTOFF = float(scipy_stats.chi2.ppf(0.90, 1)) / 2  # two one-sided tests at 5%


def _common_grid(*arms) -> np.ndarray:
  xs = np.concatenate([np.asarray(x, dtype=float) for x, _ in arms])
  return np.arange(xs.min() - MARGIN, xs.max() + MARGIN + GRID_STEP / 2, GRID_STEP)


def _shift_profile(pa: np.ndarray, pb: np.ndarray) -> np.ndarray:
  """ll(k) = max over i of pa[i] + pb[i - k], for every shift k (in grid steps) from -(n-1) to
  n - 1: the profile log-likelihood of center_a - center_b = k GRID_STEP."""
  n = len(pa)
  out = np.full(2 * n - 1, -np.inf)
  for k in range(-(n - 1), n):
    if k >= 0:
      out[k + n - 1] = np.max(pa[k:] + pb[:n - k])
    else:
      out[k + n - 1] = np.max(pa[:n + k] + pb[-k:])
  return out


def log_ratio_profile(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
  """(log10 ratios center_a - center_b, their profile log-likelihood) of two arms' probes
  ((log_lr, failed) each), each arm with its own slope, read on the GRID_STEP grid."""
  centers = _common_grid(a, b)
  ll = _shift_profile(profile(*a, centers), profile(*b, centers))
  shifts = np.arange(-(len(centers) - 1), len(centers)) * GRID_STEP
  return shifts, ll


def equivalence_factor(a: tuple, b: tuple) -> float:
  """The smallest factor F such that the two arms' 50% points are shown within F of each other
  by two one-sided likelihood-ratio tests at 5% (the 90% profile interval of their log ratio,
  Schuirmann's 1987 construction on the likelihood): F = 10^max(|low|, |high|). Ratios beyond
  F either way are ruled out; inf when the interval reaches the grid's edge, NaN when either
  transition lies beyond its probes."""
  if fit(*a) is None or fit(*b) is None:
    return math.nan
  shifts, ll = log_ratio_profile(a, b)
  inside = np.flatnonzero(ll >= ll.max() - EQUIVALENCE_CUTOFF)
  if inside[0] == 0 or inside[-1] == len(ll) - 1:
    return math.inf
  return float(10 ** max(abs(shifts[inside[0]]), abs(shifts[inside[-1]])))


def interaction_lrt(first: tuple, other: tuple) -> tuple[float, float, float]:
  """Does a pair's log ratio of 50% points differ between two settings (e.g. float16 and
  float32)? `first` and `other` are ((log_lr, failed) of arm a, of arm b) in each. The
  likelihood-ratio test of one log ratio for both settings (each arm's center and slope free
  otherwise): (the fitted interaction, the ratio of the two ratios; statistic; p on chi2(1)).
  NaN when a transition lies beyond its probes."""
  if any(fit(*arm) is None for arm in (*first, *other)):
    return math.nan, math.nan, math.nan
  centers = _common_grid(*first, *other)
  ll_first = _shift_profile(profile(*first[0], centers), profile(*first[1], centers))
  ll_other = _shift_profile(profile(*other[0], centers), profile(*other[1], centers))
  shifts = np.arange(-(len(centers) - 1), len(centers)) * GRID_STEP
  statistic = max(0.0, 2 * float(ll_first.max() + ll_other.max() - (ll_first + ll_other).max()))
  interaction = shifts[np.argmax(ll_first)] - shifts[np.argmax(ll_other)]
  return float(10 ** interaction), statistic, float(scipy_stats.chi2.sf(statistic, 1))
