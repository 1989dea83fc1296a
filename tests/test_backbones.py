"""Backbone registry: tiny random checkpoints saved to disk and loaded back through the
same path a hub id takes; presets, random init, bad specs and offline behaviour."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from bench.cli import main
from bench.core.errors import BenchError
from evaluators.backbones import PRESETS, list_backbones, resolve_backbone
from evaluators.backbones.hf import preset_n_params
from evaluators.backbones.presets import Preset

transformers.logging.set_verbosity_error()

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)
KINDS = ("dinov2", "dinov2-reg", "clip", "mae", "vit")


def tiny_checkpoint(kind: str, path: Path, seed: int = 0, **processor_kwargs) -> tuple[torch.nn.Module, Path]:
    """Save a tiny random model of a family (the checkpoint class its hub models use) plus its processor."""
    T = transformers
    torch.manual_seed(seed)
    if kind in ("dinov2", "dinov2-reg"):
        cfg_cls, model_cls = (T.Dinov2Config, T.Dinov2Model) if kind == "dinov2" else (
            T.Dinov2WithRegistersConfig, T.Dinov2WithRegistersModel)
        extra = {"num_register_tokens": 4} if kind == "dinov2-reg" else {}
        model = model_cls(cfg_cls(**TINY, mlp_ratio=2, **extra))
        proc = T.BitImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, **processor_kwargs)
    elif kind == "clip":  # a full CLIP checkpoint, text tower included, as on the hub
        text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=99,
                    bos_token_id=0, eos_token_id=1, pad_token_id=1)
        model = T.CLIPModel(T.CLIPConfig(text_config=text, vision_config={**TINY, "intermediate_size": 64}))
        proc = T.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, **processor_kwargs)
    elif kind == "mae":  # the hub checkpoint is the pre-training model (encoder + decoder)
        model = T.ViTMAEForPreTraining(T.ViTMAEConfig(**TINY, intermediate_size=64, mask_ratio=0.75, decoder_hidden_size=16,
                                                      decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
                                                      decoder_intermediate_size=32))
        proc = T.ViTImageProcessor(size={"height": 32, "width": 32}, **processor_kwargs)
    elif kind == "vit":  # the supervised checkpoint carries a classifier head
        model = T.ViTForImageClassification(T.ViTConfig(**TINY, intermediate_size=64, num_labels=3))
        proc = T.ViTImageProcessor(size={"height": 32, "width": 32}, **processor_kwargs)
    else:
        raise ValueError(kind)
    model.eval().save_pretrained(path)
    proc.save_pretrained(path)
    return model, path


def encoder_of(kind: str, model: torch.nn.Module) -> torch.nn.Module:
    return {"clip": lambda m: m.vision_model, "mae": lambda m: m.vit, "vit": lambda m: m.vit}.get(kind, lambda m: m)(model)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[torch.nn.Module, Path]]:
    root = tmp_path_factory.mktemp("ckpt")
    return {k: tiny_checkpoint(k, root / k) for k in KINDS}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("side", [32, 48])  # native, and off-native (position-embedding interpolation)
def test_hf_checkpoint_tokens_match_the_saved_model(checkpoints, kind, side):
    model, path = checkpoints[kind]
    bb = resolve_backbone(str(path))
    info = bb.info
    n_reg = 4 if kind == "dinov2-reg" else 0
    assert (info.n_layers, info.width, info.patch_size, info.input_size) == (2, 32, 8, 32)
    assert info.n_prefix == 1 + n_reg and info.cls_index == 0
    assert info.register_indices == tuple(range(1, 1 + n_reg))
    assert info.family == {"dinov2-reg": "dinov2"}.get(kind, kind)
    x = torch.randn(3, 3, side, side, generator=torch.Generator().manual_seed(1))
    hs = bb.hidden_states(x, [0, 1, 2])
    grid = (side // 8) ** 2
    assert [h.shape for h in hs] == [(3, 1 + n_reg + grid, 32)] * 3
    enc = encoder_of(kind, model)
    kwargs = {"interpolate_pos_encoding": True} if kind in ("clip", "mae", "vit") else {}
    if kind == "mae":  # reference: masking off with random shuffling, unshuffled afterwards via ids_restore
        enc.config.mask_ratio = 0.0
        out = enc(pixel_values=x, output_hidden_states=True, **kwargs)
        restore = out.ids_restore
        ref = [torch.cat([h[:, :1], torch.gather(h[:, 1:], 1, restore[..., None].expand(-1, -1, 32))], 1)
               for h in out.hidden_states]
        assert not torch.allclose(out.hidden_states[2], hs[2], atol=1e-3)  # the raw output is shuffled
    else:
        with torch.no_grad():
            ref = enc(pixel_values=x, output_hidden_states=True, **kwargs).hidden_states
    assert len(ref) == info.n_layers + 1
    for ours, theirs in zip(hs, ref):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_clip_loads_the_vision_tower_only(checkpoints):
    model, path = checkpoints["clip"]
    bb = resolve_backbone(str(path))
    assert type(bb.model).__name__ == "CLIPVisionModel"
    assert not [n for n, _ in bb.model.named_parameters() if "text" in n]
    assert bb.info.n_params == sum(p.numel() for p in model.vision_model.parameters())
    assert bb.info.n_params < sum(p.numel() for p in model.parameters())


def test_preprocessing_comes_from_the_checkpoint_processor(tmp_path):
    _, path = tiny_checkpoint("dinov2", tmp_path / "m", image_mean=[0.5, 0.25, 0.0], image_std=[0.5, 0.25, 1.0])
    bb = resolve_backbone(str(path))
    rgb = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    x = bb.prepare({"image": [{"bytes": buf.getvalue(), "path": None}]}, 32)
    expected = (rgb / 255.0 - np.array([0.5, 0.25, 0.0])) / np.array([0.5, 0.25, 1.0])
    np.testing.assert_allclose(x[0].permute(1, 2, 0).numpy(), expected, atol=1e-6)
    assert bb.identity()["preprocess"]["std"] == [0.5, 0.25, 1.0]


@pytest.fixture
def tiny_preset(monkeypatch) -> str:
    """A registered preset small enough to build many times (random init of a real preset takes seconds)."""
    monkeypatch.setitem(PRESETS, "tiny-reg", Preset("none/tiny", "dinov2_with_registers", 32,
                                                    {**TINY, "mlp_ratio": 2, "num_register_tokens": 4}))
    return "random:tiny-reg"


def test_random_init_is_seeded(tiny_preset):
    a, b, c = (resolve_backbone(tiny_preset, seed=s) for s in (0, 0, 1))
    assert a.identity()["weights"] == b.identity()["weights"] != c.identity()["weights"]
    assert (a.info.revision, c.info.revision) == ("seed=0", "seed=1")
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(a.hidden_states(x, [2])[0], b.hidden_states(x, [2])[0])
    assert a.info.register_indices == (1, 2, 3, 4)


def test_random_preset_builds_the_listed_architecture():
    bb = resolve_backbone("random:dinov2-small")
    assert bb.info == {i.spec: i for i in list_backbones()}["random:dinov2-small"]
    assert [h.shape for h in bb.hidden_states(torch.zeros(1, 3, 28, 28), [0, 12])] == [(1, 5, 384)] * 2


def test_preset_parameter_counts_match_the_architectures():
    for name, preset in PRESETS.items():
        assert preset.n_params == preset_n_params(preset), name
    assert PRESETS["clip-vit-large-14-336"].input_size == 336
    assert PRESETS["dinov2-large-reg"].config["num_register_tokens"] == 4


def test_registry_lists_every_kind_without_download():
    specs = [i.spec for i in list_backbones()]
    for name in PRESETS:
        assert name in specs and f"random:{name}" in specs
    assert {"pixels", "oracle:objects", "oracle:features", "oracle:patches", "oracle:mix-0.5"} <= set(specs)
    assert len(PRESETS) == 12


@pytest.mark.parametrize("spec, hint", [
    ("dinov2-smal", "dinov2-small"), ("random:dinov2-larg", "random:dinov2-large"), ("oracle:object", "oracle:objects"),
])
def test_unknown_spec_suggests_close_matches(spec, hint):
    with pytest.raises(BenchError, match=hint):
        resolve_backbone(spec)


@pytest.mark.parametrize("spec", ["pixels:0", "pixels:x", "oracle:mix-1.5", "./no/such/dir"])
def test_bad_builtin_specs_are_bench_errors(spec):
    with pytest.raises(BenchError):
        resolve_backbone(spec)


def network_waits(monkeypatch) -> list[tuple[float, str]]:
    """Each network wait of the hub code, as (its deadline in s, how it ended: "returned", "timed
    out", or the error's type and reason), in order. Every wait on the hub runs under the watchdog
    `hub.with_stall_deadline`; a command that fails fast waits out none of their deadlines."""
    import evaluators.backbones.hub as hub
    import evaluators.backbones.hub_weights as hub_weights

    waits: list[tuple[float, str]] = []
    watchdog = hub.with_stall_deadline

    def watched(fn, watch, deadline=None):
        seconds = hub.STALL_DEADLINE_S if deadline is None else deadline
        try:
            value = watchdog(fn, watch, deadline)
        except TimeoutError:  # the watchdog's, or a socket's own timeout
            waits.append((seconds, "timed out"))
            raise
        except BaseException as e:
            reason = getattr(e, "reason", None)
            waits.append((seconds, type(e).__name__ + (f": {type(reason).__name__}"
                                                       if isinstance(reason, BaseException) else "")))
            raise
        waits.append((seconds, "returned"))
        return value

    for module in (hub, hub_weights):
        monkeypatch.setattr(module, "with_stall_deadline", watched)
    return waits


def test_uncached_hub_id_fails_fast_offline(tmp_path, monkeypatch):
    """Offline, no network is tried; with a hub at a closed port, the one probe is refused at once
    and no deadline is waited out (the test asserted this on wall time before)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    waits = network_waits(monkeypatch)
    with pytest.raises(BenchError, match="not in the local Hugging Face cache.*pass its directory"):
        resolve_backbone("facebook/dinov2-small")
    assert waits == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # closed port: unreachable without leaving the machine
    with pytest.raises(BenchError, match="could not be downloaded"):
        resolve_backbone("dinov2-small")
    assert [how for _, how in waits] == ["URLError: ConnectionRefusedError"]


def test_the_network_watchdog_gives_up_after_its_deadline_without_progress(tmp_path, monkeypatch):
    """`hub.with_stall_deadline` on a fake clock that moves 1/64 s at each reading (its own polls),
    around a call that never returns: without a folder to watch its deadline is a total one; with
    one, a download that grows at each poll runs on past the deadline, and once it stops growing
    the call is given up the first poll `deadline` s after its last growth."""
    import evaluators.backbones.hub as hub

    step, deadline = 1 / 64, 3 / 64  # binary fractions: the clock's sums are exact
    growing = {"polls": 0}
    readings: list[float] = []

    def clock() -> float:
        if growing["polls"]:
            growing["polls"] -= 1
            with open(tmp_path / "download", "ab") as f:
                f.write(b"x")
        readings.append(len(readings) * step)
        return readings[-1]

    monkeypatch.setattr(hub, "time", SimpleNamespace(monotonic=clock))
    release = threading.Event()
    try:
        with pytest.raises(TimeoutError, match="no progress for 0 s"):
            hub.with_stall_deadline(lambda: release.wait(60), None, deadline)
        assert readings[-1] - readings[1] == deadline  # from its first poll, where it started counting
        readings.clear()
        growing["polls"] = 20
        with pytest.raises(TimeoutError):
            hub.with_stall_deadline(lambda: release.wait(60), tmp_path, deadline)
        assert (tmp_path / "download").stat().st_size == 20
        assert readings[-1] > 5 * deadline  # it ran on while the download grew
        assert readings[-1] - readings[20] == deadline  # the poll that saw the last growth started the count
    finally:
        release.set()
    assert hub.with_stall_deadline(lambda: 7, tmp_path, deadline) == 7


def test_hub_id_loads_from_the_local_cache(tmp_path, monkeypatch, checkpoints):
    """A hub id found in the HF cache loads offline, and its revision is the snapshot's commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny--dino"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for f in checkpoints["dinov2"][1].iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bb = resolve_backbone("tiny/dino")
    assert bb.info.revision == commit
    assert bb.identity()["weights"] == resolve_backbone(str(checkpoints["dinov2"][1])).identity()["weights"]


def test_bench_models_cli(capsys, tmp_path, monkeypatch):
    assert main(["models", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["spec"] for r in rows} >= {"dinov2-giant-reg", "random:mae-vit-large", "pixels", "oracle:patches"}
    giant = next(r for r in rows if r["spec"] == "dinov2-giant")
    assert (giant["source"], giant["n_layers"], giant["width"]) == ("facebook/dinov2-giant", 40, 1536)
    assert main(["models"]) == 0 and "dinov2-giant-reg" in capsys.readouterr().out
    assert main(["models", "dinov2-smal"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean dinov2-small" in err[0]
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["models", "facebook/dinov2-large"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
