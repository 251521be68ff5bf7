"""Checkpoints: what defines an encoding's function travels with its state_dict.

For every registered encoding and every constructor argument (except the shape arguments
``d_model``, ``num_heads``, ``head_dim``, whose mismatch the attention refuses at run time), two
modules are built with two different values of that argument (non-default where the argument
has more than one non-default value); the first one's ``state_dict`` is loaded strictly into the
second (inside a :class:`mmpe.MultiHeadAttention`, so the attention weights travel too). The load
must raise, or the two must give identical outputs on every coordinate sample both run on — a
setting that changes the numbers and loads silently is a bug (LongRoPE built for another
length, SwinV2 for another window, ALiBi's explicit slopes …).

Settings no tensor holds are saved as ``<module>.settings.<name>`` entries
(:class:`mmpe.encodings._state.SavesSettings`); a mismatch names the setting and both values.
"""

from __future__ import annotations

import inspect
import io
import re

import pytest
import torch
from test_registry_matrix import COORDS, D_MODEL, HEADS, _context

import mmpe
from mmpe.coords import Grid, Sequence
from mmpe.encodings.base import InputEncoding

SHAPE_ARGS = {"d_model", "num_heads", "head_dim"}
SAMPLES = {
    **COORDS,
    "sequence_long": lambda: Sequence(40, causal=True),
    "sequence_far": lambda: Sequence(position_ids=torch.tensor([0, 1, 5, 99, 100, 300, 1000]),
                                     causal=True),
    "grid_resized": lambda: Grid((3, 4), prefix_tokens=1),  # tables resized from (2, 3)
}
EXTRA_CONTEXT = {"sequence_far": {"max_len": 1024}, "grid_resized": {"grid_shape": (2, 3)}}
HALF = D_MODEL // HEADS // 2  # rotary pairs per head (12)

#: (encoding or "*", argument) -> two values; other arguments get generic alternatives.
VALUES: dict[tuple[str, str], tuple] = {
    ("conv_pe", "groups"): (8, 4),
    ("spacetime", "spatial"): ("spherical_harmonics", "latlon_sincos"),
    ("spacetime", "temporal"): ("sinusoidal", "scaled_sinusoidal"),
    ("alibi", "slopes"): (torch.tensor([0.5, 0.25]), torch.tensor([1.0, 0.125])),
    ("axial", "shape"): ((4, 16), (16, 4)),
    ("axial", "dims"): ((16, 32), (32, 16)),
    ("cope", "npos_max"): (8, 16),
    ("dape", "inner"): ("alibi", "kerple_log"),
    ("factorized", "groups"): (((0,), (1,)), ((0, 1),)),
    ("factorized", "interpolation_1d"): ("linear", "nearest"),
    ("fourier_sphere", "num_frequencies"): (8, 16),
    ("graphormer", "edge_dim"): (4, 8),
    ("graphormer_edge", "edge_dim"): (4, 8),
    ("lappe", "projection"): ("mlp", "linear"),
    ("lappe", "normalization"): (None, "sym"),
    ("maglap", "projection"): ("mlp", "linear"),
    ("maglap", "normalization"): (None, "sym"),
    ("rrwp_node", "projection"): ("mlp", "linear"),
    ("signnet", "normalization"): (None, "sym"),
    ("spe", "normalization"): (None, "sym"),
    ("learned", "out_of_range"): ("clamp", "error"),
    ("learned_grid", "interpolation"): ("bilinear", "nearest"),
    ("mrope", "mrope_section"): ((4, 4, 4), (2, 5, 5)),
    ("mrope_interleaved", "mrope_section"): ((4, 4, 4), (6, 3, 3)),
    ("videorope", "temporal_pairs"): (2, 4),
    ("rope_dinov3", "normalize_coords"): ("separate", "max"),
    ("rope_dinov3", "shift_coords"): (0.1, 0.2),
    ("rope_dinov3", "jitter_coords"): (1.1, 1.5),
    ("rope_dinov3", "rescale_coords"): (1.5, 2.0),
    ("rope_dinov3", "generator"): (torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)),
    ("rope_longrope", "short_factor"): ([1.0] * HALF, [2.0] * HALF),
    ("rope_longrope", "long_factor"): ([3.0] * HALF, [5.0] * HALF),
    ("rope_longrope", "attention_factor"): (1.5, 2.0),
    ("rope_axial", "num_axes"): (1, 2),
    ("rope_axial", "grid_indexing"): ("ij", "xy"),
    ("rope_sphere", "lat_fraction"): (0.25, 0.75),
    ("rope_yarn", "attention_factor"): (1.5, 2.0),
    ("rwse", "projection"): ("mlp", "linear"),
    ("rope_yarn", "mscale"): (0.5, 1.0),
    ("rope_yarn", "mscale_all_dim"): (0.5, 1.0),
    ("scaled_sinusoidal", "init_scale"): (0.5, 2.0),
    ("p_rope", "p"): (0.25, 0.75),
    ("liere", "block_size"): (None, 4),
    ("liere", "init"): ("rope", "random"),
    ("sincos", "layout"): ("timm", "detr"),
    ("spherical_harmonics", "network"): ("mlp", "linear"),
    ("t5", "bidirectional"): (True, False),
    ("tabpet", "width"): (4, 6),
    ("*", "rotary_dim"): (8, 16),
    ("*", "grid_shape"): ((3, 2), (2, 3)),  # swin's tables of these have one size
    ("*", "original_max_position_embeddings"): (4, 16),
    ("*", "max_len"): (48, 64),
    ("*", "num_axes"): (2, 3),
    ("*", "mscale"): (0.5, 1.0),
}
#: (encoding, argument) -> why it may change the output silently (xfail, strict): files owned
#: elsewhere.
KNOWN_SILENT: dict = {}


def _alternatives(name: str, param: inspect.Parameter) -> tuple | None:
    for key in ((name, param.name), ("*", param.name)):
        if key in VALUES:
            return VALUES[key]
    d = param.default
    if isinstance(d, bool):
        return (d, not d)
    if isinstance(d, int):
        return (d // 2, d * 2) if d >= 2 else (d + 1, d + 2)
    if isinstance(d, float):
        return (d / 2, d * 2) if d else (0.5, 1.0)
    return None


def _arguments() -> list:
    out = []
    for entry in mmpe.available():
        for param in inspect.signature(entry.cls).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in SHAPE_ARGS:
                continue
            if param.name in ("device", "dtype"):  # where the tensors live, not a setting
                continue
            reason = KNOWN_SILENT.get((entry.name, param.name))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            out.append(pytest.param(entry.name, param.name, marks=marks,
                                    id=f"{entry.name}-{param.name}"))
    return out


def _pair(name: str, arg: str, cname: str, values: tuple):
    """Two modules (encoding, or attention around it) built with ``arg`` = each value."""
    coords = SAMPLES[cname]()
    context = {**_context(coords), **EXTRA_CONTEXT.get(cname, {})}
    built = []
    for value in values:
        torch.manual_seed(len(built))  # different initial parameters: the load must copy them
        try:
            enc = mmpe.build(name, context=context, **{arg: value})
        except (ValueError, TypeError):
            return coords, None
        module = enc if isinstance(enc, InputEncoding) else mmpe.MultiHeadAttention(
            D_MODEL, HEADS, [enc], route="math")
        with torch.no_grad():  # non-trivial parameters (T5's table starts at 0), signs kept
            for p in module.parameters():
                noise = torch.randn(p.shape, generator=torch.Generator().manual_seed(len(built)))
                p.mul_(1 + 0.1 * noise).add_(0.05 * noise.abs())
        built.append(module.eval())
    return coords, built


def _output(module, coords, x):
    with torch.no_grad():
        if isinstance(module, InputEncoding):
            if getattr(module, "width", None) and not getattr(module, "project", True):
                x = x[..., : D_MODEL - module.width]
            return module.combine(x, coords)
        return module(x, coords)


@pytest.mark.parametrize(("name", "arg"), _arguments())
def test_a_setting_that_changes_the_output_is_saved_or_checked(name: str, arg: str) -> None:
    param = inspect.signature(mmpe.get(name).cls).parameters[arg]
    values = _alternatives(name, param)
    assert values is not None, f"give {name}.{arg} two values in VALUES"
    compared = refused = 0
    for cname, make in SAMPLES.items():
        if not mmpe.get(name).supports(make()):
            continue
        coords, modules = _pair(name, arg, cname, values)
        if modules is None:  # a value invalid for these coordinates' context
            continue
        source, target = modules
        buffer = io.BytesIO()
        torch.save(source.state_dict(), buffer)
        buffer.seek(0)
        try:
            target.load_state_dict(torch.load(buffer), strict=True)
        except RuntimeError:
            refused += 1
            continue
        x = torch.randn(coords.batch_size or 2, coords.num_queries, D_MODEL,
                        generator=torch.Generator().manual_seed(3))
        try:
            expected = _output(source, coords, x)
            got = _output(target, coords, x)
        except (ValueError, TypeError):
            refused += 1  # refused at run time (positions out of range, wrong axes …)
            continue
        compared += 1
        assert torch.equal(expected, got), (
            f"{name} built with {arg}={values[1]!r} loaded the state_dict of one built with "
            f"{arg}={values[0]!r} without an error and gives other outputs on {cname}")
    assert compared or refused, f"no coordinate sample ran {name} with {arg}={values}"


def _attention(enc):
    torch.manual_seed(0)
    return mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc], route="math").eval()


def test_alibi_explicit_slopes_are_saved():
    coords, x = Sequence(6), torch.randn(2, 6, D_MODEL)
    source = _attention(mmpe.build("alibi", num_heads=HEADS, slopes=torch.tensor([0.9, 0.3])))
    target = _attention(mmpe.build("alibi", num_heads=HEADS))  # default slopes 1/16, 1/256
    assert "scores.0.slopes" in source.state_dict()
    target.load_state_dict(source.state_dict())
    torch.testing.assert_close(target.scores[0].slopes, torch.tensor([0.9, 0.3]))
    with torch.no_grad():
        assert torch.equal(target(x, coords), source(x, coords))


def test_alibi_learnable_slopes():
    enc = mmpe.build("alibi", num_heads=HEADS, learnable_slopes=True)
    assert isinstance(enc.slopes, torch.nn.Parameter)
    torch.testing.assert_close(enc.slopes.detach(), mmpe.functional.alibi_slopes(HEADS))
    mha, coords = _attention(enc), Sequence(6, causal=True)
    for route in ("math", "sdpa"):
        mha.route, enc.slopes.grad = route, None
        mha(torch.randn(2, 6, D_MODEL), coords).pow(2).mean().backward()
        assert enc.slopes.grad is not None and bool(enc.slopes.grad.abs().sum() > 0), route
    with torch.no_grad():
        enc.slopes.mul_(3.0)
    other = _attention(mmpe.build("alibi", num_heads=HEADS, learnable_slopes=True))
    other.load_state_dict(mha.state_dict())
    torch.testing.assert_close(other.scores[0].slopes, enc.slopes)
    # A bf16 cast keeps fixed slopes in float32 (they multiply distances of thousands).
    fixed = mmpe.build("alibi", num_heads=3).to(torch.bfloat16)
    assert fixed.slopes.dtype == torch.float32


@pytest.mark.parametrize(("name", "arg", "saved", "built"), [
    ("rope_longrope", "original_max_position_embeddings", 4096, 2048),
    ("rope_llama3", "original_max_position_embeddings", 8192, 2048),
    ("rope_yarn", "factor", 8.0, 4.0),
    ("swinv2_cpb", "grid_shape", (8, 8), (12, 12)),
    ("t5", "max_distance", 128, 256),
])
def test_a_mismatched_setting_is_a_load_error_naming_both_values(name, arg, saved, built):
    context = {"head_dim": 16, "num_heads": 4}
    source = mmpe.build(name, context=context, **{arg: saved})
    target = mmpe.build(name, context=context, **{arg: built})
    state = source.state_dict()
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=rf"settings\.{arg}: {name} was saved with "
                           rf"{arg}={re.escape(repr(saved))} but this module was built with "
                           rf"{arg}={re.escape(repr(built))}"):
            target.load_state_dict(state, strict=strict)


def test_a_state_dict_without_settings_loads_only_non_strictly():
    source = mmpe.build("rope_longrope", head_dim=16, original_max_position_embeddings=4096)
    target = mmpe.build("rope_longrope", head_dim=16, original_max_position_embeddings=2048)
    old = {k: v for k, v in source.state_dict().items() if ".settings." not in f".{k}"}
    with pytest.raises(RuntimeError, match="Missing key.*settings.original_max_position_embeddings"):
        target.load_state_dict(old)
    target.load_state_dict(old, strict=False)  # unchecked, as before settings were saved


def test_settings_are_plain_cpu_tensors_that_casts_leave_alone(tmp_path):
    enc = mmpe.build("rope_yarn", head_dim=16, original_max_position_embeddings=1000)
    enc.to(torch.bfloat16)
    state = enc.state_dict()
    assert state["settings.base"].dtype == torch.float64
    assert state["settings.original_max_position_embeddings"].dtype == torch.int64
    assert state["settings.truncate"].dtype == torch.bool
    torch.save(state, tmp_path / "enc.pt")
    loaded = torch.load(tmp_path / "enc.pt", weights_only=True)
    mmpe.build("rope_yarn", head_dim=16, original_max_position_embeddings=1000).load_state_dict(loaded)
    safetensors = pytest.importorskip("safetensors.torch")
    grid = mmpe.build("sincos", d_model=16, layout="detr")
    safetensors.save_file(grid.state_dict(), tmp_path / "grid.safetensors")
    back = safetensors.load_file(tmp_path / "grid.safetensors")
    mmpe.build("sincos", d_model=16, layout="detr").load_state_dict(back)
    with pytest.raises(RuntimeError, match="layout='detr' but this module was built with layout='mae'"):
        mmpe.build("sincos", d_model=16).load_state_dict(back)
