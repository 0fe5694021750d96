"""Pluggable components (`_target_` config groups): their schemas come from their signatures.

A component is a class named by `_target_` in a config group -- the policy (`model`), the data
(`data`), the outcome source (`outcomes`) -- built with `hydra.utils.instantiate`. Its constructor's
signature is the one place its defaults live (the rule in docs/architecture.md):

* For vlaeval's own components the schema is generated from the signature when the config store
  is filled (`register_builtin_components`), by reading the source file -- not importing it, so
  `--help` and `--cfg job` stay free of torch. The option files in conf/ only name what differs.
* A user's component (a YAML file on Hydra's search path naming its own `_target_` and arguments)
  is checked against its signature before any work (`check_component`): an unknown or missing
  argument is one line naming the signature; the defaults the config leaves out are filled in, so
  the logged config, the run's digest and the checkpoint key see every argument.

Arguments a job supplies at build time (a policy's vocab, obs_dim, action_dim, horizon) are listed
in RUNTIME_ARGUMENTS: they must not be configured and are never missing; OFFERED_ARGUMENTS are
passed only to components whose constructor takes them (an outcome source's `context`).
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import inspect
from dataclasses import field, make_dataclass
from pathlib import Path
from typing import AbstractSet, Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, cast

from vlaeval import choices
from vlaeval.errors import UserInputError, first_line

PACKAGE_ROOT = Path(__file__).resolve().parent

# group -> {option name: target} for the schemas generated from vlaeval's own signatures.
BUILTIN_COMPONENTS: Dict[str, Dict[str, str]] = {
    "model": {
        "tiny_vla": "vlaeval.policy.tiny_vla.TinyVLA",
        "tiny_dit": "vlaeval.policy.tiny_dit.TinyDiT",
        "tiny_vla_vision": "vlaeval.policy.tiny_vla_vision.TinyVLAVision",
        "smolvlm_vla": "vlaeval.policy.vlm_vla.VLMFlowVLA",
    },
    "data": {
        "metaworld": "vlaeval.data.metaworld.MetaWorldDemonstrations",
        "lerobot": "vlaeval.data.lerobot.LeRobotDemonstrations",
    },
    "outcomes": {
        "synthetic": "vlaeval.gauntlet.outcomes.SyntheticOutcomes",
        "file": "vlaeval.gauntlet.outcomes.FileOutcomes",
        "rollout": "vlaeval.gauntlet.rollouts.RolloutOutcomes",
    },
}
RUNTIME_ARGUMENTS: Dict[str, Tuple[str, ...]] = {"model": ("vocab", "obs_dim", "action_dim", "horizon")}
# Arguments a job offers to the components that accept them (never configured either): the run's
# config sections, for an outcome source that runs policies (outcomes=rollout).
OFFERED_ARGUMENTS: Dict[str, Tuple[str, ...]] = {"outcomes": ("context",)}


def supplied_arguments(group: str) -> AbstractSet[str]:
    return set(RUNTIME_ARGUMENTS.get(group, ())) | set(OFFERED_ARGUMENTS.get(group, ()))


HYDRA_KEYS = ("_target_", "_recursive_", "_convert_", "_partial_", "_args_")
SCHEMA_SUFFIX = "_schema"  # conf/<group>/<option>.yaml lists `<option>_schema` first in its defaults

_SIMPLE_TYPES: Dict[str, Any] = {"int": int, "float": float, "str": str, "bool": bool}


# ----------------------------------------------------------------------------- static signatures
def _source_file(target: str) -> Path:
    module, _ = target.rsplit(".", 1)
    parts = module.split(".")
    if parts[0] != "vlaeval":
        raise ValueError(f"{target} is not one of vlaeval's own components")
    return PACKAGE_ROOT.joinpath(*parts[1:]).with_suffix(".py")


def _literal(node: ast.AST, constants: Mapping[str, Any]) -> Any:
    """A default value written as a literal, a module-level constant or a vlaeval.choices member."""
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and hasattr(choices, node.value.id):
        return getattr(getattr(choices, node.value.id), node.attr)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("list", "tuple")
        and len(node.args) == 1
    ):
        return list(_literal(node.args[0], constants))
    value = ast.literal_eval(node)
    return list(value) if isinstance(value, tuple) else value


def _annotation(node: Optional[ast.AST]) -> Any:
    """Simple annotations become schema types (int, float, str, bool, their lists and Optionals, a
    vlaeval.choices Enum); anything else is Any (checked by the component itself)."""
    if node is None:
        return Any
    text = ast.unparse(node)
    optional = text.startswith("Optional[") and text.endswith("]")
    inner = text[len("Optional[") : -1] if optional else text
    if inner.endswith(" | None"):
        optional, inner = True, inner[: -len(" | None")]
    if inner in _SIMPLE_TYPES:
        kind: Any = _SIMPLE_TYPES[inner]
    elif hasattr(choices, inner) and isinstance(getattr(choices, inner), type):
        kind = getattr(choices, inner)
    elif inner in ("Sequence[str]", "List[str]", "list[str]"):
        kind = List[str]
    elif inner in ("Sequence[int]", "List[int]", "list[int]"):
        kind = List[int]
    else:
        return Any
    return Optional[kind] if optional else kind


def static_parameters(target: str) -> List[Tuple[str, Any, Any]]:
    """(name, annotation, default or inspect.Parameter.empty) of the target class's __init__,
    read from its source file without importing it."""
    path = _source_file(target)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants: Dict[str, Any] = {}
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            names = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for name in names:
                if isinstance(name, ast.Name) and statement.value is not None:
                    try:
                        constants[name.id] = _literal(statement.value, constants)
                    except (ValueError, TypeError, SyntaxError):
                        pass
    class_name = target.rsplit(".", 1)[1]
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        raise ValueError(f"{target}: no class {class_name} in {path}")
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return []  # no constructor arguments
    args = init.args
    positional = args.posonlyargs + args.args
    defaults: List[Any] = [inspect.Parameter.empty] * (len(positional) - len(args.defaults)) + [
        _literal(d, constants) for d in args.defaults
    ]
    out = [(a.arg, _annotation(a.annotation), d) for a, d in zip(positional, defaults) if a.arg != "self"]
    out += [
        (a.arg, _annotation(a.annotation), inspect.Parameter.empty if d is None else _literal(d, constants))
        for a, d in zip(args.kwonlyargs, args.kw_defaults)
    ]
    return out


def schema_for(target: str, group: str) -> type:
    """A structured-config dataclass for the target: `_target_` plus every configurable argument
    with its signature default (arguments the job supplies are left out)."""
    supplied = supplied_arguments(group)
    fields: List[Tuple[str, Any, Any]] = [("_target_", str, field(default=target))]
    for name, kind, default in static_parameters(target):
        if name in supplied:
            continue
        if default is inspect.Parameter.empty:
            fields.append((name, kind, field(default="???")))
        elif isinstance(default, list):
            fields.append((name, kind, field(default_factory=functools.partial(list, default))))
        else:
            fields.append((name, kind, field(default=default)))
    return make_dataclass(target.rsplit(".", 1)[1] + "Config", fields)


def register_builtin_components() -> None:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for group, options in BUILTIN_COMPONENTS.items():
        for option, target in options.items():
            store.store(group=group, name=option + SCHEMA_SUFFIX, node=schema_for(target, group))


# ----------------------------------------------------------------------------- runtime checks
def import_target(path: str, where: str) -> Any:
    module_name, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise UserInputError(
            f"{where}._target_={path} cannot be imported ({type(error).__name__}: "
            f"{first_line(error)}); install its package or put it on PYTHONPATH"
        ) from None


def signature_text(target: Any, path: str) -> str:
    try:
        return f"{path}{inspect.signature(target)}"
    except (TypeError, ValueError):
        return path


def annotations_of(target: Any) -> Dict[str, Any]:
    """The resolved annotations of a target's parameters ({} when they cannot be resolved: names
    the module does not define at run time)."""
    import typing

    try:
        return typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:
        return {}


def fits_annotation(value: Any, annotation: Any) -> bool:
    """Whether a config value can be the argument `annotation` asks for. Only what a config can
    carry is judged (numbers, strings, booleans, None, lists, mappings, Enums); any other
    annotation (a class, a Protocol, Any) accepts everything, since Hydra cannot build it anyway."""
    import enum
    import typing

    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if annotation is typing.Any:
        return True
    if origin is typing.Union or (origin is not None and getattr(origin, "__name__", "") == "UnionType"):
        return any(fits_annotation(value, member) for member in arguments)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return value in [member.value for member in annotation] or value in list(annotation)
    import collections.abc

    container = origin if origin is not None else annotation
    if container in (list, set, frozenset, collections.abc.Sequence, collections.abc.Iterable):
        item = arguments[0] if arguments else typing.Any
        return isinstance(value, (list, tuple)) and all(fits_annotation(v, item) for v in value)
    if container is tuple:
        item = arguments[0] if len(arguments) == 2 and arguments[1] is Ellipsis else typing.Any
        return isinstance(value, (list, tuple)) and all(fits_annotation(v, item) for v in value)
    if container in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    return True


def type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def check_component(node: Any, group: str) -> Dict[str, Any]:
    """Check a `_target_` config node against its target's signature; return every argument the
    config should carry (the node's values plus the signature defaults it leaves out). One-line
    errors name the signature."""
    values = _node_values(node, group)
    path = values.get("_target_")
    if not isinstance(path, str) or not path:
        raise UserInputError(
            f"{group} has no _target_; name the component's class, e.g. {group}._target_=my_pkg.MyClass"
        )
    target = import_target(path, group)
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return values  # no signature to check against (a builtin or C extension)
    supplied = supplied_arguments(group)
    named = [
        n
        for n, p in parameters.items()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    signature = Signature(signature_text(target, path), parameters, named, supplied)
    _check_names(values, group, signature)
    _check_types(values, group, annotations_of(target), signature.text)
    _check_required(values, group, signature)
    return _with_defaults(values, signature)


class Signature(NamedTuple):
    """What the checks need of a component's constructor: its text for messages, its parameters, the
    names a config may set, and the ones vlaeval supplies itself."""

    text: str
    parameters: Mapping[str, inspect.Parameter]
    named: Sequence[str]
    supplied: AbstractSet[str]


def _node_values(node: Any, group: str) -> Dict[str, Any]:
    """The node as plain values; a required (???) value left unset is a one-line error."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(node):
        return dict(node)
    for key in node:
        if OmegaConf.is_missing(node, key):
            target = node.get("_target_", group)
            raise UserInputError(f"{group}.{key} is required by {target} and has no value; give it: {group}.{key}=...")
    return cast(Dict[str, Any], OmegaConf.to_container(node, resolve=True))


def _check_names(values: Mapping[str, Any], group: str, signature: Signature) -> None:
    named, supplied = signature.named, signature.supplied
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    for key in values:
        if key in HYDRA_KEYS:
            continue
        if key in supplied:
            raise UserInputError(
                f"{group}.{key} is supplied by vlaeval when it builds the {group}; remove it from the "
                f"config ({signature.text})"
            )
        if key not in named and not accepts_any:
            close = difflib.get_close_matches(key, named, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UserInputError(f"{group}.{key} is not an argument of {signature.text}{hint}")


def _check_types(values: Mapping[str, Any], group: str, hints: Mapping[str, Any], signature: str) -> None:
    """Values against the annotations, now, rather than as a TypeError deep inside the constructor."""
    for key, value in values.items():
        if key in hints and key not in HYDRA_KEYS and not fits_annotation(value, hints[key]):
            raise UserInputError(
                f"{group}.{key}={value!r} is not of type {type_name(hints[key])}, as {signature} "
                f"asks; give {group}.{key} a value of that type"
            )


def _check_required(values: Mapping[str, Any], group: str, signature: Signature) -> None:
    named, supplied, parameters = signature.named, signature.supplied, signature.parameters
    missing = [
        n
        for n in named
        if parameters[n].default is inspect.Parameter.empty
        and n not in values
        and n not in supplied
        and parameters[n].kind is not inspect.Parameter.VAR_POSITIONAL
    ]
    if missing:
        raise UserInputError(
            f"{group} misses argument {missing[0]} of {signature.text}; "
            f"add +{group}.{missing[0]}=... or put it in the {group} config file"
        )


def _with_defaults(values: Mapping[str, Any], signature: Signature) -> Dict[str, Any]:
    """The node's values plus the signature defaults a config can hold (plain values, choices as their value)."""
    complete = dict(values)
    for name in signature.named:
        default = signature.parameters[name].default
        if name in values or name in signature.supplied or default is inspect.Parameter.empty:
            continue
        if isinstance(default, tuple):
            default = list(default)
        if default is None or isinstance(default, (bool, int, float, str, list)):
            complete[name] = default.value if isinstance(default, choices.Choice) else default
    return complete


def complete_components(cfg: Any, groups: Sequence[str]) -> None:
    """check_component for each of the job's component groups, writing the filled-in defaults
    back into the config (so the logged config and the digests see every argument)."""
    from omegaconf import OmegaConf, open_dict

    for group in groups:
        if group not in cfg or cfg[group] is None:
            continue
        complete = check_component(cfg[group], group)
        with open_dict(cfg):
            for key, value in complete.items():
                if key not in cfg[group]:
                    OmegaConf.update(cfg, f"{group}.{key}", value, force_add=True)
