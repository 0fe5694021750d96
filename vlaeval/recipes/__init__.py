"""Recipe comparisons: two training recipes (overrides of the sections that decide a built-in
policy's weights) compared over training seeds -- each seed pair trained (or found in the checkpoint
cache, wherever job=train filled it) and evaluated on the same episodes -- or read from an outcome
file with a seed column (`spec`: a recipe as a PolicySpec; `seeds`: one seed pair's training and
evaluation, the seed-column outcome file; `result`: the comparison's typed result). The test over
seeds is pure statistics: vlaeval/seqtest/seeds.py."""
