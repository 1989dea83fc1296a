"""timm and OpenCLIP backbones, offline: tiny architectures registered with each library
(random init, or weights saved to a temp cache/file), checked against the libraries' own
forward passes, attention probabilities and preprocessing configs, then run through
extraction and both evaluation tasks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import open_clip
import pytest
import timm
import torch
from timm.models import register_model
from timm.models.vision_transformer import _create_vision_transformer

from bench.cli import main
from bench.core.dataset import Dataset
from bench.core.errors import BenchError
from evaluators.backbones import list_backbones, resolve_backbone
from evaluators.backbones.presets import BILINEAR, LIBRARY_PRESETS
from evaluators.backbones.weights import state_dict_hash
from evaluators.cache.extract import extract_activations
from tests.helpers import make_dataset

TIMM_TINY = "bb_test_tiny_reg_vit"
OC_TINY, OC_TINY_QKNORM = "bb-test-tiny-oc", "bb-test-tiny-oc-qknorm"
MEAN, STD = (0.3, 0.4, 0.5), (0.2, 0.25, 0.3)


@register_model
def bb_test_tiny_reg_vit(pretrained: bool = False, **kwargs) -> torch.nn.Module:
    """Class token + 2 registers, q/k LayerNorms, its own mean/std/interpolation/input size."""
    kwargs["pretrained_cfg"] = kwargs.get("pretrained_cfg") or dict(input_size=(3, 32, 32), mean=MEAN, std=STD,
                                                                   interpolation="bilinear")
    arch = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, reg_tokens=2, qk_norm=True, qkv_bias=True)
    return _create_vision_transformer(TIMM_TINY, pretrained=pretrained, **{**arch, **kwargs})


@pytest.fixture(scope="module", autouse=True)
def tiny_open_clip_configs(tmp_path_factory) -> None:
    root = tmp_path_factory.mktemp("open_clip_cfg")
    text = {"context_length": 8, "vocab_size": 64, "width": 16, "heads": 2, "layers": 1}
    vision = {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8}
    (root / f"{OC_TINY}.json").write_text(json.dumps({"embed_dim": 16, "vision_cfg": vision, "text_cfg": text}))
    (root / f"{OC_TINY_QKNORM}.json").write_text(json.dumps(
        {"embed_dim": 16, "vision_cfg": {**vision, "qk_norm": True}, "text_cfg": text}))
    open_clip.add_model_config(root)


@pytest.fixture(autouse=True)
def _offline(tmp_path_factory, monkeypatch) -> None:
    """Nothing here may touch the network: an empty Hugging Face cache, offline mode on."""
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """64 px scenes of 24 px objects: several 8 px patches per object at the models' 32 px input."""
    return make_dataset(tmp_path_factory.mktemp("data") / "tiny", n_train=40, n_val=16, n_test=16, image_size=64,
                        n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2, n_objects=3,
                        object_size=24, margin=2, val_fraction=0.2, test_fraction=0.2)


def _perturb(model: torch.nn.Module, seed: int = 1) -> None:
    """Non-trivial biases and norm affines (init leaves them at 0/1), so q/k slicing errors show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_" in name:
                p.add_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith(("in_proj_weight", "qkv.weight")):  # peaked attention, not near-uniform
                p.mul_(4)


def _x(side: int, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(side))


# ---------------------------------------------------------------- timm


@pytest.mark.parametrize("side", [32, 48])  # native, and off-native (timm's dynamic_img_size resampling)
def test_timm_tokens_prefix_and_preprocessing_come_from_timm(side):
    bb = resolve_backbone(f"random:timm:{TIMM_TINY}")
    info, m = bb.info, bb.model
    assert (info.family, info.n_layers, info.width, info.patch_size, info.input_size) == ("timm", 2, 32, 8, 32)
    assert (info.n_prefix, info.cls_index, info.register_indices) == (3, 0, (1, 2))
    assert bb.preprocess.mean == MEAN and bb.preprocess.std == STD and bb.preprocess.resample == BILINEAR
    x = _x(side)
    h0, h1, h2 = bb.hidden_states(x, [0, 1, 2])
    with torch.no_grad():
        emb = m.norm_pre(m._pos_embed(m.patch_embed(x)))
        ref = m.forward_intermediates(x, return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True)
    torch.testing.assert_close(h0, emb)
    n_patches = (side // 8) ** 2
    for h, (spatial, prefix) in zip((h1, h2), ref):  # timm's own split: registers are prefix, not patches
        assert prefix.shape[1] == 3 and spatial.shape[1] == n_patches
        torch.testing.assert_close(h, torch.cat([prefix, spatial], dim=1))
    assert bb.hidden_states(x, [2, 0])[0].shape == h2.shape  # any order, same pass


def test_timm_random_init_is_seeded_and_keyed_by_weights():
    a, b, c = (resolve_backbone(f"random:timm:{TIMM_TINY}", seed=s) for s in (0, 0, 1))
    assert a.weights == b.weights == state_dict_hash(a.model) != c.weights
    assert a.identity() == b.identity() != c.identity()
    assert a.info.revision == "seed=0"


def test_timm_attention_qk_is_timms_own_attention():
    """softmax of the AttentionQK logits == the probabilities timm's Attention computes (q/k norms included)."""
    bb = resolve_backbone(f"random:timm:{TIMM_TINY}")
    _perturb(bb.model)
    layer = 1
    attn = bb.model.blocks[layer].attn
    attn.fused_attn = False  # the explicit path materialises the probabilities (attn_drop's input)
    captured = {}
    hook = attn.attn_drop.register_forward_hook(lambda m, i, o: captured.__setitem__("p", o))
    x = _x(32, 1)
    with torch.no_grad():
        tokens = bb.hidden_states(x, [layer])[0][0]
        bb.model.forward_features(x)
    hook.remove()
    qk = bb.attention_qk(layer)
    with torch.no_grad():
        q, k = qk.project(tokens)
    logits = torch.einsum("ihd,jhd->hij", q, k) / 4.0  # d_head 16
    assert logits.std() > 0.5
    torch.testing.assert_close(logits.softmax(-1), captured["p"][0], atol=1e-5, rtol=1e-4)
    with pytest.raises(BenchError, match="the last hidden state 2 feeds none"):
        bb.attention_qk(2)


def test_timm_rotary_model_runs_but_has_no_attention_qk():
    """EVA-02 (rotary positions): tokens match timm's at an off-native size; its logits depend on
    positions, which cached tokens do not carry, so attention-qk is not offered."""
    from evaluators.backbones.timm_models import load_timm

    bb = load_timm("random:timm:eva02_tiny_patch14_224", "eva02_tiny_patch14_224", seed=0, depth=2)
    assert (bb.info.n_prefix, bb.info.cls_index, bb.info.patch_size) == (1, 0, 14)
    x = _x(56, 1)
    with torch.no_grad():
        ref = bb.model.forward_intermediates(x, return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True)
    spatial, prefix = ref[1]
    torch.testing.assert_close(bb.hidden_states(x, [2])[0], torch.cat([prefix, spatial], dim=1))
    assert bb.attention_qk(0) is None


def _fake_hub_file(cache: Path, repo: str, filename: str) -> Path:
    """Where huggingface_hub's cache keeps a file of a repo's main revision."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("0" * 40)
    path = root / "snapshots" / ("0" * 40) / filename
    path.parent.mkdir(parents=True)
    return path


def test_timm_pretrained_weights_come_from_the_local_cache_offline(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    torch.manual_seed(3)
    saved = timm.create_model("test_vit.r160_in1k", pretrained=False)  # with its head, as on the hub
    save_file(saved.state_dict(), _fake_hub_file(tmp_path / "hub", "timm/test_vit.r160_in1k", "model.safetensors"))
    bb = resolve_backbone("timm:test_vit.r160_in1k")
    assert bb.info.input_size == 160 and bb.info.revision == f"sha256:{bb.weights[:12]}"
    assert bb.weights != resolve_backbone("random:timm:test_vit.r160_in1k").weights
    x = _x(32, 1)
    with torch.no_grad():
        spatial, prefix = saved.forward_intermediates(x, return_prefix_tokens=True, output_fmt="NLC",
                                                      intermediates_only=True)[-1]
    torch.testing.assert_close(bb.hidden_states(x, [6])[0], torch.cat([prefix, spatial], dim=1))


# ---------------------------------------------------------------- OpenCLIP


@pytest.mark.parametrize("side", [32, 48])
def test_open_clip_vision_tower_tokens(side, tmp_path):
    bb = resolve_backbone(f"random:open_clip:{OC_TINY}")
    info, v = bb.info, bb.model
    assert isinstance(v, open_clip.transformer.VisionTransformer)  # the text tower is not kept
    assert (info.family, info.n_layers, info.width, info.patch_size, info.input_size) == ("open_clip", 2, 32, 8, 32)
    assert (info.n_prefix, info.cls_index, info.register_indices) == (1, 0, ())
    assert info.n_params == sum(p.numel() for p in v.parameters())
    assert bb.preprocess.mean == tuple(v.preprocess_cfg["mean"]) == open_clip.OPENAI_DATASET_MEAN
    x = _x(side)
    hs = bb.hidden_states(x, [0, 1, 2])
    if side == 32:
        ref_model = v
    else:  # OpenCLIP's own resampling: the same weights loaded into a tower built for this size
        path = tmp_path / "ckpt.pt"
        torch.save({f"visual.{k}": t for k, t in v.state_dict().items()}, path)
        ref_model = open_clip.create_model(OC_TINY, force_image_size=side).visual
        ref_model.load_state_dict({k[7:]: t for k, t in _resized(path, ref_model).items()})
    with torch.no_grad():
        torch.testing.assert_close(hs[0], ref_model._embeds(x))
        ref = ref_model.forward_intermediates(x, output_fmt="NLC", output_extra_tokens=True, intermediates_only=True)
    for h, spatial, prefix in zip(hs[1:], ref["image_intermediates"], ref["image_intermediates_prefix"]):
        torch.testing.assert_close(h, torch.cat([prefix, spatial], dim=1))


def _resized(path: Path, tower: torch.nn.Module) -> dict[str, torch.Tensor]:
    from types import SimpleNamespace

    from open_clip.model import resize_pos_embed

    state = torch.load(path)
    resize_pos_embed(state, SimpleNamespace(visual=tower))
    return state


def test_open_clip_checkpoint_file_weights_and_identity(tmp_path):
    torch.manual_seed(5)
    full = open_clip.create_model(OC_TINY)
    path = tmp_path / "tiny.pt"
    torch.save(full.state_dict(), path)
    bb = resolve_backbone(f"open_clip:{OC_TINY}@{path}")
    assert bb.weights == state_dict_hash(full.visual) and bb.info.revision == f"sha256:{bb.weights[:12]}"
    rnd = resolve_backbone(f"random:open_clip:{OC_TINY}")
    assert bb.identity() != rnd.identity() and rnd.identity() == resolve_backbone(f"random:open_clip:{OC_TINY}").identity()


def test_open_clip_tag_weights_and_preprocessing_from_the_cache(tmp_path, monkeypatch):
    """A pretrained tag (registered for the tiny architecture): its weights come from the local
    Hugging Face cache offline, its mean/std/interpolation and QuickGELU from the tag's config."""
    from open_clip.pretrained import _PRETRAINED, _pcfg

    monkeypatch.setitem(_PRETRAINED, OC_TINY, {"bbtest": _pcfg(hf_hub="bbtest/tiny-oc/", mean=MEAN, std=STD,
                                                              interpolation="bilinear", quick_gelu=True)})
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    torch.manual_seed(7)
    full = open_clip.create_model(OC_TINY, force_quick_gelu=True)
    torch.save(full.state_dict(), _fake_hub_file(tmp_path / "hub", "bbtest/tiny-oc", "open_clip_pytorch_model.bin"))
    bb = resolve_backbone(f"open_clip:{OC_TINY}@bbtest")
    assert bb.preprocess.mean == MEAN and bb.preprocess.std == STD and bb.preprocess.resample == BILINEAR
    assert isinstance(bb.model.transformer.resblocks[0].mlp.gelu, open_clip.model.QuickGELU)
    assert bb.weights == state_dict_hash(full.visual) and bb.identity()["model_cfg"]["quick_gelu"] is True
    x = _x(32, 1)
    with torch.no_grad():
        ref = full.visual.forward_intermediates(x, output_fmt="NLC", output_extra_tokens=True, intermediates_only=True)
    torch.testing.assert_close(bb.hidden_states(x, [2])[0], torch.cat([ref["image_intermediates_prefix"][1],
                                                                     ref["image_intermediates"][1]], dim=1))


@pytest.mark.parametrize("arch", [OC_TINY, OC_TINY_QKNORM])
def test_open_clip_attention_qk_is_open_clips_own_attention(arch):
    """nn.MultiheadAttention: its returned probabilities. OpenCLIP's Attention (q/k LayerNorms, fused
    SDPA, no probabilities to read): its output, rebuilt from the AttentionQK probabilities and its v."""
    bb = resolve_backbone(f"random:open_clip:{arch}")
    _perturb(bb.model)
    layer = 1
    block = bb.blocks()[layer]
    tokens = bb.hidden_states(_x(32, 1), [layer])[0]
    with torch.no_grad():
        q, k = bb.attention_qk(layer).project(tokens[0])
        logits = torch.einsum("ihd,jhd->hij", q, k) / 4.0  # d_head 16
        probs = logits.softmax(-1)
        h = block.ln_1(tokens)
        a = block.attn
        if isinstance(a, torch.nn.MultiheadAttention):
            torch.testing.assert_close(probs, a(h, h, h, need_weights=True, average_attn_weights=False)[1][0],
                                       atol=1e-5, rtol=1e-4)
        else:
            assert not isinstance(a.ln_q, torch.nn.Identity)
            v = torch.nn.functional.linear(h[0], a.in_proj_weight[64:], a.in_proj_bias[64:]).unflatten(-1, (2, 16))
            mixed = torch.einsum("hij,jhd->ihd", probs, v).flatten(-2)
            torch.testing.assert_close(a.out_proj(a.ln_inner(mixed)), a(h)[0], atol=1e-5, rtol=1e-4)
    assert logits.std() > 0.5  # far from uniform attention: the checks have teeth


# ---------------------------------------------------------------- extraction and evaluation


def test_extract_excludes_prefix_tokens(tiny_data):
    """The cached `all` view is exactly timm's spatial tokens (registers out); `mean` averages them."""
    ds = Dataset(tiny_data)
    bb = resolve_backbone(f"random:timm:{TIMM_TINY}")
    acts = extract_activations(bb, ds, "test", layers=[2], token_choices=["all", "mean", "cls"], device="cpu",
                               progress=False)
    assert acts.grid == (4, 4)
    rows = next(ds.iter_batches("test", batch_size=4, columns=["image"]))
    x = bb.prepare({"image": rows.column("image").to_pylist()}, 32)
    with torch.no_grad():
        spatial, prefix = bb.model.forward_intermediates(x, return_prefix_tokens=True, output_fmt="NLC",
                                                         intermediates_only=True)[-1]
    np.testing.assert_allclose(acts.get(2, "all")[:4], spatial.numpy().astype(np.float16), atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(acts.get(2, "mean")[:4], spatial.mean(1).numpy(), atol=2e-3, rtol=2e-3)
    np.testing.assert_allclose(acts.get(2, "cls")[:4], prefix[:, 0].numpy(), atol=2e-3, rtol=2e-3)


def test_evaluate_binding_and_issameobject(tiny_data, tmp_path, capsys):
    from bench.core.results import read_results
    from evaluators.tasks.issameobject.evaluate import evaluate_issameobject

    results = tmp_path / "results"
    models = [f"random:timm:{TIMM_TINY}", f"random:open_clip:{OC_TINY}"]
    args = ["evaluate", "--dataset", str(tiny_data), "--epochs", "2", "--results", str(results), "--format", "json",
            "--probes", "linear", "--device", "cpu", *(a for m in models for a in ("--model", m))]
    assert main(args) == 0, capsys.readouterr().err
    rows = read_results(results).to_pylist()
    assert {r["backbone"] for r in rows} == set(models)
    assert all(r["status"] == "ok" and r["layer"] == 2 and np.isfinite(r["L_O"]) for r in rows)

    for spec in models:
        out = evaluate_issameobject(spec, tiny_data, layers=[0, 1], probes=("linear", "attention-qk", "cosine"),
                                    device="cpu", epochs=2, progress=False, n_boot=20, attention_perms=20)
        by = {(r["layer"], r["probe"]): r for r in out}
        assert set(by) == {(layer, p) for layer in (0, 1) for p in ("linear", "attention-qk", "cosine")}
        for layer in (0, 1):
            assert by[(layer, "attention-qk")]["status"] == "ok"
            assert 0 <= by[(layer, "attention-qk")]["accuracy"] <= 1
            r = by[(layer, "linear")]
            assert r["status"] == "ok" and -1 <= r["attention_r"] <= 1 and 0 < r["attention_p"] <= 1


# ---------------------------------------------------------------- presets, listing, failures


def test_presets_match_the_libraries():
    """The metadata `bench models` shows offline is what the libraries build (meta device, no memory)."""
    listed = {i.spec: i for i in list_backbones()}
    for name, p in LIBRARY_PRESETS.items():
        assert listed[name].revision in ("cached", "not cached") and listed[f"random:{name}"].n_params == p.n_params
        if p.library == "timm":
            with torch.device("meta"):
                m = timm.create_model(p.name, pretrained=False, num_classes=0, dynamic_img_size=True)
            cfg = timm.models.get_pretrained_cfg(p.name)
            shape = (m.patch_embed.patch_size[0], cfg.input_size[-1], len(m.blocks), m.embed_dim, m.num_prefix_tokens)
            assert cfg.hf_hub_id == p.weights_repo
            assert bool(getattr(m, "has_class_token", getattr(m, "cls_token", None) is not None)) == p.has_cls
        else:
            with torch.device("meta"):
                m = open_clip.create_model(p.name, device="meta").visual
            shape = (m.patch_size[0], m.image_size[0], len(m.transformer.resblocks), m.transformer.width, 1)
            assert open_clip.get_pretrained_cfg(p.name, p.tag)["hf_hub"].rstrip("/") == p.weights_repo
        assert sum(t.numel() for t in m.parameters()) == p.n_params, name
        assert shape == (p.patch_size, p.input_size, p.n_layers, p.width, p.n_prefix), name


@pytest.mark.parametrize("spec", ["dinov2-base-reg-timm", "openclip-vit-b-32-laion2b", "timm:test_vit.r160_in1k"])
@pytest.mark.parametrize("offline", [True, False])
def test_uncached_weights_fail_in_one_line_fast(spec, offline, tmp_path, monkeypatch, capsys):
    """Fast: offline, no network is tried; with a hub at a closed port, the one probe is refused
    and no deadline is waited out."""
    from tests.test_backbones import network_waits

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    if not offline:  # network "on" but nothing answers (a closed local port)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    waits = network_waits(monkeypatch)
    assert main(["models", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("HF_HUB_OFFLINE" in err if offline else "unreachable" in err), err
    assert [how for _, how in waits] == ([] if offline else ["URLError: ConnectionRefusedError"])


@pytest.mark.parametrize("spec, message", [
    ("timm:vit_tiny_patch16_22", "did you mean vit_tiny_patch16_224"),
    ("random:timm:test_resnet", "not a Vision Transformer"),
    (f"timm:{TIMM_TINY}", "no pretrained weights"),
    ("open_clip:ViT-B-3", "did you mean ViT-B-32"),
    ("open_clip:ViT-B-32", "names no weights.*laion2b_s34b_b79k"),
    ("open_clip:ViT-B-32@nope", "no pretrained tag 'nope'"),
    ("open_clip:RN50@openai", "timm model or a ResNet"),
])
def test_bad_library_specs_are_one_line_errors(spec, message):
    with pytest.raises(BenchError, match=message):
        resolve_backbone(spec)
