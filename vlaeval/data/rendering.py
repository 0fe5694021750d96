"""Camera images of a Meta-World scene, rendered offscreen by MuJoCo on the CPU.

MuJoCo renders through OSMesa (Debian's libosmesa6, which `make system-packages` installs) when
MUJOCO_GL=osmesa; vlaeval sets that default before MuJoCo is imported (vlaeval/__init__.py), and a
GPU machine may set MUJOCO_GL=egl instead. The renderer is set up for small frames on a software
rasteriser: no multisampling, no shadows, no reflections -- at 64x64 these change a few pixels
and cost most of the time (benchmarks/rollout_throughput.py measures a frame). Images are flipped
to the usual orientation (MuJoCo's framebuffer starts at the bottom row).
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np

from vlaeval.errors import UserInputError, first_line

# The cameras every Meta-World scene defines (metaworld/assets: sawyer_xyz_base.xml).
METAWORLD_CAMERAS = ("topview", "corner", "corner2", "corner3", "corner4", "behindGripper", "gripperPOV")
CAMERA_PREFIX = "observation.images."  # a camera's feature name, as LeRobot names them


def camera_key(camera: str) -> str:
    return CAMERA_PREFIX + str(camera)


class SceneCameras:
    """Render `cameras` of one MuJoCo model at `size` x `size`; `render(data)` gives each camera's
    uint8 (size, size, 3) image of the current state."""

    def __init__(self, model: Any, cameras: Sequence[str], size: int) -> None:
        import mujoco

        self.cameras, self.size = [str(c) for c in cameras], int(size)
        model.vis.quality.offsamples = 0
        model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), self.size)
        model.vis.global_.offheight = max(int(model.vis.global_.offheight), self.size)
        try:
            self.renderer = mujoco.Renderer(model, self.size, self.size)
        except Exception as error:
            raise UserInputError(
                f"rendering cameras {self.cameras} failed ({first_line(error)}); MuJoCo renders on the CPU through "
                "OSMesa: install Debian's libosmesa6 (make system-packages) and keep MUJOCO_GL=osmesa, or leave "
                "data.cameras empty"
            ) from None
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
            self.renderer.scene.flags[flag] = 0

    def render(self, data: Any) -> Dict[str, np.ndarray]:
        out = {}
        for camera in self.cameras:
            self.renderer.update_scene(data, camera=camera)
            out[camera_key(camera)] = np.ascontiguousarray(self.renderer.render()[::-1])
        return out

    def close(self) -> None:
        self.renderer.close()
