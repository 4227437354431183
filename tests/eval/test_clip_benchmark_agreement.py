"""Our zero-shot and retrieval numbers equal clip_benchmark's (PyPI clip-benchmark 1.6.2) on the same model and data.

How it is checked: a tiny open_clip config ("eval-tiny", 32 px, 2+2 layers) is registered with
open_clip.add_model_config from a tmp dir, trained for a few steps on images of ten distinct hues (plus pixel
noise) so its accuracy is far from both chance and 100%. The same model, preprocess, tokenizer, class names and
templates go to `clip_benchmark.metrics.zeroshot_classification.evaluate` (fed by torchvision's ImageFolder over
the same folder, amp=False since both run fp32 on CPU) and to our `eval.zeroshot.evaluate`; top-1, top-5 and mean
per-class recall must agree within 0.1 points (0.001 as fractions), and no image may score two classes equally
(a tie would make top-1 depend on tie-breaking). clip_benchmark 1.6.2's `accuracy` calls float() on a 1-element
array, which NumPy 2.4 refuses; the test swaps in the same formula ending in `.item()` (`reference_accuracy`),
everything else (classifier, image scoring, balanced accuracy) is clip_benchmark's own code. Retrieval:
clip_benchmark's `zeroshot_retrieval.evaluate` against our `eval.retrieval.evaluate` on a CSV of the same images
with two captions each.
"""

import colorsys
import json

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
import torchvision
from clip_benchmark.metrics import zeroshot_classification, zeroshot_retrieval
from PIL import Image

from eval import retrieval, zeroshot

COLOURS = ["red", "orange", "yellow", "lime", "green", "teal", "cyan", "blue", "purple", "pink"]
TEMPLATES = ["a photo of {c}.", "a {c} picture.", "something {c}."]
TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}


def colour_image(hue_index: int, rng: np.random.Generator, size: int = 40) -> Image.Image:
    """A noisy image of one of the ten hues; noise keeps the images of a class distinct."""
    rgb = np.array(colorsys.hsv_to_rgb(hue_index / len(COLOURS), 0.8, 0.9)) * 255
    return Image.fromarray(np.clip(rgb + rng.normal(0, 45, (size, size, 3)), 0, 255).astype(np.uint8))


def write_colour_folder(root, per_class: int = 6, seed: int = 1):
    """ImageFolder tree root/c0..c9/*.png with classnames.txt and templates.txt inside."""
    rng = np.random.default_rng(seed)
    for c in range(len(COLOURS)):
        (root / f"c{c}").mkdir(parents=True)
        for j in range(per_class):
            colour_image(c, rng).save(root / f"c{c}" / f"{j}.png")
    (root / "classnames.txt").write_text("\n".join(COLOURS) + "\n")
    (root / "templates.txt").write_text("\n".join(TEMPLATES) + "\n")
    return root


def reference_accuracy(output, target, topk=(1,)):
    """clip_benchmark's top-k accuracy with `.item()` in place of float(1-element array) (NumPy 2.4)."""
    pred = output.topk(max(topk), 1, True, True)[1].t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    return [correct[:k].reshape(-1).float().sum().item() / len(target) for k in topk]


@pytest.fixture(scope="module")
def colour_model(tmp_path_factory):
    """(model, preprocess, tokenizer) of the tiny open_clip config after 14 contrastive steps on hue images."""
    cfg_dir = tmp_path_factory.mktemp("open_clip_cfg")
    (cfg_dir / "eval-tiny.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(cfg_dir)
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms("eval-tiny")
    tokenizer = open_clip.get_tokenizer("eval-tiny")
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loss_fn, rng = open_clip.ClipLoss(), np.random.default_rng(0)
    for _ in range(14):
        classes = rng.integers(0, len(COLOURS), 32)
        images = torch.stack([preprocess(colour_image(c, rng)) for c in classes])
        loss = loss_fn(*model(images, tokenizer([f"a photo of {COLOURS[c]}." for c in classes])))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), preprocess, tokenizer


def test_zeroshot_matches_clip_benchmark(colour_model, tmp_path, monkeypatch):
    monkeypatch.setattr(zeroshot_classification, "accuracy", reference_accuracy)
    model, preprocess, tokenizer = colour_model
    root = write_colour_folder(tmp_path / "colours")
    ours = zeroshot.evaluate(
        model,
        dataset=str(root),
        tokenizer=tokenizer,
        transform=preprocess,
        batch_size=16,
        device="cpu",
        class_chunk=3,
        texts_per_batch=7,
    )
    folder = torchvision.datasets.ImageFolder(str(root), transform=preprocess)
    loader = torch.utils.data.DataLoader(folder, batch_size=16)
    ref = zeroshot_classification.evaluate(model, loader, tokenizer, COLOURS, TEMPLATES, "cpu", amp=False)

    print(
        f"\nzero-shot ours {ours['top1']:.4f}/{ours['top5']:.4f}/{ours['mean_per_class_recall']:.4f} "
        f"clip_benchmark {ref['acc1']:.4f}/{ref['acc5']:.4f}/{ref['mean_per_class_recall']:.4f} (top1/top5/recall)"
    )
    assert ours["num_images"] == len(folder) == 60
    assert 0.2 < ours["top1"] < 0.95, "accuracy should be far from chance (0.1) and from perfect"
    assert ours["top1"] == pytest.approx(ref["acc1"], abs=1e-3)
    assert ours["top5"] == pytest.approx(ref["acc5"], abs=1e-3)
    assert ours["mean_per_class_recall"] == pytest.approx(ref["mean_per_class_recall"], abs=1e-3)
    classifier = zeroshot_classification.zero_shot_classifier(model, tokenizer, COLOURS, TEMPLATES, "cpu", amp=False)
    logits, _ = zeroshot_classification.run_classification(model, classifier, loader, "cpu", amp=False)
    top2 = logits.topk(2, dim=1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-4, "a tie between two classes would make top-1 ambiguous"


def test_retrieval_matches_clip_benchmark(colour_model, tmp_path):
    model, preprocess, tokenizer = colour_model
    rng = np.random.default_rng(2)
    rows, pairs = ["filepath,title"], []
    for i in range(24):
        c = i % len(COLOURS)
        colour_image(c, rng).save(tmp_path / f"{i}.png")
        captions = [f"a photo of {COLOURS[c]}.", f"something {COLOURS[c]} number {i}."]
        rows += [f"{i}.png,{caption}" for caption in captions]
        pairs.append((preprocess(Image.open(tmp_path / f"{i}.png").convert("RGB")), captions))
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")

    ours = retrieval.evaluate(
        model,
        dataset=str(tmp_path / "pairs.csv"),
        tokenizer=tokenizer,
        transform=preprocess,
        batch_size=5,
        device="cpu",
    )
    loader = torch.utils.data.DataLoader(
        pairs, batch_size=5, collate_fn=lambda b: (torch.stack([x for x, _ in b]), [t for _, t in b])
    )
    ref = zeroshot_retrieval.evaluate(model, loader, tokenizer, "cpu", amp=False, recall_k_list=[1, 5, 10])
    print(
        "\nretrieval ours",
        {k: round(v, 4) for k, v in ours.items() if "_R@" in k},
        "clip_benchmark",
        {k: round(v, 4) for k, v in ref.items()},
    )
    assert ours["num_images"] == 24 and ours["num_captions"] == 48
    for k in (1, 5, 10):
        assert ours[f"text_to_image_R@{k}"] == pytest.approx(ref[f"image_retrieval_recall@{k}"], abs=1e-3)
        assert ours[f"image_to_text_R@{k}"] == pytest.approx(ref[f"text_retrieval_recall@{k}"], abs=1e-3)
    assert 0 < ours["text_to_image_R@1"] < ours["text_to_image_R@10"] <= 1


def test_classifier_chunking_does_not_change_scores(colour_model):
    model, _, tokenizer = colour_model
    whole = zeroshot.build_classifier(model, tokenizer, COLOURS, TEMPLATES, "cpu", texts_per_batch=10_000)
    chunked = zeroshot.build_classifier(model, tokenizer, COLOURS, TEMPLATES, "cpu", texts_per_batch=4)
    assert whole.shape == (32, len(COLOURS))
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    features = F.normalize(torch.randn(7, 32), dim=-1)
    full_scores, full_ids = (features @ whole).topk(5, dim=1)
    scores, ids = zeroshot.topk_chunked(features, whole, k=5, class_chunk=3)
    assert torch.equal(ids, full_ids)
    torch.testing.assert_close(scores, full_scores)
