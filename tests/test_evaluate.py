"""`bench evaluate` and run_evaluation end to end on a tiny dataset (offline, CPU)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.cli import main
from bench.core.dataset import Dataset
from bench.core.results import KEY_COLUMNS, read_results
from tests.helpers import make_dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("data") / "tiny", n_train=48, n_val=16, n_test=16, image_size=64,
                        n_colors=3, n_shapes=3, colors_per_scene=2, shapes_per_scene=2, n_objects=3,
                        object_size=12, margin=2, val_fraction=0.25, test_fraction=0.25)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.slow
def test_evaluate_writes_documented_columns_and_skips_finished_rows(tiny, tmp_path, capsys):
    results = tmp_path / "results"
    common = ["evaluate", "--dataset", str(tiny), "--epochs", "2", "--results", str(results), "--format", "json"]
    args = [*common, "--model", "oracle:objects", "--model", "random:dinov2-small", "--probes", "linear,dnn"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {(r["backbone"], r["probe"]) for r in summary} == {
        (b, p) for b in ("oracle:objects", "random:dinov2-small") for p in ("linear", "dnn")}
    table = read_results(results)
    assert table.num_rows == 4
    rows = table.to_pylist()
    from evaluators.tasks.binding.metrics import metric_checks  # rows carry the checks the leaderboard marks

    assert [r["checks"] for r in rows] == [
        metric_checks(r) + [f"β*_paper: {c}" for c in metric_checks(r, "beta_star_paper") if c != "not converged"]
        for r in rows]
    assert any(r["checks"] for r in rows)  # 2 epochs: "not converged" at least
    assert [r["checks"] for r in summary] == ["; ".join(r["checks"]) or None for r in rows]
    frame = table.to_pandas()  # what a pandas (or duckdb) reader sees: a list of strings per row
    assert list(frame["checks"].map(list)) == [r["checks"] for r in rows]
    for r in rows:
        assert r["status"] == "ok", r["error"]
        assert r["task"] == "binding" and r["split"] == "test" and r["tokens"] == "cls" and r["seed"] == 0
        assert r["dataset"] == "tiny" and r["n_train"] == 48 and r["n_test"] == 16
        bits = {k: r[f"scene_bits_{k}"] for k in ("F", "O_given_F", "O_paper", "F_paper")}
        assert {len(v) for v in bits.values()} == {16}
        assert r["L_O_given_F"] == pytest.approx(sum(bits["O_given_F"]) / 16, rel=1e-5)
        assert r["L_O_paper"] == pytest.approx(sum(bits["O_paper"]) / 16, rel=1e-5)
        assert r["L_O"] == pytest.approx(r["L_F"] + r["L_O_given_F"])
        assert r["beta_star_lo"] <= r["beta_star"] <= r["beta_star_hi"] <= 1
        assert r["B_star"] == pytest.approx(r["H_O_given_F"] - r["L_O_given_F"])
        assert r["B_O"] == pytest.approx(r["B_F"] + r["B_star"])
        assert r["B_star_paper"] == pytest.approx(r["H_O_given_F"] - (r["L_O_paper"] - r["L_F_paper"]))
        assert r["prior"] == "exact" and r["converged"] in (True, False) and r["n_F_eff"] > 1
        assert json.loads(r["config"])["probe"] == r["probe"] and r["config_hash"]
        assert r["wall_time_s"] > 0 and r["package_versions"] and r["run_id"]
        assert r["command"] == shlex.join(["bench", *args])  # the run's provenance: what made it
    layers = {r["backbone"]: (r["layer"], r["n_layers"]) for r in rows}
    assert layers["oracle:objects"] == (0, 0)
    assert layers["random:dinov2-small"] == (12, 12)

    assert main(args) == 0  # every key is present: nothing runs, nothing is written
    assert "nothing to do" in capsys.readouterr().err
    assert len(list(results.glob("*.parquet"))) == 1

    more = [*common, "--model", "oracle:objects,random:dinov2-small", "--model", "oracle:features",
            "--probes", "linear", "--probes", "quadratic"]
    assert main(more) == 0
    new = read_results(results)
    keys = [tuple(r[c] for c in KEY_COLUMNS) for r in new.to_pylist()]
    assert len(keys) == len(set(keys)) == 4 + 2 + 2  # only quadratic x 2 models and oracle:features x 2 probes ran


def test_an_edited_checkpoint_or_changed_probe_is_measured_again_and_supersedes(tiny, tmp_path, capsys):
    from tests.test_backbones import tiny_checkpoint

    model_dir, results = tmp_path / "mine", tmp_path / "results"
    tiny_checkpoint("vit", model_dir, seed=0)
    args = ["evaluate", "--dataset", str(tiny), "--model", str(model_dir), "--probes", "linear",
            "--results", str(results), "--format", "json"]
    rows: list[dict] = []  # in the order they were written

    def written() -> None:
        rows.extend(r for r in read_results(results).to_pylist() if r["run_id"] not in {o["run_id"] for o in rows})

    assert main([*args, "--epochs", "1"]) == 0
    written()
    assert main([*args, "--epochs", "1"]) == 0 and "nothing to do" in capsys.readouterr().err  # same weights, same probe
    tiny_checkpoint("vit", model_dir, seed=1)  # the checkpoint is edited in place: same spec, new weights
    assert main([*args, "--epochs", "1"]) == 0
    written()
    assert main([*args, "--epochs", "2"]) == 0  # the probe's settings changed: measured again too
    written()
    assert len(read_results(results)) == len(rows) == 3 and {r["backbone"] for r in rows} == {str(model_dir)}
    weights = [r["weights_fingerprint"] for r in rows]
    assert weights[0] != weights[1] == weights[2] and weights[0].startswith("sha256:")
    probes = [r["probe_fingerprint"] for r in rows]
    assert probes[0] == probes[1] != probes[2]
    assert [json.loads(r["config"])["train"]["epochs"] for r in rows] == [1, 1, 2]
    capsys.readouterr()

    from leaderboards.store import load_selected

    chosen = load_selected(results)
    assert [r["run_id"] for r in chosen.rows] == [rows[2]["run_id"]]  # the newest weights and probe win, alone
    assert chosen.note.count("\n") == 0 and f"older weights {weights[0][:12]}" in chosen.note
    assert f"older probe {probes[0][:12]}" in chosen.note and "--show-old" in chosen.note
    shown = load_selected(results, show_old=True)
    assert sorted(r["backbone"] for r in shown.rows) == sorted(
        [str(model_dir), f"{model_dir} (weights {weights[0][:12]})", f"{model_dir} (probe {probes[0][:12]})"])
    assert shown.note is None


def test_rows_of_an_older_schema_are_set_aside_with_a_note(tiny, tmp_path, capsys):
    import pyarrow as pa

    from bench.core.results import RESULTS_SCHEMA_VERSION

    assert RESULTS_SCHEMA_VERSION == 5
    old = pa.table({"backbone": ["oracle:objects"], "beta_star": [0.5]})
    pq.write_table(old.replace_schema_metadata({b"bindingbench_results_schema_version": b"4"}), tmp_path / "old.parquet")
    assert main(["evaluate", "--dataset", str(tiny), "--model", "oracle:features", "--probes", "linear",
                 "--epochs", "1", "--results", str(tmp_path)]) == 0  # the old file neither raises nor counts as done
    capsys.readouterr()
    assert main(["leaderboard", str(tmp_path), "--metric", "beta_star"]) == 0
    out, err = capsys.readouterr()
    assert "oracle:features" in out and "oracle:objects" not in out
    # one note (wrapped to the terminal's 100 columns), naming the file set aside
    assert err.count("set aside") == 1 and "old.parquet (schema 4, 1 rows)" in " ".join(err.split())


def test_limit_rows_carry_their_own_fingerprint(tiny, tmp_path):
    from evaluators.runner.request import EvaluationRequest
    from evaluators.runner.run import run_evaluation

    request = EvaluationRequest(["oracle:features"], tiny, probes=["linear"], epochs=1, results_dir=tmp_path, limit=8)
    path = run_evaluation(request, progress=False)
    (row,) = pq.read_table(path).to_pylist()
    assert row["n_train"] == 8 and row["n_test"] == 8 and len(row["scene_bits_O_given_F"]) == 8
    full = json.loads((tiny / "dataset.json").read_text())["splits"]["test"]["fingerprint"]
    assert row["dataset_fingerprint"] != full and json.loads(row["config"])["limit"] == 8 and row["limit"] == 8


def test_a_failing_probe_becomes_an_error_row(tiny, tmp_path, monkeypatch):
    import evaluators.probes.pooled as probes
    from evaluators.runner.request import EvaluationRequest
    from evaluators.runner.run import run_evaluation

    def broken(self, x, t, cond):
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(probes.QuadraticProbe, "readout", broken)
    path = run_evaluation(EvaluationRequest(["oracle:objects"], tiny, probes=["linear", "quadratic"], epochs=1,
                                            results_dir=tmp_path), progress=False)
    rows = {r["probe"]: r for r in pq.read_table(path).to_pylist()}
    assert rows["linear"]["status"] == "ok"
    assert rows["quadratic"]["status"] == "error" and "probe exploded" in rows["quadratic"]["error"]
    assert rows["quadratic"]["L_O"] is None and rows["quadratic"]["beta_star"] is None


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--model", "oracle:objects", "--probes", "mlp"], "probe: unknown 'mlp'"),
        (["--model", "oracle:objects", "--probes", "attention"], "needs spatial tokens"),
        (["--model", "oracle:objects", "--probes", "attention", "--tokens", "all"], "no spatial tokens"),
        (["--model", "oracle:objects", "--layers", "3"], "layers: '3' out of range"),
        (["--model", "oracle:nothing"], "unknown oracle"),
        (["--model", "oracle:objects", "--seeds", "x"], "seeds: expected integers"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(tiny, tmp_path, capsys, extra, message):
    code = main(["evaluate", "--dataset", str(tiny), "--results", str(tmp_path), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
    assert not list(tmp_path.glob("*.parquet"))


def test_dataset_without_codes_exits_2(tiny, tmp_path, capsys):
    card = json.loads((tiny / "dataset.json").read_text())
    broken = tmp_path / "nocodes"
    broken.mkdir()
    for f in tiny.glob("*.parquet"):
        (broken / f.name).symlink_to(f)
    del card["feature_space"]
    (broken / "dataset.json").write_text(json.dumps(card))
    assert main(["evaluate", "--dataset", str(broken), "--model", "oracle:objects"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no F/O codes" in err and len(err.splitlines()) == 1


def _card_copy(tiny: Path, where: Path, edit) -> Path:
    """A dataset sharing `tiny`'s shards whose card was changed by `edit(card)`."""
    card = json.loads((tiny / "dataset.json").read_text())
    where.mkdir()
    for f in tiny.glob("*.parquet"):
        (where / f.name).symlink_to(f)
    edit(card)
    (where / "dataset.json").write_text(json.dumps(card))
    return where


def test_card_without_exact_priors_exits_2_unless_unanchored(tiny, tmp_path, capsys):
    """An older or hand-made card has no generator config to rebuild the exact priors from."""
    handmade = _card_copy(tiny, tmp_path / "handmade", lambda card: card.pop("config"))
    results = tmp_path / "results"
    args = ["evaluate", "--dataset", str(handmade), "--model", "oracle:objects", "--probes", "linear",
            "--epochs", "2", "--results", str(results), "--format", "json"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "--unanchored" in err and len(err.splitlines()) == 1, err
    assert not results.exists() or not list(results.glob("*.parquet"))

    assert main([*args, "--unanchored"]) == 0
    capsys.readouterr()
    (row,) = read_results(results).to_pylist()
    assert row["status"] == "ok" and row["prior"] == "none" and row["n_F_eff"] is None
    # without an anchor the F-probe is the paper's F-probe: one probe, both columns
    assert row["L_F"] == row["L_F_paper"] and row["scene_bits_F"] == row["scene_bits_F_paper"]
    # references: the rows' own H(O|F=f) (all equal on a balanced set), the card's H(F) (no exact P(f))
    test = json.loads((tiny / "dataset.json").read_text())["splits"]["test"]
    assert row["H_O_given_F"] == pytest.approx(test["H_O_given_F"], abs=1e-9)
    assert row["H_F"] == pytest.approx(test["H_F"], abs=1e-9)


def test_unanchored_is_refused_where_exact_priors_exist(tiny, tmp_path, capsys):
    code = main(["evaluate", "--dataset", str(tiny), "--model", "oracle:objects", "--unanchored",
                 "--results", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "drop --unanchored" in err and len(err.splitlines()) == 1


def test_the_summary_fits_100_columns_unless_asked_for_every_column(tiny, tmp_path, capsys):
    """Read from a pipe (as here) or a terminal alike: 100 columns, headline numbers in %;
    --wide gives every summary column at its natural width."""
    args = ["evaluate", "--dataset", str(tiny), "--epochs", "2", "--results", str(tmp_path / "r"),
            "--model", "oracle:objects", "--model", "oracle:features", "--probes", "linear"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100 and "β* %" in out and "oracle:features" in out
    assert "e-0" not in out and " -0.0 " not in out
    assert main([*args, "--wide", "--overwrite"]) == 0
    wide = capsys.readouterr().out
    assert max(map(len, wide.splitlines())) > 100 and "beta_star_paper" in wide and "exact_accuracy" in wide


def test_the_python_api_evaluates_loads_and_ranks(tiny, tmp_path):
    from bench import api

    df = api.evaluate(["oracle:objects", "oracle:features"], dataset=tiny, probes=["linear"], epochs=2,
                      results=tmp_path)
    assert sorted(df["backbone"]) == ["oracle:features", "oracle:objects"] and set(df["status"]) == {"ok"}
    beta = dict(zip(df["backbone"], df["beta_star"]))
    assert all(0 <= b <= 1 for b in beta.values())
    loaded = api.load_results(tmp_path)
    assert len(loaded) == 2 and "scene_bits_F" not in loaded.columns and loaded.attrs["set_aside"] is None
    for check in {c for cs in loaded["checks"] for c in cs}:
        assert list(loaded[f"‡ {check}"]) == [check in cs for cs in loaded["checks"]]
    board = api.leaderboard(loaded, metric="beta_star")
    assert sorted(board["backbone"]) == ["oracle:features", "oracle:objects"] and set(board["metric"]) == {"beta_star"}
    assert dict(zip(board["backbone"], board["value"])) == pytest.approx(beta)  # the rows' numbers, ranked


def test_a_display_name_fills_the_backbone_column_and_the_spec_keeps_its_own(tiny, tmp_path, capsys):
    args = ["evaluate", "--dataset", str(tiny), "-m", "mine=oracle:objects", "-m", "oracle:features",
            "--probes", "linear", "--epochs", "1", "--results", str(tmp_path)]
    assert main(args) == 0
    rows = {r["backbone"]: r for r in read_results(tmp_path).to_pylist()}
    assert {b: r["spec"] for b, r in rows.items()} == {"mine": "oracle:objects", "oracle:features": "oracle:features"}
    assert main(args) == 0 and "nothing to do" in capsys.readouterr().err  # the name is the key
    assert main([*args[:3], "-m", "mine=", *args[7:]]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
def test_the_from_python_example_runs(tmp_path, monkeypatch):
    """The From Python how-to's generate -> evaluate -> leaderboard block, as written but at tiny sizes."""
    page = (Path(__file__).resolve().parents[1] / "docs/how-to/python-api.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) <= 10
    small = {"n_train=400, n_val=100, n_test=100": "n_train=24, n_val=8, n_test=8, workers=1",
             'probes=["linear"]': 'probes=["linear"], epochs=1'}
    for written, tiny in small.items():
        assert block.count(written) == 1, written
        block = block.replace(written, tiny)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(block, scope)
    assert scope["data"] == Path("data/cs") and Dataset(scope["data"]).num_rows("test") == 8
    assert sorted(scope["df"]["backbone"]) == ["oracle:objects", "pixels"] and set(scope["df"]["status"]) == {"ok"}
    assert sorted(scope["board"]["backbone"]) == ["oracle:objects", "pixels"] and len(scope["rows"]) == 2


#: Run `bench` as a user would, then say which heavy modules it imported (a no-op run must import none).
LOADED = ("import json, sys\nfrom bench.cli import main\ncode = main(sys.argv[1:])\n"
          "print(json.dumps([m for m in ('torch', 'transformers') if m in sys.modules]))\nsys.exit(code)")


@pytest.mark.slow
def test_a_run_with_nothing_to_do_imports_no_torch(tiny, tmp_path, capsys):
    """Every row held: `bench evaluate` plans from the registry's metadata and the results' keys and
    stops before any model code (torch, transformers) loads; the same run with a row owed loads it."""
    import os
    import subprocess
    import sys

    results = tmp_path / "results"
    args = ["evaluate", "--dataset", str(tiny), "--epochs", "1", "--results", str(results), "--limit", "8",
            "--model", "pixels", "--model", "oracle:objects", "--model", "random:dinov2-small", "--layers", "0",
            "--tokens", "cls,mean", "--probes", "linear"]
    assert main(args) == 0
    capsys.readouterr()
    files = sorted(results.glob("*.parquet"))
    assert read_results(results).num_rows == 6

    def run(*extra: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        done = subprocess.run([sys.executable, "-c", LOADED, *args, *extra], capture_output=True, text=True, env=env,
                              timeout=300)
        return done, json.loads(done.stdout.splitlines()[-1])

    done, loaded = run()
    assert done.returncode == 0, done.stderr
    assert "skipped 4 row(s)" in done.stderr and "nothing to do" in done.stderr
    assert loaded == []
    assert sorted(results.glob("*.parquet")) == files and read_results(results).num_rows == 6
    done, loaded = run("--probes", "quadratic")  # a row owed: the model code loads to fit it
    assert done.returncode == 0, done.stderr
    assert "torch" in loaded and read_results(results).num_rows == 12


def test_a_run_on_a_warm_cache_builds_no_model(tiny, tmp_path, monkeypatch):
    """`--overwrite` on a warm activation cache: the first run recorded the `random:` preset it built,
    so the second plans and reads its activations from that record and the cache, builds no model
    (no transformers model code, no weight init) and writes the same numbers."""
    import evaluators.backbones.hf as hf
    from test_backbones import TINY

    from evaluators.backbones import PRESETS
    from evaluators.backbones.presets import Preset

    monkeypatch.setitem(PRESETS, "tiny", Preset("none/tiny", "dinov2", 32, {**TINY, "mlp_ratio": 2}))
    monkeypatch.setenv("BINDINGBENCH_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "results"
    args = ["evaluate", "--dataset", str(tiny), "--model", "random:tiny", "--probes", "linear", "--epochs", "1",
            "--results", str(results), "--device", "cpu", "--threads", "1"]
    assert main(args) == 0

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(hf, "build_random", no_build)
    assert main([*args, "--overwrite"]) == 0
    first, second = sorted((pq.read_table(f).to_pylist() for f in results.glob("*.parquet")),
                           key=lambda rows: rows[0]["created_at"])
    varies = {"run_id", "created_at", "command", "wall_time_s"}
    assert [{k: v for k, v in r.items() if k not in varies} for r in second] == \
        [{k: v for k, v in r.items() if k not in varies} for r in first]
    assert first[0]["status"] == "ok" and first[0]["beta_star"] is not None
