"""Image-text retrieval: recall@k on a hand-built example, CSV and clip_benchmark webdataset readers, the CLI."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from clip_benchmark.webdataset_builder import convert_retrieval_dataset, path_to_bytes
from PIL import Image

import models
from eval import retrieval
from eval.datasets import EvalInputError


def test_recall_at_k_on_a_hand_built_example():
    """Images at 0, 90 and 180 degrees; captions 0 and 1 belong to image 0, caption 2 to image 1, caption 3 to
    image 2. Ranks worked out by hand: text->image ranks of the own image are 1, 2, 1, 3; image->text, the
    first own caption is at rank 2 (image 0), 1 (image 1), 4 (image 2)."""
    images = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]), dim=-1)
    texts = F.normalize(torch.tensor([[1.0, 0.1], [0.1, 1.0], [0.0, 1.0], [1.0, 0.0]]), dim=-1)
    owner = torch.tensor([0, 0, 1, 2])
    for chunk in (1, 2, 100):
        r = retrieval.recall_at_k(images, texts, owner, ks=(1, 2, 3), chunk=chunk)
        assert [r[f"text_to_image_R@{k}"] for k in (1, 2, 3)] == [2 / 4, 3 / 4, 4 / 4]
        assert [r[f"image_to_text_R@{k}"] for k in (1, 2, 3)] == pytest.approx([1 / 3, 2 / 3, 2 / 3])
        assert r["mean_recall"] == pytest.approx((2 / 4 + 3 / 4 + 1 + 1 / 3 + 2 / 3 + 2 / 3) / 6)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Nine noisy single-colour images (one of them not an image) with two captions each, as a CSV and as
    clip_benchmark's retrieval webdataset (written by its own converter)."""
    root, rng = tmp_path_factory.mktemp("pairs"), np.random.default_rng(0)
    items = []
    for i in range(9):
        colour = rng.integers(0, 256, 3)
        pixels = np.clip(colour + rng.normal(0, 20, (24, 24, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.png")
        items.append((str(root / f"{i}.png"), [f"a photo number {i}", f"colour {colour.tolist()}"]))
    (root / "3.png").write_bytes(b"broken")
    rows = ["filepath\ttitle"] + [
        f"{i}.png\t{caption}" for i, (_, captions) in enumerate(items) for caption in captions
    ]
    (root / "pairs.tsv").write_text("\n".join(rows) + "\n")
    convert_retrieval_dataset(items, "test", str(root / "wds"), transform=path_to_bytes, max_count=4, verbose=False)
    return root


def test_csv_and_webdataset_agree_and_skip_unreadable_images(pairs):
    torch.manual_seed(0)
    model = models.create_model("tiny-s")
    _, transform = models.transforms(model)
    kwargs = dict(tokenizer=models.tokenizer(model), transform=transform, batch_size=4, ks=(1, 5, 10))
    from_csv = retrieval.evaluate(model, dataset=str(pairs / "pairs.tsv"), **kwargs)
    from_wds = retrieval.evaluate(model, dataset=str(pairs / "wds"), workers=2, **kwargs)
    for result in (from_csv, from_wds):
        assert result["num_images"] == 8 and result["num_captions"] == 16 and result["skipped"] == 1
        assert result["image_to_text_R@1"] <= result["image_to_text_R@5"] <= result["image_to_text_R@10"]
    for key in ("text_to_image_R@1", "text_to_image_R@5", "image_to_text_R@1", "image_to_text_R@5", "mean_recall"):
        assert from_csv[key] == pytest.approx(from_wds[key], abs=1e-6)
    assert from_csv["skipped_examples"] == [str(pairs / "3.png")]


def test_captions_cut_to_the_context_are_counted_and_logged(pairs, caplog):
    """At a 6-token context the 8 readable images' "colour [r, g, b]" captions are cut, "a photo number i" are not."""
    torch.manual_seed(0)
    model = models.create_model("tiny-s", context_length=6)
    _, transform = models.transforms(model)
    with caplog.at_level("WARNING", logger="eval.retrieval"):
        result = retrieval.evaluate(
            model, dataset=str(pairs / "pairs.tsv"), tokenizer=models.tokenizer(model), transform=transform
        )
    assert result["num_captions"] == 16 and result["captions_truncated"] == 8
    assert "8 of 16 captions were longer than the context (6 tokens)" in caplog.text


def evaluate_logged(dataset, caplog, logger: str) -> dict:
    """Retrieval of a fresh tiny-s model on `dataset`, with `logger`'s warnings captured."""
    torch.manual_seed(0)
    model = models.create_model("tiny-s")
    _, transform = models.transforms(model)
    with caplog.at_level("WARNING", logger=logger):
        return retrieval.evaluate(model, dataset=str(dataset), tokenizer=models.tokenizer(model), transform=transform)


def test_rows_with_an_empty_caption_are_skipped_counted_and_logged(pairs, tmp_path, caplog):
    rows = (pairs / "pairs.tsv").read_text().splitlines()
    rows[1] = rows[1].split("\t")[0] + "\t  "  # image 0's first caption: blank
    (pairs / "blank.tsv").write_text("\n".join(rows) + "\n")
    result = evaluate_logged(pairs / "blank.tsv", caplog, "eval.datasets")
    assert result["captions_empty"] == 1 and result["num_captions"] == 15 and result["num_images"] == 8
    assert "blank.tsv: rows with an empty caption skipped: 1 (the first is row 2)" in caplog.text


def test_cli_writes_result_json(pairs, tmp_path):
    out = tmp_path / "retrieval.json"
    result = retrieval.main(
        [
            "--open-clip-model",
            "tiny-s",
            "--dataset",
            str(pairs / "pairs.tsv"),
            "--workers",
            "0",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == result
    expected = {f"{d}_R@{k}" for d in ("text_to_image", "image_to_text") for k in (1, 5, 10)}
    assert expected | {"num_images", "num_captions", "skipped", "params", "gmacs_per_sample", "model"} <= set(result)
    assert result["model"] == "tiny-s" and result["image_attention"] == "softmax"
    # at twice the resolution (position table resampled on load): 4x the image tokens, more MACs per sample
    argv = ["--open-clip-model", "tiny-s", "--dataset", str(pairs / "pairs.tsv"), "--workers", "0", "--device", "cpu"]
    larger = retrieval.main([*argv, "--image-size", "64", "--context-length", "48"])
    assert larger["num_images"] == result["num_images"] and larger["gmacs_per_sample"] > result["gmacs_per_sample"]


def test_csv_without_the_caption_column_gives_one_line_error(pairs, capsys):
    with pytest.raises(EvalInputError, match="no column 'caption'"):
        retrieval.evaluate(
            models.create_model("tiny-s"),
            dataset=str(pairs / "pairs.tsv"),
            tokenizer=None,
            transform=None,
            csv_caption_key="caption",
        )
    with pytest.raises(SystemExit):
        retrieval.main(
            [
                "--open-clip-model",
                "tiny-s",
                "--dataset",
                str(pairs / "pairs.tsv"),
                "--csv-caption-key",
                "caption",
                "--device",
                "cpu",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "--csv-caption-key" in err and "\n" not in err


def test_blank_caption_lines_of_a_webdataset_are_dropped_counted_and_logged(pairs, tmp_path, caplog):
    """clip_benchmark's converter with a blank line between image 0's two captions (dropped and counted) and an image
    whose `txt` is only blank lines (skipped as unreadable, as an image without captions, its lines with it)."""
    items = [(str(pairs / f"{i}.png"), [f"a photo number {i}", f"caption {i}"]) for i in (0, 1, 2, 4)]
    items[0] = (items[0][0], ["a photo number 0", "  ", "caption 0"])
    items.append((str(pairs / "5.png"), ["", " "]))
    convert_retrieval_dataset(items, "test", str(tmp_path / "wds"), transform=path_to_bytes, max_count=4, verbose=False)
    result = evaluate_logged(tmp_path / "wds", caplog, "eval.retrieval")
    assert result["captions_empty"] == 1 and result["num_captions"] == 8 and result["num_images"] == 4
    assert result["skipped"] == 1 and "retrieval: 1 empty captions (blank lines) dropped" in caplog.text
