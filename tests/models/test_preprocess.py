"""models/preprocess.py: the split image transform and the caption cache give exactly what open_clip's give."""

import pickle

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from models.preprocess import CachedTokenizer, Normalise, ResizedCrop, split_normalise


def images(n: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (40 + i, 37 + 2 * i, 3), dtype=np.uint8)) for i in range(n)]


@pytest.mark.parametrize("is_train", [True, False])
def test_split_transform_is_bitwise_open_clips(is_train):
    whole = open_clip.image_transform(32, is_train=is_train)
    per_sample, per_batch = split_normalise(whole)
    assert isinstance(per_batch, Normalise)
    expected, got = [], []
    for k, image in enumerate(images(6)):
        torch.manual_seed(k)  # the same random crop for both
        expected.append(whole(image))
        torch.manual_seed(k)
        got.append(per_sample(image))
    assert all(g.dtype == torch.uint8 for g in got)
    assert torch.equal(per_batch(torch.stack(got)), torch.stack(expected))


@pytest.mark.parametrize("scale", [(0.9, 1.0), (0.08, 1.0)])
def test_resized_crop_is_torchvisions_crop(scale):
    """The same pixels and the same generator state afterwards, over seeds and shapes: square, wide and tall enough
    that all ten tries miss (torchvision's central-crop fallback), and crops of the output size (no resize)."""
    crop = T.RandomResizedCrop(24, scale=scale, interpolation=T.InterpolationMode.BICUBIC)
    fast = ResizedCrop(crop)
    shapes = [(32, 32), (24, 24), (40, 29), (29, 40), (300, 20), (20, 300), (5, 7)]
    rng = np.random.default_rng(1)
    for seed in range(150):
        h, w = shapes[seed % len(shapes)]
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        torch.manual_seed(seed)
        expected, expected_state = np.asarray(crop(image)), torch.get_rng_state()
        torch.manual_seed(seed)
        got = np.asarray(fast(image))
        assert np.array_equal(got, expected), (seed, h, w)
        assert torch.equal(torch.get_rng_state(), expected_state), (seed, h, w)
    tensor = torch.zeros(3, 30, 30)
    assert fast(tensor).shape == (3, 24, 24)  # tensors: torchvision's own transform
    assert "RandomResizedCrop" in repr(fast) and pickle.loads(pickle.dumps(fast)).height == 24


def test_other_transforms_are_left_whole():
    transform = open_clip.image_transform(32, is_train=False)
    transform.transforms = transform.transforms[:-1]  # no Normalize at the end
    assert split_normalise(transform) == (transform, None)
    with pytest.raises(TypeError, match="uint8"):
        Normalise((0.5,) * 3, (0.5,) * 3)(torch.zeros(1, 3, 2, 2))


def test_cached_tokenizer_matches_and_is_bounded():
    tokenizer = open_clip.get_tokenizer("ViT-B-32", context_length=16)
    cached = CachedTokenizer(tokenizer, size=3)
    captions = ["a red circle", "a blue square", "a red circle", "two green triangles", "a small star", "a red circle"]
    for start in range(0, len(captions), 2):
        batch = captions[start : start + 3]
        assert torch.equal(cached(batch), tokenizer(batch))
    assert len(cached.rows) <= 3
    assert cached.context_length == 16
    again = pickle.loads(pickle.dumps(cached))  # data workers may receive it pickled
    assert torch.equal(again(captions), tokenizer(captions))


def test_cached_tokenizer_counts_captions_cut_to_the_context():
    tokenizer = open_clip.get_tokenizer("ViT-B-32", context_length=8)
    cached = CachedTokenizer(tokenizer)
    fits = "a b c d e f"  # 6 tokens + start + end = 8: a full row, nothing lost
    long = "a b c d e f g h i j"
    short = "a red circle"
    assert len(tokenizer.encode(fits)) == 6
    rows = cached([fits, long, short, long])
    assert torch.equal(rows, tokenizer([fits, long, short, long]))
    assert cached.truncated([fits, long, short, long]) == 2 and cached.truncated([fits, short]) == 0


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA"])
def test_to_uint8_is_pil_to_tensor(mode):
    from torchvision.transforms.functional import pil_to_tensor

    from models.preprocess import ToUint8

    for image in images(3, seed=1):
        image = image.convert(mode)
        got, expected = ToUint8()(image), pil_to_tensor(image)
        assert got.dtype == torch.uint8 and got.shape == expected.shape and torch.equal(got, expected)


def test_shared_rows_give_the_same_rows_and_counts_without_tokenizing_again(monkeypatch):
    import models.preprocess

    monkeypatch.setattr(models.preprocess, "SHARED_ROWS", {})
    tokenizer = open_clip.get_tokenizer("ViT-B-32", context_length=8)
    captions = ["a b c d e f g h i j", "a red circle", "a blue square", "a red circle"]
    assert models.preprocess.share_rows(("ViT-B-32", 8), tokenizer, captions[:3]) == 3
    calls = []
    assert models.preprocess.share_rows(("ViT-B-32", 8), lambda texts: calls.append(texts), captions) == 3
    assert calls == []  # a second study phase tokenizes none of them again

    def counted(texts):
        calls.append(list(texts))
        return tokenizer(texts)

    shared = CachedTokenizer(counted, key=("ViT-B-32", 8))
    mixed = [*captions, "two green triangles"]
    assert torch.equal(shared(mixed), tokenizer(mixed))
    assert calls == [["two green triangles"]]  # only the caption no study tokenized before
    fresh = CachedTokenizer(tokenizer)
    fresh(mixed)
    assert shared.truncated(mixed) == fresh.truncated(mixed) == 1  # the long caption, cut to 8 tokens
    other = CachedTokenizer(counted, key=("ViT-B-32", 16))  # another key: tokenized here
    other(captions[:1])
    assert calls[-1] == captions[:1]
    spawned = pickle.loads(pickle.dumps(CachedTokenizer(tokenizer, key=("ViT-B-32", 8))))
    assert spawned.shared == {} and torch.equal(spawned(mixed), tokenizer(mixed))  # a spawned worker tokenizes
