"""vlaeval: Hydra-configured evaluation of Vision-Language-Action robot policies."""

import os

__version__ = "0.1.0"

# MuJoCo picks its OpenGL backend when it is imported: render cameras offscreen on the CPU
# (OSMesa) unless the environment says otherwise (MUJOCO_GL=egl on a GPU machine).
os.environ.setdefault("MUJOCO_GL", "osmesa")
