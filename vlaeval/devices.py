"""Where a job's model runs (`device=`), checked once before any work: a device this machine does
not have is a one-line error naming it and the fix, not a traceback from deep inside a job."""

from __future__ import annotations

import re

from vlaeval.errors import UserInputError

DEVICE_PATTERN = re.compile(r"^(cpu|cuda(:\d+)?)$")


def check_device(device: str) -> None:
    """device= must be cpu, cuda or cuda:N, and a CUDA device must be visible to this torch."""
    device = str(device)
    if not DEVICE_PATTERN.match(device):
        raise UserInputError(
            f"device={device!r} is not a device vlaeval runs on; use device=cpu, device=cuda or cuda:N"
        )
    if device == "cpu":
        return
    import torch

    if not torch.cuda.is_available():
        built = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise UserInputError(
            f"device={device}: torch {torch.__version__} ({built}) sees no CUDA GPU on this machine; "
            "use device=cpu, or run where a GPU is visible"
        )
    index = int(device.split(":")[1]) if ":" in device else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise UserInputError(f"device={device}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
