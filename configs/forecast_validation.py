"""Runs that fail, to judge the overflow forecast by (`make forecast-validation`; issue 84,
item 5).

normstudy.forecast fits each series' headroom trend and says when it will reach 0. To know how
far to trust it, it has to be scored on runs whose outcome is known: this file trains the drift
experiment's instrument (configs/drift.py: warm-up then a constant rate, 960 steps, telemetry
every 20 steps, the fp16 loss scale from its equilibrium) for plain Pre-LN and DeepNorm at
LEARNING_RATES, the drift grid's upper rates, where runs fail between their first hundred steps
and beyond their end (0.0316 mostly lives), SEEDS seeds. `normstudy.forecast --validate` then
forecasts every run from 10%, 25% and 50% of its steps and scores what it said against when
the run failed or that it lived (docs/forecast/: forecast_validation.csv, forecasts.csv).
About 12 minutes on 2 cores.
"""

from configs import drift
from configs import seed_figure
from normstudy.core.experiment import Experiment

ARMS = ("pre_norm_clip1", "post_norm_deepnorm_clip1")
SEEDS = [0, 1]
# The drift grid's 1/6-decade rates from 10^-1.5 to 10^-5/6 (configs/drift.py).
LEARNING_RATES = [rate for rate in drift.LEARNING_RATES if rate >= 0.03]

# Then the forecast judged by these runs and by the long horizon's (make horizon, beside it).
EXPERIMENT = Experiment(
    base=seed_figure.base_config, arms={name: drift.EXPERIMENT.arms[name] for name in ARMS},
    axes={"optimizer.learning_rate": LEARNING_RATES, "train.seed": SEEDS},
    settings=drift.EXPERIMENT.settings,
    then=("normstudy.forecast --validate --workdir={workdir} --workdir={workdir}/../horizon "
          "--out={workdir}",))

get_config = EXPERIMENT.get_config
