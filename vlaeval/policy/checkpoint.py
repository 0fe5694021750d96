"""Weights-only checkpoints: a state_dict of tensors (torch.save) plus a JSON sidecar.

Loading always uses torch.load(weights_only=True): a file holding pickled code or objects is
refused. The sidecar records the file's sha256, so a truncated or bit-flipped checkpoint is
detected before it is loaded.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Optional, TypedDict

import torch

from vlaeval.artifacts import atomic_write_bytes, atomic_write_json, read_json, sha256_bytes, sha256_file
from vlaeval.errors import UserInputError, first_line, require, require_file

CHECKPOINT_SCHEMA_VERSION = 1


def validate_checkpoint_config(checkpoint: Any) -> None:
    """checkpoint=path names an existing file: checked before any data is recorded or read."""
    if str(checkpoint.kind) != "path":
        return
    require(checkpoint.path not in (None, "", "???"), "checkpoint=path needs checkpoint.path=<file.pt>")
    path = Path(str(checkpoint.path))
    require_file(path, f"checkpoint {path}", CHECKPOINT_FIX)
    if not sidecar_path(path).is_file():
        check_archive(path)


CHECKPOINT_FIX = "e.g. checkpoint.path=policy.pt (train one with job=train, or use checkpoint=builtin)"


def check_archive(path: Path) -> None:
    """A checkpoint saved by torch.save is a zip archive with a CRC-32 per record: a flipped bit or a
    partial copy fails it (checked here, since torch.load does not). A legacy (non-zip) file has none."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise UserInputError(
            f"checkpoint {path} is a damaged archive ({first_line(error, 80)}); restore the file"
        ) from None
    if bad is not None:
        raise UserInputError(
            f"checkpoint {path} fails its CRC check at record {bad} (a flipped bit or a partial copy); restore the file"
        )


def state_dict_mismatch(expected: Dict[str, torch.Tensor], state: Dict[str, torch.Tensor]) -> str:
    """What keeps `state` from loading into a model whose state_dict is `expected`, naming the keys:
    the missing, the unexpected and those of another shape (the first of each, and how many)."""

    def some(keys: List[str]) -> str:
        return ", ".join(keys[:2]) + (f" (+{len(keys) - 2} more)" if len(keys) > 2 else "")

    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} {tuple(state[k].shape)} (the model's {tuple(v.shape)})"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    parts = [f"missing {some(missing)}"] if missing else []
    parts += [f"unexpected {some(unexpected)}"] if unexpected else []
    parts += [f"shape of {some(shapes)}"] if shapes else []
    return "; ".join(parts) or "no key differs"


def sidecar_path(path: Path) -> Path:
    return path.with_suffix(".json")


class TrainingRecord(TypedDict):
    """What a training run records beside its weights (policy.builtin.sidecar_for): the config
    sections that decided them, the data's digest, the seed, the vocabulary, the training's metrics."""

    config: Dict[str, Any]
    manifest_sha256: str
    seed: int
    vocab: List[str]
    metrics: Dict[str, Any]  # policy.training.TrainingRun, as JSON


class CheckpointSidecar(TrainingRecord):
    """The sidecar as written: the training's record between the schema version and the weights'
    sha256 and file name."""

    schema_version: int
    sha256: str
    file: str


def save_checkpoint(model: torch.nn.Module, path: Path, sidecar: TrainingRecord) -> CheckpointSidecar:
    """Write the state_dict (atomically) and its sidecar; returns the sidecar as written."""
    buffer = io.BytesIO()
    torch.save({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, buffer)
    data = buffer.getvalue()

    def write(handle: BinaryIO) -> None:
        handle.write(data)

    atomic_write_bytes(path, write)
    written: CheckpointSidecar = {
        "schema_version": CHECKPOINT_SCHEMA_VERSION,
        **sidecar,
        "sha256": sha256_bytes(data),
        "file": path.name,
    }
    atomic_write_json(sidecar_path(path), written)
    return written


def read_sidecar(path: Path) -> Optional[Dict[str, Any]]:
    """A checkpoint's sidecar (its training record), or None where it has none."""
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        found = read_json(side)
    except ValueError as error:
        raise UserInputError(f"{side} is not JSON ({first_line(error, 80)}); restore it or remove it") from None
    require(isinstance(found, dict), f"{side} is not a checkpoint sidecar (a JSON object); restore it or remove it")
    return found


def not_a_checkpoint(path: Path, error: BaseException) -> UserInputError:
    return UserInputError(
        f"checkpoint {path} is not a readable torch.save file ({type(error).__name__} while reading it: "
        f"{first_line(error, 60)}); pass the .pt file a training run wrote "
        "(torch.save(model.state_dict(), path))"
    )


def load_state_dict(path: Path) -> tuple[Dict[str, torch.Tensor], Optional[Dict[str, Any]], str]:
    """(state_dict, sidecar or None, sha256). Refuses missing, corrupt and non-weights files."""
    require_file(path, f"checkpoint {path}", CHECKPOINT_FIX)
    digest = sha256_file(path)
    sidecar = read_json(sidecar_path(path)) if sidecar_path(path).is_file() else None
    if sidecar is not None and sidecar.get("sha256") not in (None, digest):
        raise UserInputError(
            f"checkpoint {path} does not match the sha256 in {sidecar_path(path).name} "
            "(truncated or modified); retrain it or restore the file"
        )
    if sidecar is None:  # no digest to check against: the zip archive's own CRCs (torch.load reads past them)
        check_archive(path)
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
