"""Zero-shot evaluation on the synthetic set with a tiny CLIP trained here for a few steps, the dataset formats,
checkpoint kinds, and the one-line messages for bad input."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import open_clip
import pytest
import torch
from clip_benchmark.webdataset_builder import convert_dataset, path_to_bytes
from open_clip import zero_shot_metadata
from PIL import Image
from safetensors.torch import load_file, save_file

import models
from data import DataConfig, build_train_data, make_synthetic
from eval import checkpoint, datasets, zeroshot
from eval.datasets import EvalInputError
from models import run_folder
from tests.eval import evalsets

STEPS, PER_CLASS, CLASSES = 25, 3, 24
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    spec = make_synthetic(out, train_samples=STEPS * 32, eval_per_class=PER_CLASS, shard_size=400)
    return spec, out / "eval"


@pytest.fixture(scope="module")
def run_dir(synthetic, tmp_path_factory):
    """RUN/checkpoints/step_00000025/{model.safetensors, meta.json} + latest, as the trainer writes them,
    of tiny-s trained STEPS contrastive steps on the synthetic train shards."""
    torch.manual_seed(0)
    cfg = models.ModelConfig(name="tiny-s")
    model = models.build_clip(cfg)
    train_transform, _ = models.transforms(cfg)
    data = build_train_data(
        DataConfig(train_shards=synthetic[0], batch_size=32, workers=0), train_transform, models.tokenizer(cfg)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for _step, (images, tokens) in zip(range(STEPS), data.loader):
        image_features, text_features, scale = model(images, tokens)
        logits = scale * image_features @ text_features.T
        labels = torch.arange(len(logits))
        loss = (
            torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(logits.T, labels)
        ) / 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    run = tmp_path_factory.mktemp("run")
    folder = run_folder.tmp_folder(run, STEPS)
    (folder / "state").mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    meta = {"step": STEPS, "samples_seen": STEPS * 32, "config": {"model": vars(cfg), "data": {}}}
    (folder / "meta.json").write_text(json.dumps(meta))
    # the rest of a complete checkpoint (resume's files), so the run directory is one the trainer could write
    (folder / "data_state_0.json").write_text("{}")
    torch.save({"last_epoch": STEPS}, folder / "state" / "scheduler.bin")
    run_folder.finish(folder)  # manifest, rename to step_00000025, latest
    return run


def test_cli_on_run_dir_reports_accuracy_size_and_provenance(run_dir, synthetic, tmp_path):
    out = tmp_path / "result.json"
    result = zeroshot.main([str(run_dir), "--dataset", str(synthetic[1]), "--workers", "0", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["num_images"] == CLASSES * PER_CLASS and result["num_classes"] == CLASSES
    assert result["top1"] > 2 / CLASSES, "a few training steps must beat chance on the synthetic set"
    assert result["top1"] <= result["top5"] <= 1 and 0 < result["mean_per_class_recall"] <= 1
    assert result["step"] == STEPS and result["samples_seen"] == STEPS * 32
    assert result["checkpoint"].endswith("step_00000025") and result["model"] == "tiny-s"
    model = checkpoint.load_ours(run_dir, "cpu").model
    assert result["params"] == sum(p.numel() for p in model.parameters())
    assert result["params"] - result["params_without_token_embedding"] == model.token_embedding.weight.numel()
    assert result["gmacs_per_sample"] > 0 and result["image_attention"] == result["text_attention"] == "softmax"
    assert result["skipped"] == 0 and result["num_templates"] == len(
        datasets.read_lines(synthetic[1] / "templates.txt")
    )
    folder_result = zeroshot.main(
        [str(run_dir / "checkpoints" / "step_00000025"), "--dataset", str(synthetic[1]), "--workers", "0"]
    )
    assert folder_result["top1"] == result["top1"]


def test_api_matches_cli_and_restores_training_mode(run_dir, synthetic):
    loaded = checkpoint.load_ours(run_dir, "cpu")
    loaded.model.train()
    result = zeroshot.evaluate(
        loaded.model, dataset=str(synthetic[1]), tokenizer=loaded.tokenizer, transform=loaded.transform, batch_size=7
    )
    assert loaded.model.training
    cli = zeroshot.main([str(run_dir), "--dataset", str(synthetic[1]), "--workers", "0"])
    for key in ("top1", "top5", "mean_per_class_recall", "num_images"):
        assert result[key] == pytest.approx(cli[key], abs=1e-9)


def test_clip_benchmark_webdataset_gives_the_imagefolder_result(run_dir, synthetic, tmp_path):
    loaded = checkpoint.load_ours(run_dir, "cpu")
    folder = datasets.ImageFolderSet(synthetic[1], transform=lambda image: image)
    convert_dataset(
        [(path, label) for path, label in folder.samples],
        "test",
        str(tmp_path),
        max_count=30,
        transform=path_to_bytes,
        verbose=False,
    )
    shutil.copy(synthetic[1] / "classnames.txt", tmp_path / "classnames.txt")
    shutil.copy(synthetic[1] / "templates.txt", tmp_path / "zeroshot_classification_templates.txt")
    kwargs = dict(tokenizer=loaded.tokenizer, transform=loaded.transform, batch_size=16, workers=2)
    from_wds = zeroshot.evaluate(loaded.model, dataset=str(tmp_path), **kwargs)
    from_folder = zeroshot.evaluate(loaded.model, dataset=str(synthetic[1]), **kwargs)
    assert from_wds["format"] == "webdataset" and len(list((tmp_path / "test").glob("*.tar"))) == 3
    for key in ("top1", "top5", "mean_per_class_recall", "num_images", "num_templates"):
        assert from_wds[key] == pytest.approx(from_folder[key], abs=1e-9)


def test_unreadable_images_are_skipped_and_counted(run_dir, synthetic, tmp_path):
    root = shutil.copytree(synthetic[1], tmp_path / "eval")
    first, second = sorted((root / "blue_circle").iterdir())[:2]
    first.write_bytes(b"not an image")
    second.write_bytes(second.read_bytes()[:40])
    loaded = checkpoint.load_ours(run_dir, "cpu")
    result = zeroshot.evaluate(
        loaded.model, dataset=str(root), tokenizer=loaded.tokenizer, transform=loaded.transform, batch_size=8
    )
    assert result["skipped"] == 2 and result["num_images"] == CLASSES * PER_CLASS - 2
    assert sorted(result["skipped_examples"]) == sorted([str(first), str(second)])


def bad_dataset(kind: str, root):
    """A small ImageFolder tree broken in one way; returns (dataset path, classnames spec, words the error needs)."""
    wnids = ["n01440764", "n01443537"]
    for d in wnids:
        (root / d).mkdir(parents=True)
        (root / d / "0.png").write_bytes(b"")
    if kind == "empty class folder":
        (root / "n01484850").mkdir()
        (root / "names.txt").write_text("a\nb\nc\n")
        return root, str(root / "names.txt"), ["n01484850", "no images"]
    if kind == "names count":
        (root / "names.txt").write_text("tench\n")
        return root, str(root / "names.txt"), ["1 class names", "2 classes"]
    if kind == "wnid missing":
        (root / "names.txt").write_text("n01440764\ttench\nn09999999\tother\n")
        return root, str(root / "names.txt"), ["n01443537", "not in names file"]
    return root, "imagenet1k", ["1000 class names", "2 classes"]


@pytest.mark.parametrize("kind", ["empty class folder", "names count", "wnid missing", "imagenet1k on 2 classes"])
def test_bad_dataset_gives_one_line_error(kind, tmp_path, capsys):
    root, names, words = bad_dataset(kind, tmp_path / "data")
    with pytest.raises(EvalInputError) as error:
        datasets.open_classification(root, transform=lambda image: image, classnames=names)
    assert "\n" not in str(error.value) and all(w in str(error.value) for w in words)
    with pytest.raises(SystemExit) as exit_:
        zeroshot.main(["--open-clip-model", "tiny-s", "--dataset", str(root), "--classnames", names, "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error: ") and "\n" not in err


def test_checkpoint_of_another_model_size_gives_one_line_error(run_dir, synthetic, tmp_path, capsys):
    folder = shutil.copytree(run_dir / "checkpoints" / "step_00000025", tmp_path / "step")
    meta = json.loads((folder / "meta.json").read_text())
    meta["config"]["model"]["name"] = "tiny-m"
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / run_folder.MANIFEST).unlink()  # a hand-edited copy: checked by loading, not against the old checksums
    with pytest.raises(EvalInputError, match="another model size than tiny-m"):
        checkpoint.load_ours(folder, "cpu")
    with pytest.raises(SystemExit):
        zeroshot.main(
            [
                "--open-clip-model",
                "tiny-m",
                "--checkpoint",
                str(folder / "model.safetensors"),
                "--dataset",
                str(synthetic[1]),
                "--device",
                "cpu",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: checkpoint") and "another model size" in err and "\n" not in err


def test_imagenet_wnid_folders_take_open_clip_names_in_sorted_order(tmp_path):
    wnids = sorted(f"n{i:08d}" for i in range(1000))
    names, labels, source = datasets.resolve_classnames(None, tmp_path, wnids)
    assert names == list(zero_shot_metadata.IMAGENET_CLASSNAMES) and source == "imagenet1k"
    assert labels == {w: i for i, w in enumerate(wnids)}
    templates, source = datasets.resolve_templates("openai", tmp_path)
    assert len(templates) == 80 and datasets.fill_template(templates[0], "tench") == "a bad photo of a tench."


def test_imagenet21k_style_names_file_defines_all_classes(run_dir, synthetic, tmp_path):
    """A wnid-keyed names file (here 30 wnids) is the classifier even when only some classes have images."""
    root = tmp_path / "val"
    source_dirs = datasets.class_folders(synthetic[1])[:3]
    file_lines = [f"n{i:08d}\t{name}" for i, name in enumerate(datasets.read_lines(synthetic[1] / "classnames.txt"))]
    file_lines += [f"n{i:08d}\tthing {i}" for i in range(CLASSES, 30)]
    for i, d in enumerate(source_dirs):
        shutil.copytree(synthetic[1] / d, root / f"n{i:08d}")
    (tmp_path / "names.txt").write_text("\n".join(file_lines) + "\n")
    loaded = checkpoint.load_ours(run_dir, "cpu")
    result = zeroshot.evaluate(
        loaded.model,
        dataset=str(root),
        tokenizer=loaded.tokenizer,
        transform=loaded.transform,
        classnames=str(tmp_path / "names.txt"),
        templates="simple",
        class_chunk=7,
        texts_per_batch=50,
    )
    assert result["num_classes"] == 30 and result["num_images"] == 3 * PER_CLASS
    assert result["num_templates"] == len(zero_shot_metadata.SIMPLE_IMAGENET_TEMPLATES)
    evalset = datasets.open_classification(root, loaded.transform, str(tmp_path / "names.txt"))
    assert sorted({label for _, label in evalset.dataset.samples}) == [0, 1, 2]


def test_run_directory_written_by_the_trainer(synthetic, tmp_path):
    """The checkpoint contract end to end: `train.main` writes RUN/checkpoints/..., eval rebuilds the model."""
    from tests.train.common import run as train_in_process  # main() here, from a fresh accelerate state

    run = tmp_path / "run"
    assert (
        train_in_process(
            REPO / "configs" / "tiny.yaml",
            f"data.train_shards={synthetic[0]}",
            f"train.run_dir={run}",
            "train.max_steps=3",
            "train.save_every=3",
            "data.batch_size=16",
            "data.workers=0",
            "eval.dataset=null",
            "model.image_attention=linear_elu",
        )
        == 0
    )
    result = zeroshot.main([str(run), "--dataset", str(synthetic[1]), "--workers", "0", "--device", "cpu"])
    meta = json.loads((run / "checkpoints" / "step_00000003" / "meta.json").read_text())
    assert result["checkpoint"] == str(run / "checkpoints" / "step_00000003")
    assert result["step"] == 3 and result["samples_seen"] == meta["samples_seen"] > 0
    assert result["image_attention"] == "linear_elu" and result["text_attention"] == "softmax"
    assert result["num_images"] == CLASSES * PER_CLASS


def test_an_open_clip_checkpoint_of_another_size_needs_the_flag(tmp_path):
    """tiny-s weights built at 64 px and a 48-token context: refused in one line without --image-size /
    --context-length, evaluated at their own size with them."""
    big = open_clip.create_model("tiny-s", force_image_size=64, force_context_length=48)
    path = tmp_path / "tiny-s-64.safetensors"
    save_file({k: v.contiguous() for k, v in big.state_dict().items()}, str(path))
    with pytest.raises(EvalInputError, match=r"built for another size: its visual.positional_embedding is \(65, 64\)"):
        checkpoint.load_open_clip("tiny-s", str(path), "cpu")
    with pytest.raises(EvalInputError, match=r"its positional_embedding is \(48, 64\).*pass --context-length"):
        checkpoint.load_open_clip("tiny-s", str(path), "cpu", image_size=64)
    loaded = checkpoint.load_open_clip("tiny-s", str(path), "cpu", image_size=64, context_length=48)
    assert loaded.model.visual.image_size == (64, 64) and loaded.tokenizer(["a"]).shape == (1, 48)


def test_open_clip_checkpoint_loads_without_the_random_init_warning(synthetic, tmp_path, caplog):
    """open_clip says "No pretrained weights loaded ... initialized randomly" when it builds the model; with
    --checkpoint the weights follow, so that line must not appear, and the weights must be the file's."""
    weights_file = evalsets.tiny_checkpoint(tmp_path / "tiny-s.safetensors", seed=3)
    with caplog.at_level(logging.WARNING):
        loaded = checkpoint.load_open_clip("tiny-s", str(weights_file), "cpu")
    assert "initialized randomly" not in caplog.text
    own = loaded.model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in load_file(str(weights_file)).items())
    with caplog.at_level(logging.WARNING):
        checkpoint.load_open_clip("tiny-s", None, "cpu")
    assert "initialized randomly" in caplog.text, "without weights the warning is true and must stay"
    command = [sys.executable, "-m", "eval.zeroshot", "--open-clip-model", "tiny-s", "--checkpoint", str(weights_file)]
    command += ["--dataset", str(synthetic[1]), "--workers", "0", "--device", "cpu"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "No pretrained weights" not in done.stderr and "initialized randomly" not in done.stderr
    assert json.loads(done.stdout)["checkpoint"] == str(weights_file)


def test_a_checkpoint_is_evaluated_at_another_size(run_dir, synthetic, tmp_path):
    """--image-size / --context-length: the position tables are resampled on load, the transform and tokenizer
    follow; a size the patch does not divide is one line."""
    loaded = checkpoint.load_ours(run_dir, "cpu", image_size=64, context_length=48)
    assert loaded.model.visual.image_size == (64, 64) and loaded.tokenizer(["a"]).shape == (1, 48)
    assert loaded.transform(Image.new("RGB", (50, 40))).shape == (3, 64, 64)
    own = checkpoint.load_ours(run_dir, "cpu")
    # the class token's position is kept; the text positions up to text_pos_keep (20) are the checkpoint's
    torch.testing.assert_close(loaded.model.visual.positional_embedding[0], own.model.visual.positional_embedding[0])
    torch.testing.assert_close(loaded.model.positional_embedding[:20], own.model.positional_embedding[:20])
    args = [str(run_dir), "--dataset", str(synthetic[1]), "--workers", "0", "--image-size", "64"]
    result = zeroshot.main([*args, "--context-length", "48", "--out", str(tmp_path / "r.json")])
    assert result["num_images"] == CLASSES * PER_CLASS and 0 <= result["top1"] <= 1
    with pytest.raises(EvalInputError, match=r"--image-size=70 is not a multiple of tiny-s's patch size 8"):
        checkpoint.load_ours(run_dir, "cpu", image_size=70)


@pytest.mark.parametrize(
    "targets, line",
    [
        ([-1, 3], "a sample without a .cls label (label -1) among 24 classes; give every evaluation sample its class"),
        ([2, 30, 5], "label 30 out of range for 24 class names; give the class names file of this dataset"),
    ],
)
def test_a_bad_label_is_named(targets, line):
    with pytest.raises(EvalInputError) as e:
        zeroshot.check_labels(torch.tensor(targets), 24)
    assert str(e.value).startswith(line)
    zeroshot.check_labels(torch.tensor([0, 23]), 24)
