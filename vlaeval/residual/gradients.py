"""Exact per-sample gradient norms of the flow-matching loss, for any policy.

method=auto (the default). Forward hooks record every call of each layer that owns trainable
parameters, keyed by the module; one autograd.grad of sum_i loss_i with respect to the recorded
outputs gives every sample's output gradient g_i at once (sample i's output reaches only loss_i).
Then, per layer:

* nn.Linear, y = a W^T + b over any extra axes (tokens, horizon): with a_i of shape (T, d_in) and
  g_i of shape (T, d_out), dW_i = g_i^T a_i and db_i = sum_t g_it, so
  ||dW_i||^2 = <a_i a_i^T, g_i g_i^T>_F -- the Gram form; for T = 1 it is the ghost-norm identity
  ||g_i||^2 ||a_i||^2. Where T^2 > d_in * d_out, dW_i itself is cheaper and is formed instead. A
  layer called several times in one forward has its calls joined along T (its gradient is their sum).
* nn.Conv2d (zero padding, any stride, dilation and groups): the same with the unfolded input
  patches as a_i and the output positions as T (dW_i formed, or the Gram form where smaller).
* nn.GroupNorm and nn.LayerNorm: dweight_i = sum g_i * x_hat_i and dbias_i = sum g_i over the
  axes the parameters are shared along, with x_hat the normalised input recomputed from the call.
* Any other layer with trainable parameters of its own (Embedding, a learned position table, a
  custom module): the vector-Jacobian product of the layer as a function of its own
  parameters, vmapped over the samples in chunks (torch.func) and summed over its calls. Exact,
  no closed form needed.

Nothing is approximated silently: a layer called on a tensor that does not lead with the batch is
refused with its name, and `verify_pairs` compares the first pairs with the per-sample loop before
anything is trusted. method=functional takes torch.func per-sample gradients of the whole trainable
set (any vmappable policy); method=loop is one backward pass per sample, the reference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, cast

import numpy as np
import torch
from scipy.stats import spearmanr

from vlaeval.artifacts import stable_seed
from vlaeval.choices import GradientMethod
from vlaeval.data.anchors import AnchorSet
from vlaeval.errors import UserInputError, first_line
from vlaeval.policy.bound import BoundPolicy
from vlaeval.policy.flow import FlowConvention, flow_matching_losses, losses_given
from vlaeval.policy.protocol import Conditioning, map_tensors, uses_loss_level
from vlaeval.records import JsonRecord

Batch = Dict[str, torch.Tensor]
VMAP_CHUNK = 256  # samples per vmapped chunk in the torch.func paths (bounds their memory)


@dataclass
class _Call:
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    output: torch.Tensor
    autocast: Optional[torch.dtype] = None  # the autocast dtype the call ran under (a policy's own), if any

    def precision(self) -> contextlib.AbstractContextManager[Any]:
        """The call's autocast again, for re-running the layer (the vector-Jacobian product)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.output.device.type, dtype=self.autocast)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """float32 for a half-precision tensor (a layer under autocast): the closed forms sum squares of
    many products, which bfloat16's 8-bit mantissa would round away."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _autocast_dtype(device: torch.device) -> Optional[torch.dtype]:
    kind = device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


@dataclass
class _Layer:
    name: str
    module: torch.nn.Module
    parameters: Dict[str, torch.nn.Parameter]  # the module's own trainable parameters, by local name
    calls: List[_Call] = field(default_factory=list)

    @property
    def closed_form(self) -> Optional[str]:
        """The layer's closed form, where it has one (else the vmapped vector-Jacobian product)."""
        module, own = self.module, set(self.parameters)
        if not own <= {"weight", "bias"}:
            return None
        if isinstance(module, torch.nn.Linear):
            return "linear"
        if isinstance(module, torch.nn.Conv2d) and module.padding_mode == "zeros" and isinstance(module.padding, tuple):
            return "conv2d"
        if isinstance(module, torch.nn.GroupNorm) and module.affine:
            return "group_norm"
        if isinstance(module, torch.nn.LayerNorm) and module.elementwise_affine:
            return "layer_norm"
        return None


def trainable_layers(model: torch.nn.Module, parameters: Sequence[torch.nn.Parameter]) -> List[_Layer]:
    """The modules that own the trainable parameters directly, in model order; every trainable
    parameter must belong to one."""
    wanted = {id(p) for p in parameters}
    layers, owned = [], set()
    for name, module in model.named_modules():
        own = {n: p for n, p in module.named_parameters(recurse=False) if id(p) in wanted}
        if own:
            layers.append(_Layer(name or type(model).__name__, module, own))
            owned |= {id(p) for p in own.values()}
    if owned != wanted:
        raise UserInputError(
            "some trainable parameters are not registered on a submodule of the policy; register them "
            "(nn.Parameter on a module) or use gradients.method=functional"
        )
    return layers


@contextlib.contextmanager
def recorded_calls(layers: Sequence[_Layer]) -> Iterator[None]:
    def hook(layer: _Layer) -> Any:
        def record(module: torch.nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> None:
            if not isinstance(output, torch.Tensor):
                raise UserInputError(
                    f"layer {layer.name} ({type(module).__name__}) returns {type(output).__name__}, not a tensor: "
                    "per-layer gradient norms cannot follow it; use gradients.method=functional"
                )
            layer.calls.append(_Call(args, kwargs, output, _autocast_dtype(output.device)))

        return record

    for layer in layers:
        layer.calls.clear()
    handles = [layer.module.register_forward_hook(hook(layer), with_kwargs=True) for layer in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _check_batch_first(layer: _Layer, call: _Call, batch: int) -> None:
    tensors = [a for a in call.args if isinstance(a, torch.Tensor)]
    tensors += [v for v in call.kwargs.values() if isinstance(v, torch.Tensor)]
    for x in tensors + [call.output]:
        if x.dim() == 0 or x.shape[0] != batch:
            raise UserInputError(
                f"layer {layer.name} ({type(layer.module).__name__}) was called on a tensor of shape "
                f"{tuple(x.shape)}, which does not lead with the batch ({batch}): its per-sample gradients "
                "cannot be separated there; use gradients.method=functional"
            )


def _linear_sq_norms(layer: _Layer, grads: List[torch.Tensor]) -> Tuple[torch.Tensor, str]:
    module = layer.module
    assert isinstance(module, torch.nn.Linear)
    batch = grads[0].shape[0]
    inputs = [_wide(c.args[0].detach()).reshape(batch, -1, module.in_features) for c in layer.calls]
    outputs = [_wide(gr).reshape(batch, -1, module.out_features) for gr in grads]
    a = inputs[0] if len(inputs) == 1 else torch.cat(inputs, dim=1)
    g = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
    tokens = a.shape[1]
    sq = torch.zeros(batch, dtype=g.dtype, device=g.device)
    if "weight" in layer.parameters:
        if tokens == 1:
            sq = sq + g.pow(2).sum(dim=(1, 2)) * a.pow(2).sum(dim=(1, 2))
            method = "linear_rows"
        elif tokens * tokens <= module.in_features * module.out_features:
            sq = sq + (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum(dim=(1, 2))
            method = "linear_gram"
        else:
            sq = sq + torch.bmm(g.transpose(1, 2), a).pow(2).sum(dim=(1, 2))
            method = "linear_outer"
    else:
        method = "linear_rows" if tokens == 1 else "linear_gram"
    if "bias" in layer.parameters:
        sq = sq + g.sum(dim=1).pow(2).sum(dim=-1)
    return sq, method


def _conv2d_sq_norms(layer: _Layer, grads: List[torch.Tensor]) -> Tuple[torch.Tensor, str]:
    """Conv2d in closed form: with a_i the unfolded input patches (C_in/groups * kh * kw, L) of one
    group and g_i the output gradient (C_out/groups, L) over the L output positions, dW_i = g_i a_i^T
    and db_i = sum_L g_i. Formed per sample where that is smaller, else in the Gram form
    <a_i^T a_i, g_i^T g_i> (L x L) -- the identity Opacus and the ghost-clipping papers use."""
    module = layer.module
    assert isinstance(module, torch.nn.Conv2d)
    batch, groups = grads[0].shape[0], module.groups
    patches, outputs = [], []
    for call, g in zip(layer.calls, grads):
        x, g = _wide(call.args[0].detach()), _wide(g)
        a = torch.nn.functional.unfold(
            x,
            module.kernel_size,
            dilation=module.dilation,
            padding=cast(Tuple[int, ...], module.padding),  # a tuple: closed_form checked it
            stride=module.stride,
        )
        patches.append(a.reshape(batch, groups, a.shape[1] // groups, a.shape[2]))
        outputs.append(g.reshape(batch, groups, module.out_channels // groups, -1))
    a = patches[0] if len(patches) == 1 else torch.cat(patches, dim=-1)  # (B, G, K, L)
    g = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)  # (B, G, O, L)
    sq = torch.zeros(batch, dtype=g.dtype, device=g.device)
    positions, k, o = a.shape[-1], a.shape[-2], g.shape[-2]
    method = "conv2d_outer" if k * o <= positions * positions else "conv2d_gram"
    if "weight" in layer.parameters:
        a2, g2 = a.flatten(0, 1), g.flatten(0, 1)
        if method == "conv2d_outer":
            part = torch.bmm(g2, a2.transpose(1, 2)).pow(2).sum(dim=(1, 2))
        else:
            part = (torch.bmm(a2.transpose(1, 2), a2) * torch.bmm(g2.transpose(1, 2), g2)).sum(dim=(1, 2))
        sq = sq + part.reshape(batch, groups).sum(dim=1)
    if "bias" in layer.parameters:
        sq = sq + g.sum(dim=-1).pow(2).sum(dim=(1, 2))
    return sq, method


def _norm_sq_norms(layer: _Layer, grads: List[torch.Tensor]) -> Tuple[torch.Tensor, str]:
    """GroupNorm and LayerNorm in closed form: y = x_hat * weight + bias per channel (GroupNorm) or
    per element of the normalised shape (LayerNorm), so dweight_i = sum over the other axes of
    g_i * x_hat_i and dbias_i = sum of g_i, with x_hat the normalised input recomputed from the call."""
    module = layer.module
    batch = grads[0].shape[0]
    d_weight: Optional[torch.Tensor] = None
    d_bias: Optional[torch.Tensor] = None
    for call, g in zip(layer.calls, grads):
        x, g = _wide(call.args[0].detach()), _wide(g)
        if isinstance(module, torch.nn.GroupNorm):
            x_hat = torch.nn.functional.group_norm(x, module.num_groups, eps=module.eps)
            axes = tuple(range(2, g.dim()))
            w_part, b_part = (g * x_hat).sum(dim=axes), g.sum(dim=axes)  # (B, C)
        else:
            assert isinstance(module, torch.nn.LayerNorm)
            x_hat = torch.nn.functional.layer_norm(x, module.normalized_shape, eps=module.eps)
            shape = (batch, -1, *module.normalized_shape)
            w_part, b_part = (g * x_hat).reshape(shape).sum(dim=1), g.reshape(shape).sum(dim=1)
        d_weight = w_part if d_weight is None else d_weight + w_part
        d_bias = b_part if d_bias is None else d_bias + b_part
    assert d_weight is not None and d_bias is not None
    sq = torch.zeros(batch, dtype=d_weight.dtype, device=d_weight.device)
    if "weight" in layer.parameters:
        sq = sq + d_weight.reshape(batch, -1).pow(2).sum(dim=1)
    if "bias" in layer.parameters:
        sq = sq + d_bias.reshape(batch, -1).pow(2).sum(dim=1)
    return sq, "group_norm" if isinstance(module, torch.nn.GroupNorm) else "layer_norm"


def _functional_sq_norms(layer: _Layer, grads: List[torch.Tensor]) -> torch.Tensor:
    """Per-sample squared norm of the layer's own parameter gradient, summed over its calls first."""
    from torch.func import functional_call, vjp, vmap

    params = {n: p.detach() for n, p in layer.parameters.items()}
    batch = grads[0].shape[0]
    sq = torch.zeros(batch, dtype=_wide(grads[0]).dtype, device=grads[0].device)
    for start in range(0, batch, VMAP_CHUNK):
        stop = min(start + VMAP_CHUNK, batch)
        total: Dict[str, torch.Tensor] = {}
        for call, g in zip(layer.calls, grads):
            positions = [i for i, a in enumerate(call.args) if isinstance(a, torch.Tensor)]
            keys = [k for k, v in call.kwargs.items() if isinstance(v, torch.Tensor)]
            batched = [call.args[i].detach()[start:stop] for i in positions] + [
                call.kwargs[k].detach()[start:stop] for k in keys
            ]

            def one(
                tensors: List[torch.Tensor],
                g_i: torch.Tensor,
                call: _Call = call,
                positions: List[int] = positions,
                keys: List[str] = keys,
            ) -> Any:
                args = list(call.args)
                kwargs = dict(call.kwargs)
                for i, x in zip(positions, tensors[: len(positions)]):
                    args[i] = x.unsqueeze(0)
                for k, x in zip(keys, tensors[len(positions) :]):
                    kwargs[k] = x.unsqueeze(0)
                with call.precision():  # the layer as it ran: under the policy's autocast, if any
                    pullback = vjp(lambda p: functional_call(layer.module, p, tuple(args), kwargs), params)[1]
                    return pullback(g_i.unsqueeze(0).to(call.output.dtype))[0]

            part = vmap(one)(batched, g[start:stop])
            for n, v in part.items():
                v = _wide(v)
                total[n] = total[n] + v if n in total else v
        sq[start:stop] = sum(v.reshape(stop - start, -1).pow(2).sum(dim=1) for v in total.values())
    return sq


class _LossModule(torch.nn.Module):
    """The per-sample loss as a module's forward, so torch.func.functional_call can swap the
    policy's parameters (the loss calls encode and velocity, not forward)."""

    def __init__(self, policy: torch.nn.Module, flow: FlowConvention) -> None:
        super().__init__()
        self.policy, self.flow = policy, flow

    def forward(self, batch: Batch, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return flow_matching_losses(self.policy, batch, t, noise, self.flow)


class PerSampleGradNorms:
    """Squared per-sample gradient norms of the flow-matching loss over `parameters` (the policy's
    trainable set), and the losses, for batches of (anchor, flow time, noise) pairs."""

    def __init__(
        self, model: torch.nn.Module, parameters: Sequence[torch.nn.Parameter], flow: Any, method: str = "auto"
    ) -> None:
        self.model, self.parameters = model, list(parameters)
        self.flow = FlowConvention.of(flow)
        self.method = GradientMethod.parse(method, "gradients.method")
        self.layers = trainable_layers(model, self.parameters) if self.method == GradientMethod.auto else []
        self.layer_methods: Dict[str, str] = {}

    def __call__(
        self, batch: Batch, t: torch.Tensor, noise: torch.Tensor, conditioning: Optional[Conditioning] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """`conditioning`: the rows' conditioning computed outside (no trainable parameter in it:
        shared_conditioning), for method=auto; None: each row encoded here."""
        if self.method == GradientMethod.auto:
            return self._per_layer(batch, t, noise, conditioning)
        if self.method == GradientMethod.functional:
            return self._functional(batch, t, noise)
        self.layer_methods = {"all trainable parameters": "loop"}
        return self.loop(batch, t, noise)

    def _per_layer(
        self, batch: Batch, t: torch.Tensor, noise: torch.Tensor, conditioning: Optional[Conditioning] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        size = t.shape[0]
        with recorded_calls(self.layers):
            if conditioning is None:
                losses = flow_matching_losses(self.model, batch, t, noise, self.flow)
            else:
                losses = losses_given(self.model, conditioning, batch, t, noise, self.flow, 1)
        for layer in self.layers:
            for call in layer.calls:
                _check_batch_first(layer, call, size)
        outputs = [c.output for layer in self.layers for c in layer.calls]
        grads = torch.autograd.grad(losses.sum(), outputs, allow_unused=True)
        sq = torch.zeros_like(_wide(losses))
        position = 0
        for layer in self.layers:
            count = len(layer.calls)
            mine = [torch.zeros_like(c.output) if g is None else g for c, g in zip(layer.calls, grads[position:])]
            mine = mine[:count]
            position += count
            if count == 0:
                self.layer_methods.setdefault(layer.name, "unused")
                continue
            form = layer.closed_form
            if form == "linear":
                part, method = _linear_sq_norms(layer, mine)
            elif form == "conv2d":
                part, method = _conv2d_sq_norms(layer, mine)
            elif form in ("group_norm", "layer_norm"):
                part, method = _norm_sq_norms(layer, mine)
            else:
                part, method = _functional_sq_norms(layer, mine), "functional_vjp"
            self.layer_methods.setdefault(layer.name, method + (f" x{count} calls" if count > 1 else ""))
            sq = sq + part
            layer.calls.clear()
        return sq.detach(), losses.detach()

    def _functional(self, batch: Batch, t: torch.Tensor, noise: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        from torch.func import functional_call, grad_and_value, vmap

        wanted = {id(p) for p in self.parameters}
        wrapper = _LossModule(self.model, self.flow)
        params = {f"policy.{n}": p.detach() for n, p in self.model.named_parameters() if id(p) in wanted}

        def loss_one(p: Dict[str, torch.Tensor], one: Batch, t_i: torch.Tensor, noise_i: torch.Tensor) -> torch.Tensor:
            single = {k: v.unsqueeze(0) for k, v in one.items()}
            return functional_call(wrapper, p, (single, t_i.unsqueeze(0), noise_i.unsqueeze(0)))[0]

        step = vmap(grad_and_value(loss_one), in_dims=(None, 0, 0, 0))
        sq_out, loss_out = [], []
        for start in range(0, t.shape[0], VMAP_CHUNK):
            stop = min(start + VMAP_CHUNK, t.shape[0])
            try:
                grads, losses = step(
                    params, {k: v[start:stop] for k, v in batch.items()}, t[start:stop], noise[start:stop]
                )
            except RuntimeError as error:
                if "vmap" not in str(error):
                    raise
                # transformers' attention masks branch on the mask's values, which vmap cannot follow
                raise UserInputError(
                    f"gradients.method=functional cannot vmap {type(self.model).__name__}'s loss "
                    f"({first_line(error)[:120]}...); use gradients.method=auto (exact, per layer) or loop"
                ) from None
            sq_out.append(sum(g.reshape(stop - start, -1).pow(2).sum(dim=1) for g in grads.values()))
            loss_out.append(losses)
        self.layer_methods = {"all trainable parameters": "functional_vmap"}
        return torch.cat(sq_out).detach(), torch.cat(loss_out).detach()

    def loop(self, batch: Batch, t: torch.Tensor, noise: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The reference: one autograd pass per sample (what the other methods must equal)."""
        sq, losses = [], []
        for i in range(t.shape[0]):
            one = {k: v[i : i + 1] for k, v in batch.items()}
            loss = flow_matching_losses(self.model, one, t[i : i + 1], noise[i : i + 1], self.flow)[0]
            grads = torch.autograd.grad(loss, self.parameters, allow_unused=True)
            sq.append(sum((g.pow(2).sum() for g in grads if g is not None), torch.zeros((), dtype=loss.dtype)))
            losses.append(loss.detach())
        return torch.stack(sq).detach(), torch.stack(losses)


def selected_parameters(model: Any, selection: str) -> List[Tuple[str, torch.nn.Parameter]]:
    """The (name, parameter) pairs `selection` covers, in model order: the policy's own subset
    (`trainable_parameters(subset)`: action_head, all), narrowed where `selection` is
    "<subset>:<glob>,<glob>" to the names a pattern matches (GradientsConfig.selection). A pattern
    that matches nothing is refused by name: a typo would otherwise shrink the set silently."""
    subset, _, patterns = str(selection).partition(":")
    chosen = {id(p) for p in model.trainable_parameters(subset)}
    named = [(n, p) for n, p in model.named_parameters() if id(p) in chosen]
    globs = [g for g in patterns.split(",") if g]
    for glob in globs:
        if not any(fnmatch.fnmatchcase(n, glob) for n, _ in named):
            tops = sorted({n.split(".")[0] + ".*" for n, _ in named})
            raise UserInputError(
                f"gradients.parameters: {glob!r} matches none of the {len(named)} parameters of "
                f"gradients.trainable={subset}; their names start {', '.join(tops[:12])}"
                + (" ..." if len(tops) > 12 else "")
            )
    if globs:
        named = [(n, p) for n, p in named if any(fnmatch.fnmatchcase(n, g) for g in globs)]
    return named


@contextlib.contextmanager
def only_trainable(model: Any, selection: str) -> Iterator[List[torch.nn.Parameter]]:
    """Gradients for `selection` (selected_parameters) only; restored on exit."""
    parameters = [p for _, p in selected_parameters(model, selection)]
    wanted = {id(p) for p in parameters}
    before = {id(p): p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in wanted)
    try:
        yield parameters
    finally:
        for p in model.parameters():
            p.requires_grad_(before[id(p)])


def gradient_draws(
    seed: int, count: int, horizon: int, action_dim: int, flow: Any
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Flow time and noise for the first `count` anchors under one gradient seed, drawn from the
    training distribution (a prefix of the same stream for any larger count)."""
    rng = np.random.default_rng(stable_seed("gradient-seed", int(seed)))
    t = FlowConvention.of(flow).sample_time(rng, count).astype(np.float32)
    noise = rng.standard_normal((count, horizon, action_dim)).astype(np.float32)
    return torch.from_numpy(t), torch.from_numpy(noise)


@dataclass(frozen=True)
class LoopCheck(JsonRecord):
    """The fast method's squared norms of the first `pairs` (seed, anchor) pairs against the
    per-sample loop's: the largest relative difference and the tolerance it passed (pairs 0: not
    checked -- the loop itself, or no pairs asked for)."""

    pairs: int
    max_relative_difference: Optional[float] = None
    tolerance: Optional[float] = None


@dataclass(frozen=True)
class GradientMeasurements:
    """Per (seed, anchor) pair: squared per-sample gradient norm over the trainable parameters and
    the flow-matching loss, both shape (seeds, anchors); how many parameter entries were trainable;
    which exact method each layer used; and the check against the per-sample loop."""

    sq_norms: np.ndarray
    losses: np.ndarray
    parameter_count: int
    layer_methods: Dict[str, str] = field(default_factory=dict)
    verification: Optional[LoopCheck] = None  # None: the first batch was never checked
    flow_times: Optional[np.ndarray] = None  # (seeds, anchors): each pair's flow time t
    parameter_names: Tuple[str, ...] = ()  # the parameters the norms cover, in model order

    def rms(self) -> np.ndarray:
        """Gradient RMS per anchor: sqrt(mean over seeds and parameter entries of the squared gradient)."""
        return np.sqrt(self.sq_norms.mean(axis=0) / self.parameter_count)


VERIFY_TOLERANCE = 1e-3  # float32 relative difference allowed between a method and the loop


def require_finite(losses: torch.Tensor, sq_norms: torch.Tensor, t: torch.Tensor, anchors: np.ndarray) -> None:
    """A non-finite loss or gradient is the policy's (its velocity, or its loss level, gave NaN or
    inf on that input), not the gradient method's: said so, naming the first such pair, before any
    method is compared with the loop."""
    bad = ~(torch.isfinite(losses) & torch.isfinite(sq_norms))
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        what = "loss" if not bool(torch.isfinite(losses[i])) else "gradient norm"
        raise UserInputError(
            f"the policy's flow-matching {what} is {float(losses[i] if what == 'loss' else sq_norms[i])} on anchor "
            f"{int(anchors[i])} at flow time t={float(t[i]):.3f} ({int(bad.sum())} of {bad.numel()} pairs in the batch): "
            "its velocity (or loss) is not finite there; fix the policy (or its checkpoint) -- no gradient method can"
        )


def verify_against_loop(
    norms: PerSampleGradNorms, batch: Batch, t: torch.Tensor, noise: torch.Tensor, computed: torch.Tensor, pairs: int
) -> LoopCheck:
    """Compare the first `pairs` squared norms with the per-sample loop; refuse a mismatch."""
    n = min(int(pairs), t.shape[0])
    if n == 0 or norms.method == GradientMethod.loop:
        return LoopCheck(pairs=0)
    reference, _ = norms.loop({k: v[:n] for k, v in batch.items()}, t[:n], noise[:n])
    difference = float(((computed[:n] - reference).abs() / reference.abs().clamp_min(1e-30)).max())
    if not difference <= VERIFY_TOLERANCE:
        raise UserInputError(
            f"per-sample gradient norms by method={norms.method} differ from the per-sample loop by up to "
            f"{difference:.2e} (relative) on the first {n} pairs: a layer mixes samples or reshapes the batch; "
            "use gradients.method=functional (or loop)"
        )
    return LoopCheck(pairs=n, max_relative_difference=difference, tolerance=VERIFY_TOLERANCE)


def shared_conditioning(
    policy: BoundPolicy, anchors: AnchorSet, pair_anchor: np.ndarray
) -> Tuple[Batch, Optional[Conditioning]]:
    """(the rows' batch, their conditioning) for pairs whose anchors repeat (the artifact's seeds x
    anchors): each distinct anchor decoded and encoded once, its rows indexing the result -- the VLM's
    prefix run once per anchor, not once per gradient seed. The conditioning is None where it cannot
    be shared: a loss-level policy, or a trainable parameter inside the encoder (its per-sample
    gradients would be summed over the rows sharing an anchor)."""
    distinct, rows = np.unique(pair_anchor, return_inverse=True)
    once = policy.anchor_batch(anchors, distinct)
    index = torch.as_tensor(rows, device=next(iter(once.values())).device)
    batch = {k: v[index] for k, v in once.items()}
    model = cast(Any, policy.model)
    if uses_loss_level(model) or distinct.size == pair_anchor.size:
        return batch, None
    trainable: List[bool] = []

    def note(x: torch.Tensor) -> torch.Tensor:
        trainable.append(x.requires_grad)
        return x

    map_tensors(note, model.encode({k: v[:1] for k, v in once.items()}))  # one row says whether it can be shared
    if any(trainable):
        return batch, None
    return batch, map_tensors(lambda x: x[index], model.encode(once))


def gradient_measurements(
    policy: BoundPolicy,
    anchors: AnchorSet,
    anchor_index: np.ndarray,
    seeds: Sequence[int],
    *,
    trainable: str,
    batch_size: int,
    method: str = "auto",
    verify_pairs: int = 0,
) -> GradientMeasurements:
    """Squared gradient norms and losses for every (seed, anchor) pair; the first `verify_pairs`
    are checked against the per-sample loop before anything is returned."""
    torch.use_deterministic_algorithms(True)
    model, flow, device = policy.model.eval(), policy.flow, policy.device
    k = anchor_index.size
    draws = [gradient_draws(s, k, anchors.horizon, anchors.target_actions.shape[-1], flow) for s in seeds]
    t_all = torch.cat([d[0] for d in draws]).to(device)  # seed-major: pair p = (seed p // k, anchor p % k)
    noise_all = torch.cat([d[1] for d in draws]).to(device)
    pair_anchor = np.tile(anchor_index, len(seeds))
    sq_out, loss_out = [], []
    verification: Optional[LoopCheck] = None
    names = tuple(n for n, _ in selected_parameters(model, trainable))
    with only_trainable(model, trainable) as parameters:
        norms = PerSampleGradNorms(model, parameters, flow, method)
        for start in range(0, pair_anchor.size, int(batch_size)):
            stop = min(start + int(batch_size), pair_anchor.size)
            conditioning = None
            if norms.method == GradientMethod.auto:
                batch, conditioning = shared_conditioning(policy, anchors, pair_anchor[start:stop])
            else:
                batch = policy.anchor_batch(anchors, pair_anchor[start:stop])
            sq, loss = norms(batch, t_all[start:stop], noise_all[start:stop], conditioning)
            require_finite(loss, sq, t_all[start:stop], pair_anchor[start:stop])
            if start == 0:
                verification = verify_against_loop(
                    norms, batch, t_all[start:stop], noise_all[start:stop], sq, verify_pairs
                )
            sq_out.append(sq.cpu())
            loss_out.append(loss.cpu())
    shape = (len(seeds), k)
    return GradientMeasurements(
        sq_norms=torch.cat(sq_out).double().numpy().reshape(shape),
        losses=torch.cat(loss_out).double().numpy().reshape(shape),
        parameter_count=sum(p.numel() for p in parameters),
        layer_methods=dict(norms.layer_methods),
        verification=verification,
        flow_times=t_all.double().cpu().numpy().reshape(shape),
        parameter_names=names,
    )


@dataclass(frozen=True)
class SplitHalfReliability:
    """How well gradient RMS repeats across gradient seeds: Spearman between the two halves' per-anchor
    RMS and its Spearman-Brown step-up to the full seed count (None at rho = -1)."""

    split_half_spearman: float
    spearman_brown: Optional[float]
    seeds_per_half: int
    method: str = "seeds split in order into halves; Spearman of per-anchor gradient RMS"

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def split_half_reliability(sq_norms: np.ndarray, parameter_count: int) -> SplitHalfReliability:
    """sq_norms: squared per-sample gradient norms, shape (seeds >= 2, anchors)."""
    half = sq_norms.shape[0] // 2
    first = np.sqrt(sq_norms[:half].mean(axis=0) / parameter_count)
    second = np.sqrt(sq_norms[half : 2 * half].mean(axis=0) / parameter_count)
    rho = float(spearmanr(first, second).statistic)
    return SplitHalfReliability(rho, 2 * rho / (1 + rho) if rho > -1 else None, half)
