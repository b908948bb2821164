"""The ladder's next rungs, for one GPU: the same arms, instrument and text as configs/ladder.py
at sizes this project's 2-core CPU cannot reach (issue 42, item 4).

  python -m normstudy.ladder --config=configs/ladder_gpu.py --workdir=runs/ladder

Run it into the CPU ladder's directory (`make ladder`'s runs/ladder, or a copy of it): the new
rungs land beside the old ones (<dtype>/L<layers>_d<width>), and the analysis then fits every
rung, so the held-out test (the largest rung predicted from the others) is repeated at a size
the CPU ladder only extrapolated to. The rungs run the widths 256 to 1024 at 12 layers and the
depths 12 and 24 at width 512, the top rung MERT's 24 x 1024 shape; rows are as long as the
CPU ladder's (64 tokens), so size is the only thing that changes. Each rung is the CPU ladder's
search (same bracket, rounds, seeds and horizon).

Runtime was not measured (no GPU was lent while this was written). By the 6 N D rule the file
is 4.1e16 FLOPs of training (rungs of 9.6M to 304M parameters, 581M together; per rung and
dtype 4 arms x 2 seeds x 6 runs x 120 steps x 1024 tokens): about 40 s at an H200's dense
float16 peak, float32 several times that; runs this small are dispatch- and compile-bound, so
expect tens of minutes rather than seconds, most of it compiling 2 dtypes x 5 rungs x 4 arms
x 2 run counts = 80 programs (docs/results.md, "Does it transfer?"): more than one 15-minute
lease. LEASE_* below is what fits one (benchmarks/gpu_ladder.sh).
"""

import dataclasses

from configs import ladder

LADDER_RUNGS = [(12, 256), (12, 512), (12, 1024), (24, 512), (24, 1024)]
# The CPU ladder's arms, recipe, dtypes, search and rung fields; only the rungs differ.
EXPERIMENT = dataclasses.replace(ladder.EXPERIMENT, ladder=dataclasses.replace(
    ladder.EXPERIMENT.ladder, rungs=LADDER_RUNGS))
get_config = EXPERIMENT.get_config

# What fits one 15-minute lease of one GPU (`bash benchmarks/gpu_ladder.sh`; issue 76): the next
# width rungs for plain Pre-LN and DeepNorm in float16, each (arm, rung) one vmapped program over
# a learning-rate grid and seeds (not a search: bisection's rounds would compile and run one after
# another), the CPU ladder's 120 steps. (num_layers, d_model, num_heads, seeds): the width rungs
# keep the CPU ladder's 16-wide heads; the top rung is MERT's 24 x 1024 with 16 heads of 64, one
# seed (its 11 runs' last states are 40 GiB, which a 64 GiB disk holds once).
LEASE_ARMS = ("pre_norm_clip1", "post_norm_deepnorm_clip1")
LEASE_RUNGS = [(4, 256, 16, (0, 1)), (4, 512, 32, (0, 1)), (4, 1024, 64, (0, 1)),
               (24, 1024, 16, (0,))]
# Quarter decades from 10^-2.5 to 10^0: around the CPU ladder's float16 trend extrapolated to
# these widths (Pre-LN 0.024 at 1024, DeepNorm 0.018; docs/ladder/ladder_fit.csv) and up to where
# every CPU rung failed.
LEASE_LEARNING_RATES = [round(10 ** (k / 4), 6) for k in range(-10, 1)]
LEASE_STEPS = ladder.NUM_STEPS
