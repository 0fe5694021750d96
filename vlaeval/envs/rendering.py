"""Camera images of a Meta-World scene, rendered offscreen by MuJoCo on the CPU.

MuJoCo renders through OSMesa (Debian's libosmesa6, which `make system-packages` installs) when
MUJOCO_GL=osmesa; vlaeval sets that default before MuJoCo is imported (vlaeval/__init__.py), and a
GPU machine may set MUJOCO_GL=egl instead. The renderer is set up for small frames on a software
rasteriser, where the time goes to the Sawyer's meshes (67k triangles, most far smaller than a
pixel), not to the pixels:

* no multisampling, no shadows, no reflections -- at 64x64 these change a few pixels;
* the meshes are drawn simplified: vertices are clustered on a grid of MESH_CELL_AT_64 metres at
  64x64 (finer for larger frames, in proportion) and the triangles that collapse are dropped, a
  fifth of them kept. The simplified faces are uploaded once, when the renderer is made, and the
  model's own faces put back at once, so the physics never sees them (it collides on convex
  hulls anyway). Measured in benchmarks/vision_speed.py: 1.7-1.8x fewer ms a frame (idle, 2
  cores); under 1% of pixels changed visibly (tests/test_cameras.py);
* the goal is drawn where a camera can see it: Meta-World marks it with a site, a sphere of 1-2 cm
  radius coloured by task (red on the red arm for reach), 1-3 pixels of a 64x64 corner view -- a
  policy that reads pixels cannot find it, and no amount of training teaches it to (the within-task
  probe of benchmarks/vision_ablations.py: R^2 <= 0 for the goal). The renderer draws that site at
  GOAL_MARKER_RADIUS in one colour, as a real scene shows its target (a plate, a bin, a mark on the
  table); only the renderer's copy of the scene changes, the physics and the state observation
  never see it. `goal_marker=None` draws Meta-World's own.

RENDERER_VERSION is part of the key of recorded camera data and of a camera policy's cached
episodes: bump it when what a frame shows changes. Images are flipped to the usual orientation
(MuJoCo's framebuffer starts at the bottom row).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from vlaeval.errors import UserInputError, first_line

# The cameras every Meta-World scene defines (metaworld/assets: sawyer_xyz_base.xml).
METAWORLD_CAMERAS = ("topview", "corner", "corner2", "corner3", "corner4", "behindGripper", "gripperPOV")
CAMERA_PREFIX = "observation.images."  # a camera's feature name, as LeRobot names them
RENDERER_VERSION = 3  # 3: the goal marker drawn visibly (2: simplified meshes; 1: full meshes)
MESH_CELL_AT_64 = 0.01  # metres: a 64x64 corner view's pixel covers ~2 cm of the table
GOAL_SITE = "goal"  # the site Meta-World's scenes mark their goal with
GOAL_MARKER_RADIUS = 0.04  # metres: ~3-4 pixels across in a 64x64 corner view
GOAL_MARKER_RGBA = (0.1, 1.0, 0.1, 0.8)  # green, which no arm, table or object of the nine tasks is


def camera_key(camera: str) -> str:
    return CAMERA_PREFIX + str(camera)


class SceneCameras:
    """Render `cameras` of one MuJoCo model at `size` x `size`; `render(data)` gives each camera's
    uint8 (size, size, 3) image of the current state."""

    def __init__(
        self,
        model: Any,
        cameras: Sequence[str],
        size: int,
        mesh_cell: Optional[float] = None,
        goal_marker: Optional[float] = GOAL_MARKER_RADIUS,
        goal_offset: Optional[np.ndarray] = None,
    ) -> None:
        """`mesh_cell`: the simplification's grid in metres (None: MESH_CELL_AT_64 scaled to `size`;
        0: the full meshes, as RENDERER_VERSION 1 drew them). `goal_marker`: the goal site's radius
        in metres, drawn in GOAL_MARKER_RGBA (None: as the model draws it, as version 2 did).
        `goal_offset`: metres (xyz) from the true goal at which the marker is drawn (a counterfactual
        marker, vlaeval/envs/episodes.py: goal_marker_offset); None draws it on the goal."""
        import mujoco

        self.cameras, self.size = [str(c) for c in cameras], int(size)
        goal = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, GOAL_SITE)
        self._goal = None if goal_marker is None or goal < 0 else (int(goal), float(goal_marker))
        self._goal_offset = None if goal_offset is None or not np.any(goal_offset) else np.asarray(goal_offset)
        cell = MESH_CELL_AT_64 * 64 / self.size if mesh_cell is None else float(mesh_cell)
        model.vis.quality.offsamples = 0
        model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), self.size)
        model.vis.global_.offheight = max(int(model.vis.global_.offheight), self.size)
        faces = simplify_meshes(model, cell) if cell > 0 else model.mesh_face.copy()
        try:
            self.renderer = mujoco.Renderer(model, self.size, self.size)  # uploads the (simplified) meshes
        except Exception as error:
            raise UserInputError(
                f"rendering cameras {self.cameras} failed ({first_line(error)}); MuJoCo renders on the CPU through "
                "OSMesa: install Debian's libosmesa6 (make system-packages) and keep MUJOCO_GL=osmesa, or leave "
                "data.cameras empty"
            ) from None
        finally:
            model.mesh_face[:] = faces  # the model's own faces again: only the renderer's copy is simplified
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
            self.renderer.scene.flags[flag] = 0

    def render(self, data: Any) -> Dict[str, np.ndarray]:
        out = {}
        for camera in self.cameras:
            self.renderer.update_scene(data, camera=camera)
            if self._goal is not None:
                self._mark_goal()
            out[camera_key(camera)] = np.ascontiguousarray(self.renderer.render()[::-1])
        return out

    def _mark_goal(self) -> None:
        """The goal site's sphere in the scene just built, enlarged and recoloured (the scene is the
        renderer's own list of what to draw: the model is untouched)."""
        import mujoco

        site, radius = self._goal  # type: ignore[misc]
        scene = self.renderer.scene
        for i in range(int(scene.ngeom)):
            geom = scene.geoms[i]
            if geom.objtype == mujoco.mjtObj.mjOBJ_SITE and geom.objid == site:
                geom.type = mujoco.mjtGeom.mjGEOM_SPHERE
                geom.size[:] = radius
                geom.rgba[:] = GOAL_MARKER_RGBA
                if self._goal_offset is not None:
                    geom.pos[:] = geom.pos + self._goal_offset

    def close(self) -> None:
        # MuJoCo frees a renderer's GL objects in whichever OSMesa context is current: make it this
        # renderer's own, or closing it deletes another live renderer's buffers (its frames turn to noise).
        context = getattr(self.renderer, "_gl_context", None)
        if context is not None:
            context.make_current()
        self.renderer.close()


def simplify_meshes(model: Any, cell: float) -> np.ndarray:
    """Simplify every mesh of `model` in place by vertex clustering on a grid of `cell` metres:
    each vertex stands for the first vertex of its cell, and a triangle whose corners fall in fewer
    than three cells becomes degenerate (0, 0, 0), which the rasteriser drops before any pixel.
    Returns the original faces, to be put back once the renderer has uploaded these."""
    original = model.mesh_face.copy()
    for i in range(int(model.nmesh)):
        start, count = int(model.mesh_vertadr[i]), int(model.mesh_vertnum[i])
        first, faces = int(model.mesh_faceadr[i]), int(model.mesh_facenum[i])
        if count == 0 or faces == 0:
            continue
        cells = np.floor(model.mesh_vert[start : start + count] / cell).astype(np.int64)
        _, representative, inverse = np.unique(cells, axis=0, return_index=True, return_inverse=True)
        stands_for = representative[inverse.reshape(-1)]
        face = stands_for[original[first : first + faces]]
        collapsed = (face[:, 0] == face[:, 1]) | (face[:, 1] == face[:, 2]) | (face[:, 0] == face[:, 2])
        face[collapsed] = 0
        model.mesh_face[first : first + faces] = face
    return original
