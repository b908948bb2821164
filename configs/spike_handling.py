"""Skip-step and update clipping on runs that spike and recover (`make spike-handling`; issue 43,
item 4: do they change time to failure, the number of loss spikes and the loss after recovery?).

The techniques table (configs/techniques.py) could not answer it: there every run dies or
survives within 120 steps, before skip-step's window has the history to call a spike, and
neither technique ever acted. Here the runs are the seed figure's Pre-LN clip 1 on
Shakespeare's plays (configs/shakespeare.py, float16 with fairseq's loss scaler), trained the
recipe's full 1000 steps, where Pre-LN's loss spikes and comes back (`make study-text`: one
spike of 5.8 nats above trend, ending at 2.59), at the recipe's rate and at LEARNING_RATES' higher
ones, SEEDS seeds each. Arms: the baseline; skip-step at OLMo-core's 6 sigma over a 128-step
window (`optimizer.skip_spikes=6`); update clipping at Adafactor's RMS 1
(`optimizer.update_clip=1`). Each technique is compared with the baseline on the runs of the same
rate and seed (same data order, same initialisation): `python -m normstudy.techniques
--workdir=DIR --config=configs/spike_handling.py` writes spike_handling.csv
(normstudy.analysis.techniques_report.spike_handling: exact paired permutation tests, Holm over the
family).
"""

from configs import shakespeare
from normstudy.core.experiment import Experiment
from normstudy.core.experiment import Techniques

_ARMS = {
    "baseline": ("Pre-Norm | Gradient Clip=1", {}),
    "skip_spikes": ("Pre-Norm | Gradient Clip=1 | skip-step 6 sigma",
                    {"optimizer.skip_spikes": 6.0}),
    "update_clip": ("Pre-Norm | Gradient Clip=1 | update clip 1",
                    {"optimizer.update_clip": 1.0}),
}
BASELINES = {"skip_spikes": "baseline", "update_clip": "baseline"}
SPIKE_HANDLING = ("skip_spikes", "update_clip")

NUM_STEPS = 1000
# The recipe's 3e-3, and a rate where more runs spike (make ladder-sensitivity: at 4 x 64 the
# loss rises from 1e-2 on).
LEARNING_RATES = [3e-3, 1e-2]
SEEDS = [0, 1, 2, 3, 4, 5]
_AXES = {"optimizer.learning_rate": LEARNING_RATES, "train.seed": SEEDS}
# Every step logged (a spike is read from the per-step loss), evaluated at the end, no
# telemetry (the spike detectors read the loss, the gradient norm and the update norm).
_SETTINGS = {"label": "{auto}", "train.num_steps": NUM_STEPS, "train.log_every": 1,
                  "train.eval_every": NUM_STEPS, "train.checkpoint_every": NUM_STEPS,
                  "train.telemetry_every": 0}



def base_config():
  """configs/shakespeare.py's recipe, Pre-LN clip 1 (the seed figure's on Shakespeare)."""
  return shakespeare.get_config("pre_norm_clip1")


EXPERIMENT = Experiment(base=base_config, arms=_ARMS, axes=_AXES, settings=_SETTINGS,
                        techniques=Techniques(baselines=BASELINES, spike_handling=SPIKE_HANDLING))

get_config = EXPERIMENT.get_config
