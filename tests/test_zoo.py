"""The zoo: deterministic, resumable training; publication in one piece; `zoo:NAME` ≡ its directory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from bench.cli import main
from bench.core.errors import BenchError
from evaluators.backbones import resolve_backbone
from evaluators.zoo import RECIPES, ZOO_ENV, training
from evaluators.zoo.cards import CARD_NAME, partial_dir
from evaluators.zoo.training import train_recipe

TINY_ARCH = dict(RECIPES["features"].architecture, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64)
TINY_DATA = dict(n_train=24, n_val=8, shard_size=16)


def tiny(name: str, **changes):
    """The recipe at test size: its scenes (64 px, 24-px objects) and objective, a smaller ViT, 24 of them."""
    return RECIPES[name].with_(architecture=TINY_ARCH, data=dict(RECIPES[name].data, **TINY_DATA), batch_size=8,
                               warmup=2, steps=0 if name == "untrained" else 4, **changes)


def use_tiny_zoo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the cache at `tmp_path` with tiny recipes (same objectives, a 2-layer width-32 ViT,
    24 scenes) and checkpoints every 2 steps; the zoo folder inside it."""
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(ZOO_ENV, raising=False)
    for name in RECIPES:
        monkeypatch.setitem(RECIPES, name, tiny(name))
    monkeypatch.setattr(training, "CHECKPOINT_EVERY", 2)
    return tmp_path / "zoo"


@pytest.fixture
def zoo_cache(tmp_path, monkeypatch):
    """A private cache whose recipes are tiny (`use_tiny_zoo`)."""
    return use_tiny_zoo(tmp_path, monkeypatch)


def weights(path):
    return (path / "model.safetensors").read_bytes()


class Interrupt(Exception):
    pass


def stop_after(n):
    seen = []

    def progress(k):
        seen.append(k)
        if len(seen) == n:
            raise Interrupt

    return progress


def test_same_seed_same_bytes_and_resume_continues_exactly(tmp_path, monkeypatch):
    """A run interrupted after a checkpoint and resumed (in a fresh model, optimizer and RNG) writes the
    same weight bytes as an uninterrupted run of its seed; another seed does not."""
    monkeypatch.setattr(training, "CHECKPOINT_EVERY", 2)
    recipe = tiny("masked")
    a = train_recipe(recipe, tmp_path / "a")
    with pytest.raises(Interrupt):  # stops after step 3: the checkpoint of step 2 stays
        train_recipe(recipe, tmp_path / "c", progress=stop_after(3))
    partial = partial_dir(tmp_path / "c", recipe)
    assert torch.load(partial / training.STATE_NAME, weights_only=False)["state"]["step"] == 2
    assert not (tmp_path / "c" / recipe.folder).exists()
    c = train_recipe(recipe, tmp_path / "c")
    assert weights(c) == weights(a) and not partial.exists()
    assert weights(train_recipe(recipe.with_(seed=1), tmp_path / "d")) != weights(a)
    card = json.loads((a / CARD_NAME).read_text())
    assert card["seed"] == 0 and card["steps"] == 4 and card["recipe"]["objective"] == "masked"
    assert card["data"]["fingerprint"] and card["final_train_loss"] > 0 and card["final_val_loss"] > 0
    assert card["wall_time_s"] > 0


def test_training_beats_the_best_constant_predictor(tmp_path):
    """150 steps take the F head below the base rate's loss (labels wired to the wrong scenes would not)."""
    recipe = tiny("features").with_(steps=150, lr=3e-3)
    card = json.loads((train_recipe(recipe, tmp_path) / CARD_NAME).read_text())
    # F is 2 of 8 colours and 2 of 8 shapes: the best constant predictor scores H(1/4) nats per value
    chance = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert card["final_train_loss"] < chance - 0.025, card["final_train_loss"]


def test_zoo_spec_is_the_local_checkpoint_path(zoo_cache, balanced_small, capsys):
    """Train through the CLI, load as zoo:NAME and as its directory (one cache entry), evaluate it."""
    from bench.core.dataset import Dataset
    from evaluators.cache.extract import extract_activations
    from leaderboards.store import load_results

    assert main(["zoo", "train", "features"]) == 0
    path = capsys.readouterr().out.strip()
    assert main(["zoo", "path", "features"]) == 0 and capsys.readouterr().out.strip() == path
    by_name, by_dir = resolve_backbone("zoo:features"), resolve_backbone(path)
    assert by_name.info.revision == by_dir.info.revision and by_name.identity() == by_dir.identity()
    from evaluators.backbones import backbone_metadata

    for spec in ("zoo:features", path):  # what a study plans from without loading it: what loading gives
        planned = backbone_metadata(spec)
        assert (planned.revision, planned.n_layers, planned.width) == (by_dir.info.revision, by_dir.info.n_layers,
                                                                      by_dir.info.width)
    ds = Dataset(balanced_small)
    a = extract_activations("zoo:features", ds, "test", layers=[2], token_choices=["cls"], progress=False)
    b = extract_activations(path, ds, "test", layers=[2], token_choices=["cls"], progress=False)
    assert a.path == b.path  # keyed by the weights' hash, not by the name
    results = zoo_cache.parent / "results"
    assert main(["evaluate", "--model", "zoo:features", "--dataset", str(balanced_small), "--probes", "linear",
                 "--epochs", "2", "--results", str(results)]) == 0
    capsys.readouterr()
    rows = load_results(results)
    assert rows and {r["backbone"] for r in rows} == {"zoo:features"}
    assert {r["backbone_revision"] for r in rows} == {by_dir.info.revision}
    assert main(["zoo", "list", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["features"]["status"] == "trained" and rows["masked"]["status"] == "not trained"
    assert main(["zoo", "train", "features"]) == 0  # a finished model is reused, not retrained
    assert capsys.readouterr().out.strip() == path


@pytest.mark.parametrize("argv, message", [
    (["zoo", "train", "feature"], "unknown model 'feature'; did you mean features"),
    (["zoo", "path", "masked"], "masked is not trained yet"),
    (["evaluate", "--model", "zoo:nope", "--dataset", "DATA"], "unknown model 'nope'"),
])
def test_bad_names_exit_2(zoo_cache, balanced_small, capsys, argv, message):
    assert main([str(balanced_small) if a == "DATA" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_half_written_runs_exit_2_and_other_seeds_train_apart(zoo_cache, capsys):
    """An interrupted run resumes only as its own recipe; another seed trains into a folder of its
    own beside it; a half-written directory is never a model."""
    with pytest.raises(Interrupt):
        train_recipe(RECIPES["features"], zoo_cache, progress=stop_after(3))
    interrupted = partial_dir(zoo_cache, RECIPES["features"])
    assert main(["zoo", "train", "features", "--seed", "1"]) == 0
    variant = capsys.readouterr().out.strip()
    assert variant == str(zoo_cache / RECIPES["features"].with_(seed=1).folder) and interrupted.exists()
    assert main(["zoo", "path", "features"]) == 2 and "not trained yet" in capsys.readouterr().err
    assert main(["zoo", "list", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["status"], r["seed"], r["path"]) for r in rows if r["name"] == "features"] == [
        ("interrupted", 0, str(zoo_cache / RECIPES["features"].folder)), ("variant", 1, variant)]
    # a published directory without its card (as a copy cut short would leave it)
    assert main(["zoo", "train", "features"]) == 0
    path = zoo_cache / RECIPES["features"].folder
    assert capsys.readouterr().out.strip() == str(path) and not interrupted.exists()
    (path / CARD_NAME).unlink()
    (path / "model.safetensors").write_bytes(weights(path)[:100])
    assert main(["zoo", "path", "features"]) == 2 and "not trained yet" in capsys.readouterr().err
    with pytest.raises(BenchError, match="not trained yet"):
        resolve_backbone("zoo:features")
    with pytest.raises(BenchError):  # the same truncated directory passed as --model DIR
        resolve_backbone(str(path))
    assert main(["zoo", "train", "features"]) == 2
    err = capsys.readouterr().err
    assert "holds no zoo_card.json" in err and len(err.strip().splitlines()) == 1


def test_a_changed_recipe_trains_apart_and_the_old_model_is_stale(zoo_cache, capsys, monkeypatch):
    """Editing a recipe retrains into a new folder, keeps the old one (listed stale, never loaded as
    zoo:NAME), and zoo:NAME follows the recipe as written."""
    old = train_recipe(RECIPES["conjunctions"], zoo_cache)
    old_revision = resolve_backbone("zoo:conjunctions").info.revision
    monkeypatch.setitem(RECIPES, "conjunctions", RECIPES["conjunctions"].with_(lr=2e-3))
    assert main(["zoo", "path", "conjunctions"]) == 2 and "not trained yet" in capsys.readouterr().err
    assert main(["zoo", "train", "conjunctions"]) == 0
    new = capsys.readouterr().out.strip()
    assert new != str(old) and new == str(zoo_cache / RECIPES["conjunctions"].folder)
    assert weights(old) != weights(Path(new))  # the old model is still there, untouched
    assert resolve_backbone("zoo:conjunctions").info.revision not in (old_revision, "not trained")
    assert main(["zoo", "list", "--format", "json"]) == 0
    rows = [(r["name"], r["status"], r["path"]) for r in json.loads(capsys.readouterr().out)]
    assert ("conjunctions", "trained", new) in rows and ("conjunctions", "stale", str(old)) in rows
    assert main(["zoo", "list"]) == 0 and "stale" in capsys.readouterr().out


def test_folders_are_named_by_the_whole_recipe():
    """Every setting (seed and steps too) enters the folder's hash; the name stays readable."""
    r = RECIPES["masked"]
    names = {r.folder, r.with_(seed=1).folder, r.with_(steps=r.steps + 1).folder, r.with_(mask_ratio=0.75).folder,
             r.with_(data=dict(r.data, n_train=7)).folder}
    assert len(names) == 5 and all(n.startswith("masked-") and len(n) == len("masked-") + 12 for n in names)
    assert r.folder == RECIPES["masked"].with_().folder


@pytest.mark.parametrize("damage", ["truncated", "deleted", "garbage-config", "card-list", "card-empty", "old-card"])
def test_a_damaged_model_is_listed_refused_and_trained_again(zoo_cache, balanced_small, capsys, damage):
    """Weights that differ from the card's hash, a missing file or a card of the wrong shape mark
    the model damaged: listed so, refused by evaluate in one line, trained again by `zoo train`.
    A card written before hashes were recorded still loads, and gains them."""
    assert main(["zoo", "train", "untrained"]) == 0
    path = Path(capsys.readouterr().out.strip())
    card = json.loads((path / CARD_NAME).read_text())
    good = weights(path)
    if damage == "truncated":
        (path / "model.safetensors").write_bytes(good[: len(good) // 2])
    elif damage == "deleted":
        (path / "model.safetensors").unlink()
    elif damage == "garbage-config":
        (path / "config.json").write_text("garbage")
    elif damage == "card-list":
        (path / CARD_NAME).write_text("[]")
    elif damage == "card-empty":
        (path / CARD_NAME).write_text("{}")
    else:
        (path / CARD_NAME).write_text(json.dumps({k: v for k, v in card.items() if k != "files"}))
    assert main(["zoo", "list", "--format", "json"]) == 0
    status = {r["name"]: r["status"] for r in json.loads(capsys.readouterr().out)}["untrained"]
    if damage == "old-card":
        assert status == "trained" and json.loads((path / CARD_NAME).read_text())["files"] == card["files"]
        return
    assert status.startswith("damaged: ")
    code = main(["evaluate", "--model", "zoo:untrained", "--dataset", str(balanced_small), "--probes", "linear",
                 "--results", str(zoo_cache.parent / "results")])
    err = capsys.readouterr().err
    assert code == 2 and "is damaged" in err and len(err.strip().splitlines()) == 1, err
    assert main(["zoo", "train", "untrained"]) == 0 and Path(capsys.readouterr().out.strip()) == path
    assert weights(path) == good and json.loads((path / CARD_NAME).read_text())["files"] == card["files"]


@pytest.mark.parametrize("changes", [{}, dict(qkv_bias=False), dict(image_size=96, hidden_size=32, num_hidden_layers=2,
                                                                     intermediate_size=100)])
def test_a_zoo_architectures_parameter_count_is_the_built_models(changes):
    """`bench models` and a study's plan count a zoo model's parameters from its config, without torch:
    the count is that of the `ViTModel` the zoo builds (on the meta device here)."""
    from transformers import ViTConfig, ViTModel

    from evaluators.zoo.listing import vit_parameters

    architecture = {**RECIPES["features"].architecture, **changes}
    with torch.device("meta"):
        model = ViTModel(ViTConfig(**architecture), add_pooling_layer=False)
    assert vit_parameters(architecture) == sum(p.numel() for p in model.parameters())
