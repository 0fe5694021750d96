"""Weights-only checkpoints: a state_dict of tensors (torch.save) plus a JSON sidecar.

Loading always uses torch.load(weights_only=True): a file holding pickled code or objects is
refused. The sidecar records the file's sha256, so a truncated or bit-flipped checkpoint is
detected before it is loaded.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, BinaryIO, Dict, Mapping, Optional

import torch

from vlaeval.artifacts import atomic_write_bytes, atomic_write_json, read_json, sha256_bytes, sha256_file
from vlaeval.errors import UserInputError, first_line, require

CHECKPOINT_SCHEMA_VERSION = 1


def validate_checkpoint_config(checkpoint: Any) -> None:
    """checkpoint=path names an existing file: checked before any data is recorded or read."""
    if str(checkpoint.kind) != "path":
        return
    require(checkpoint.path not in (None, "", "???"), "checkpoint=path needs checkpoint.path=<file.pt>")
    require(
        Path(str(checkpoint.path)).is_file(),
        f"checkpoint {checkpoint.path} does not exist; train one with job=train or use checkpoint=builtin",
    )


def sidecar_path(path: Path) -> Path:
    return path.with_suffix(".json")


def save_checkpoint(model: torch.nn.Module, path: Path, sidecar: Mapping[str, Any]) -> Dict[str, Any]:
    """Write the state_dict (atomically) and its sidecar; returns the sidecar as written."""
    buffer = io.BytesIO()
    torch.save({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, buffer)
    data = buffer.getvalue()

    def write(handle: BinaryIO) -> None:
        handle.write(data)

    atomic_write_bytes(path, write)
    written = {"schema_version": CHECKPOINT_SCHEMA_VERSION, **sidecar, "sha256": sha256_bytes(data), "file": path.name}
    atomic_write_json(sidecar_path(path), written)
    return written


def not_a_checkpoint(path: Path, error: BaseException) -> UserInputError:
    return UserInputError(
        f"checkpoint {path} is not a readable torch.save file ({type(error).__name__} while reading it: "
        f"{first_line(error, 60)}); pass the .pt file a training run wrote "
        "(torch.save(model.state_dict(), path))"
    )


def load_state_dict(path: Path) -> tuple[Dict[str, torch.Tensor], Optional[Dict[str, Any]], str]:
    """(state_dict, sidecar or None, sha256). Refuses missing, corrupt and non-weights files."""
    require(path.is_file(), f"checkpoint {path} does not exist; train one with job=train or use checkpoint=builtin")
    digest = sha256_file(path)
    sidecar = read_json(sidecar_path(path)) if sidecar_path(path).is_file() else None
    if sidecar is not None and sidecar.get("sha256") not in (None, digest):
        raise UserInputError(
            f"checkpoint {path} does not match the sha256 in {sidecar_path(path).name} "
            "(truncated or modified); retrain it or restore the file"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights only" in str(error).lower() or "weights_only" in str(error).lower():
            raise UserInputError(
                f"checkpoint {path} holds pickled code or objects, refused by weights-only loading "
                f"({first_line(error, 100)}); save model.state_dict() instead"
            ) from None
        raise not_a_checkpoint(path, error) from None
    except Exception as error:
        raise not_a_checkpoint(path, error) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserInputError(f"checkpoint {path} is not a state_dict of tensors; save model.state_dict()")
    return state, sidecar, digest
