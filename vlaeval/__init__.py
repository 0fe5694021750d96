"""vlaeval: Hydra-configured evaluation of Vision-Language-Action robot policies."""

import os

__version__ = "0.1.0"

# MuJoCo picks its OpenGL backend when it is imported: render cameras offscreen on the CPU
# (OSMesa) unless the environment says otherwise (MUJOCO_GL=egl on a GPU machine).
os.environ.setdefault("MUJOCO_GL", "osmesa")
# OSMesa's llvmpipe rasterises on a pool of threads by default. Rollout workers are forked, and a
# process forked after rendering inherits a pool whose threads are gone: its first render waits for
# them forever. Rasterising in the calling thread avoids that, at no cost for small frames
# (measured: 7.4 ms a 64x64 frame either way), and leaves the cores to the rollout workers.
os.environ.setdefault("LP_NUM_THREADS", "0")
# torch's OpenMP threads spin while they wait for each other. On a busy machine (a test run, other
# jobs) a spinning thread holds a core its partner needs: training steps of the default policy ran
# 85x slower with two threads than with one (benchmarks/vision_speed.py). A passive wait costs
# nothing idle. OpenMP reads this when torch is first imported: vlaeval is imported before torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
