"""Long captions of the synthetic set: token lengths, every shape described, differences past token 77, the
retrieval set read by eval.retrieval, and the default output left as it was."""

import hashlib
import tarfile
from pathlib import Path

import numpy as np
import open_clip
import pytest
import webdataset as wds

from data import synthetic_long
from data.synthetic import main, make_synthetic
from eval import datasets
from tests.data.shardmaker import to_tensor

# sha256 of the caption and JSON members of make_synthetic(..., train_samples=30, val_samples=10, eval_per_class=1,
# image_size=16, shard_size=20), written by the code before long captions existed; JPEG bytes are left out as
# they depend on the libjpeg build, but every random draw of a sample shows in its caption and JSON
DEFAULT_DIGEST = "d352a7258812c826fee49705350d135d19cca05880ba41ed0373ae5a756193f8"


def tokenize(texts: list[str]):
    return open_clip.get_tokenizer("ViT-B-32")(texts, context_length=400)


@pytest.fixture(scope="module")
def long_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("long")
    argv = [str(out), "--captions", "long", "--train-samples", "60", "--val-samples", "0", "--shard-size", "30"]
    main([*argv, "--eval-per-class", "1", "--image-size", "16"])
    return out


def test_default_output_is_unchanged_and_never_reaches_the_long_code(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the default captions reached data.synthetic_long")

    monkeypatch.setattr(synthetic_long, "write_long_shard", refuse)
    monkeypatch.setattr(synthetic_long, "write_retrieval", refuse)
    make_synthetic(tmp_path, train_samples=30, val_samples=10, eval_per_class=1, image_size=16, shard_size=20)
    digest = hashlib.sha256()
    for path in sorted(tmp_path.rglob("*.tar")):
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                if not member.name.endswith(".jpg"):
                    digest.update(member.name.encode())
                    digest.update(tar.extractfile(member).read())
    assert digest.hexdigest() == DEFAULT_DIGEST
    assert not (tmp_path / "retrieval").exists()


def test_long_captions_are_60_to_300_tokens_and_describe_every_shape(long_set):
    samples = list(wds.WebDataset(str(long_set / "train" / "{00000..00001}.tar"), shardshuffle=False).decode("pil"))
    assert len(samples) == 60 and all(s["jpg"].size == (16, 16) for s in samples)
    lengths = (tokenize([s["txt"] for s in samples]) != 0).sum(dim=1)
    assert int(lengths.min()) >= 60 and int(lengths.max()) <= 300
    assert int(lengths.max()) > 77, "no caption reaches past a 77-token context"
    for sample in samples:
        shapes, sentences = sample["json"]["shapes"], sample["txt"].split(". ")
        assert 3 <= len(shapes) <= 6 and len(sentences) == len(shapes) + 1
        for shape, text in zip(shapes, sentences[1:]):
            assert shape["colour"] in text and shape["shape"] in text and shape["size"] in text


def test_scenes_that_differ_in_the_last_shape_differ_only_after_token_77():
    rng = np.random.default_rng(0)
    for _ in range(20):
        scene = synthetic_long.random_scene(rng, 6)
        u = rng.random(synthetic_long.caption_draws(6))
        last = scene["shapes"][-1]
        other = last | {"colour": "red" if last["colour"] != "red" else "blue"}
        changed = scene | {"shapes": [*scene["shapes"][:-1], other]}
        a, b = tokenize([" ".join(synthetic_long.describe(s, u)) for s in (scene, changed)])
        assert bool((a[:77] == b[:77]).all()) and not bool((a == b).all())


def test_retrieval_set_loads_through_eval_retrieval_and_groups_differ_only_late(long_set):
    pairs = datasets.open_retrieval(long_set / "retrieval", transform=to_tensor)
    loader = datasets.make_loader(pairs, batch_size=8)
    batches = list(loader)
    assert sum(len(images) for images, _, _ in batches) == 24 and batches[0][0].shape[1:] == (3, 16, 16)
    captions = [group for _, batch, _ in batches for group in batch]
    assert len(captions) == 24 and all(len(group) == 1 for group in captions)
    tokens = tokenize([group[0] for group in captions])
    for first in range(0, 24, synthetic_long.GROUP):
        group = tokens[first : first + synthetic_long.GROUP]
        assert bool((group[:, :77] == group[0, :77]).all())
        assert len({tuple(t.tolist()) for t in group}) == synthetic_long.GROUP


def test_unknown_captions_value_is_one_error_line_naming_the_valid_ones(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--captions", "medium"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("python -m data.synthetic: error:") and "'short'" in last and "'long'" in last
    with pytest.raises(ValueError, match="short, long"):
        make_synthetic(Path(tmp_path), captions="medium")
