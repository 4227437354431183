"""The CLIP model on the tiny config: every attention pair, hybrids, options, errors, counts, loading."""

import os

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import models
from models import ModelConfig, build_clip, create_model
from models.attention import ATTENTIONS
from models.vit import patch_dropout

NAMES = sorted(ATTENTIONS)
CAUSAL = [n for n in NAMES if ATTENTIONS[n].supports_causal]
NOT_CAUSAL = [n for n in NAMES if not ATTENTIONS[n].supports_causal]
IMAGE = [n for n in NAMES if ATTENTIONS[n].supports_bidirectional]  # deltanet is causal only: text tower alone
# the towers share nothing but the loss: each attention in each tower it allows, with softmax or itself in the other
PAIRS = sorted(
    {(n, "softmax") for n in IMAGE} | {("softmax", n) for n in CAUSAL} | {(n, n) for n in IMAGE if n in CAUSAL}
)


CAPTIONS = ["a photo of a cat", "two dogs on grass in the sun", "x"]


def batch(model, b=3, trim=False):
    """Images and tokenized captions for `model`; `trim` cuts the padding after the longest caption."""
    size = model.visual.image_size[0]
    images = torch.randn(b, 3, size, size, generator=torch.Generator().manual_seed(0))
    text = models.tokenizer(model)(CAPTIONS[:b])
    return images, text[:, : text.argmax(-1).max() + 1] if trim else text


def clip_loss(model, images, text):
    img, txt, scale = model(images, text)
    logits = scale * img @ txt.T
    labels = torch.arange(len(img))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def one_line_error(fn, *fragments):
    with pytest.raises(ValueError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg, msg
    for fragment in fragments:
        assert fragment in msg, msg


@pytest.mark.parametrize("image_attention,text_attention", PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_every_pair_forward_backward(image_attention, text_attention):
    model = create_model("tiny-s", image_attention=image_attention, text_attention=text_attention)
    images, text = batch(model, trim=True)
    img, txt, scale = model(images, text)
    assert img.shape == txt.shape == (3, 64)
    torch.testing.assert_close(img.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(txt.norm(dim=-1), torch.ones(3))
    assert scale.item() == pytest.approx(1 / 0.07, rel=1e-5)
    clip_loss(model, images, text).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name != "positional_embedding":
            assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("name", NOT_CAUSAL)
def test_non_causal_attention_in_text_tower_fails_naming_the_tower(name):
    one_line_error(
        lambda: create_model("tiny-s", text_attention=name), "text tower", f"attention {name!r} cannot be causal"
    )


@pytest.mark.parametrize("name", [n for n in NAMES if n not in IMAGE])
def test_causal_only_attention_in_image_tower_fails_naming_the_tower(name):
    one_line_error(
        lambda: create_model("tiny-s", image_attention=name), "image tower", f"attention {name!r} is causal only"
    )


@pytest.mark.parametrize("name", CAUSAL)
def test_text_ignores_padding_after_eot(name):
    """Causal attention pooled at EOT never sees the right padding, so key_mask=None is exact."""
    model = create_model("tiny-s", text_attention=name).eval()
    text = models.tokenizer(model)(["a photo of a cat"])
    eot = text.argmax(-1).item()
    noisy = text.clone()
    noisy[0, eot + 1 :] = torch.randint(1, 1000, (text.shape[1] - eot - 1,))
    with torch.no_grad():
        full, trimmed, changed = (
            model.encode_text(text),
            model.encode_text(text[:, : eot + 1]),
            model.encode_text(noisy),
        )
    torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(changed, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "softmax"] or ["softmax"])
def test_hybrid_per_layer_lists(name):
    text = [name, "softmax"] if name in CAUSAL else ["softmax", "softmax"]
    image = ["softmax", name] if name in IMAGE else ["softmax", "softmax"]
    model = create_model("tiny-s", image_attention=image, text_attention=text)
    assert [type(b.attn).name for b in model.visual.transformer.resblocks] == image
    assert [type(b.attn).name for b in model.transformer.resblocks] == text
    clip_loss(model, *batch(model)).backward()


@pytest.mark.skipif("linformer" not in ATTENTIONS, reason="linformer is not registered")
def test_options_per_attention_name_and_sequence_length_default():
    model = create_model(
        "tiny-s", image_attention=["softmax", "linformer"], image_attention_options={"linformer": {"length": 8}}
    )
    first, second = (b.attn for b in model.visual.transformer.resblocks)
    assert first.options == {} and second.proj_k.shape == (8, 17)  # max_length = 1 + (32 / 8)^2 image tokens
    flat = create_model("tiny-s", image_attention="linformer", image_attention_options={"length": 4, "max_length": 40})
    assert all(b.attn.proj_k.shape == (4, 40) for b in flat.visual.transformer.resblocks)


def test_wrong_configs_fail_with_one_line_errors(tmp_path):
    one_line_error(
        lambda: create_model("tiny-s", image_attention=["softmax"] * 3), "image tower", "3 names for 2 layers"
    )
    one_line_error(
        lambda: create_model("tiny-s", text_attention="nope"), "text tower", "unknown attention 'nope'", "softmax"
    )
    one_line_error(lambda: create_model("no-such-size"), "unknown model size 'no-such-size'", "tiny-s", "ViT-B-16")
    one_line_error(lambda: create_model("RN50"), "ResNet")
    one_line_error(lambda: create_model("ViT-B-16-SigLIP"), "not implemented by models/")
    one_line_error(
        lambda: create_model("tiny-s", image_attention_options={"bogus": 1}),
        "image tower",
        "'softmax' has no option(s) bogus",
    )
    one_line_error(lambda: create_model("tiny-s", attention="softmax"), "unknown option(s) attention")
    one_line_error(lambda: create_model("tiny-s", patch_dropout=1.0), "patch_dropout")


def test_head_width_that_does_not_divide_width_fails(tmp_path):
    import json

    import open_clip

    cfg = open_clip.get_model_config("tiny-s")
    cfg["vision_cfg"]["head_width"] = 48
    (tmp_path / "tiny-badhead.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(tmp_path)
    one_line_error(lambda: create_model("tiny-badhead"), "image tower width 64 is not divisible by head width 48")


@pytest.mark.parametrize("name,total", [("ViT-S-16", 62.26e6), ("ViT-B-16", 149.62e6), ("ViT-L-16", 427.74e6)])
def test_parameter_counts_match_open_clip(name, total):
    import open_clip

    cfg = open_clip.get_model_config(name)
    with torch.device("meta"):
        ours = models.summary(create_model(name), macs=False)
        theirs = sum(p.numel() for p in open_clip.model.CLIP(**cfg).parameters())
    assert ours["params"] == theirs
    assert ours["params"] == pytest.approx(total, abs=0.005e6)
    assert ours["params_image"] + ours["params_text"] + 1 == ours["params"]
    assert ours["params_without_token_embedding"] == ours["params"] - 49408 * cfg["text_cfg"]["width"]


def test_gmacs_match_open_clip_profile():
    """open_clip's published profile gives ViT-B-16 17.58 image GMACs and 2.91 text GMACs per sample."""
    with torch.device("meta"):
        s = models.gmacs_per_sample(create_model("ViT-B-16"))
    assert s["image_gmacs"] == pytest.approx(17.58, rel=0.01)
    assert s["text_gmacs"] == pytest.approx(2.91, rel=0.03)
    tiny = [models.summary(create_model(n))["gmacs_per_sample"] for n in ("tiny-s", "tiny-m", "tiny-l")]
    assert 0 < tiny[0] < tiny[1] < tiny[2]


def test_summary_is_one_vocabulary_for_our_models_and_open_clip_models():
    """The keys every run summary, eval result and scaling fit reads; an open_clip model of the same size
    gives the same numbers as ours, both counted on the meta device."""
    import open_clip

    from models.counts import KEYS

    ours = models.summary(create_model("tiny-s", image_attention="softmax", text_attention="softmax"))
    theirs = models.summary(open_clip.create_model("tiny-s"))
    assert list(ours) == list(theirs) == list(KEYS)
    for key in ("params", "params_image", "params_text", "params_without_token_embedding"):
        assert ours[key] == theirs[key], key
    assert theirs["gmacs_per_sample"] == pytest.approx(theirs["image_gmacs"] + theirs["text_gmacs"])
    assert (theirs["image_gmacs"], theirs["text_gmacs"]) == (ours["image_gmacs"], ours["text_gmacs"])
    assert models.summary(create_model("tiny-s", image_attention="linear_elu"))["image_attention"] == "linear_elu"
    assert "gmacs_per_sample" not in models.summary(create_model("tiny-s"), macs=False)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "softmax"])
def test_linearise_from_softmax_checkpoint(name, tmp_path):
    from safetensors.torch import save_file

    softmax = create_model("tiny-s")
    path = tmp_path / "softmax.safetensors"
    save_file({k: v.contiguous() for k, v in softmax.state_dict().items()}, str(path))
    text = name if name in CAUSAL else "softmax"
    image = name if name in IMAGE else "softmax"
    fresh = create_model("tiny-s", image_attention=image, text_attention=text)
    loaded, missing, _unexpected = models.load_pretrained(fresh, path)
    sd, own = softmax.state_dict(), fresh.state_dict()
    for key in loaded:
        torch.testing.assert_close(own[key], sd[key], rtol=0, atol=0)
    assert set(loaded) | set(missing) == set(own)
    assert all(sd[k].shape != own[k].shape for k in set(missing) & set(sd))
    assert set(missing) == {k for k in own if k not in sd or sd[k].shape != own[k].shape}
    assert {k for k in own if k.endswith("in_proj_weight")} <= set(loaded)
    via_config = build_clip(
        ModelConfig(name="tiny-s", image_attention=image, text_attention=text, pretrained=str(path))
    )
    for key in loaded:
        torch.testing.assert_close(via_config.state_dict()[key], sd[key], rtol=0, atol=0)


def test_grad_checkpointing_gives_the_same_loss_and_gradients():
    plain = create_model("tiny-s")
    ckpt = create_model("tiny-s", grad_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    images, text = batch(plain)
    la, lb = clip_loss(plain, images, text), clip_loss(ckpt, images, text)
    la.backward()
    lb.backward()
    torch.testing.assert_close(la, lb)
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_patch_dropout_keeps_the_class_token_and_only_trains():
    x = torch.randn(2, 17, 8)
    y = patch_dropout(x, 0.5)
    assert y.shape == (2, 9, 8)
    torch.testing.assert_close(y[:, 0], x[:, 0])
    assert all(any(torch.equal(row, p) for p in x[b, 1:]) for b in range(2) for row in y[b, 1:])
    model = create_model("tiny-s", patch_dropout=0.5)
    images, _ = batch(model)
    model.eval()
    torch.testing.assert_close(model.encode_image(images), model.encode_image(images))
    model.train()
    assert not torch.allclose(model.encode_image(images), model.encode_image(images))


def test_bf16_autocast_forward():
    model = create_model("tiny-s")
    images, text = batch(model)
    ref = model(images, text)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images, text)
    for r, o in zip(ref[:2], out[:2]):
        assert torch.isfinite(o).all()
        assert (r - o.float()).abs().max() < 0.05


def test_torch_compile_matches_eager_forward_and_backward(tmp_path):
    """aot_eager traces forward and backward as inductor does, without generating C++ (seconds, not minutes)."""
    model = create_model("tiny-s")
    images, text = batch(model)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    eager_loss = clip_loss(model, images, text)
    eager_grads = torch.autograd.grad(eager_loss, list(model.parameters()))
    compiled_loss = clip_loss(compiled, images, text)
    compiled_grads = torch.autograd.grad(compiled_loss, list(model.parameters()))
    torch.testing.assert_close(compiled_loss, eager_loss)
    for (name, _), a, b in zip(model.named_parameters(), compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)
    exported = models.read_state_dict(models.export_open_clip(compiled, tmp_path / "compiled.pt"))
    assert set(exported) == set(model.state_dict())


@pytest.mark.skipif(
    not os.environ.get("RUN_SLOW"), reason="inductor on CPU compiles C++ for ~90 s on 2 cores; RUN_SLOW=1 runs it"
)
def test_torch_compile_inductor_matches_eager():
    model = create_model("tiny-s").eval()
    images, text = batch(model)
    compiled = torch.compile(model)
    with torch.no_grad():
        for a, b in zip(model(images, text), compiled(images, text)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_transforms_and_tokenizer():
    model = create_model("tiny-m")
    train, evaluation = models.transforms(model)
    image = Image.new("RGB", (50, 40), (200, 10, 10))
    assert train(image).shape == evaluation(image).shape == (3, 32, 32)
    assert models.transforms("ViT-B-16")[1](image).shape == (3, 224, 224)
    tokens = models.tokenizer("tiny-m")(["hello world"])
    assert tokens.shape == (1, 32) and tokens.dtype == torch.long
    assert tokens[0].argmax() == 3  # start, two words, end-of-text: the largest id


def test_image_size_and_context_length_override_the_size():
    """model.image_size / model.context_length: the grid, both position tables, the transforms, the tokenizer and
    the compute figures follow; a size the patch does not divide is one line naming the nearest valid ones."""
    cfg = ModelConfig(name="tiny-s", image_attention="linear_affine_nodenom", image_size=64, context_length=48)
    model, own = build_clip(cfg), build_clip(ModelConfig(name="tiny-s"))
    assert model.visual.image_size == (64, 64) and own.visual.image_size == (32, 32)
    assert model.visual.positional_embedding.shape == ((64 // 8) ** 2 + 1, 64)
    assert model.positional_embedding.shape[0] == 48 != own.positional_embedding.shape[0]
    tokens = models.tokenizer(cfg)(["a red circle", "a blue square"])
    assert tokens.shape == (2, 48) and models.tokenizer(model).context_length == 48
    image = Image.new("RGB", (100, 80))
    assert models.transforms(cfg)[1](image).shape == (3, 64, 64)
    image_features, text_features, _ = model(torch.randn(2, 3, 64, 64), tokens)
    assert image_features.shape == text_features.shape == (2, model.visual.proj.shape[1])
    assert models.summary(model)["image_gmacs"] > 3.5 * models.summary(own)["image_gmacs"]  # 4x the patches
    with pytest.raises(
        ValueError,
        match=r"^model.image_size=70 is not a multiple of tiny-s's patch size 8; nearest "
        r"valid sizes: 64, 72$",
    ):
        build_clip(ModelConfig(name="tiny-s", image_size=70))
    with pytest.raises(ValueError, match=r"model.context_length=1: a caption needs at least 2 tokens"):
        build_clip(ModelConfig(name="tiny-s", context_length=1))


def test_loading_at_another_size_resamples_the_position_tables_as_open_clip_does(tmp_path):
    """A tiny-s checkpoint (32 px, context 16 ... its own) loaded at 64 px and another context: with text_pos_keep=0
    our embeddings equal open_clip's create_model(force_image_size, force_context_length); with the Long-CLIP
    default the first 20 text positions are the checkpoint's exactly."""
    import open_clip
    from safetensors.torch import save_file

    torch.manual_seed(0)
    source = open_clip.create_model("tiny-s")
    path = tmp_path / "tiny-s.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    context = source.positional_embedding.shape[0] * 2
    ours = create_model("tiny-s", pretrained=str(path), image_size=64, context_length=context, text_pos_keep=0).eval()
    theirs = open_clip.create_model(
        "tiny-s", pretrained=str(path), force_image_size=64, force_context_length=context
    ).eval()
    images = torch.randn(2, 3, 64, 64)
    tokens = open_clip.get_tokenizer("tiny-s", context_length=context)(["a red circle", "a blue square " * 8])
    with torch.no_grad():
        torch.testing.assert_close(ours.encode_image(images), theirs.encode_image(images), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.encode_text(tokens), theirs.encode_text(tokens), rtol=1e-5, atol=1e-5)
    kept = create_model("tiny-s", pretrained=str(path), context_length=context)  # text_pos_keep: 20 by default
    old = source.positional_embedding.detach()
    keep = min(20, old.shape[0] - 1)
    torch.testing.assert_close(kept.positional_embedding[:keep].detach(), old[:keep], rtol=0, atol=0)
    assert not torch.equal(kept.positional_embedding[keep : 2 * keep], ours.positional_embedding[keep : 2 * keep])


def test_each_resample_is_one_log_line_and_a_short_caption_keeps_its_embedding(tmp_path, caplog):
    """Loading at 64 px and twice the context logs one line per table; with the first 20 text positions kept
    (text_pos_keep), a caption shorter than 20 tokens has exactly the source model's text embedding (the text tower
    is causal: its end-of-text token sees only kept positions)."""
    import open_clip
    from safetensors.torch import save_file

    torch.manual_seed(0)
    source = open_clip.create_model("tiny-s").eval()
    path = tmp_path / "tiny-s.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    context = source.positional_embedding.shape[0] * 2
    with caplog.at_level("INFO", logger="models.pretrained"):
        stretched = create_model("tiny-s", pretrained=str(path), image_size=64, context_length=context).eval()
    lines = [r.getMessage() for r in caplog.records if "resampled" in r.getMessage() or "stretched" in r.getMessage()]
    assert len(lines) == 2 and "visual.positional_embedding resampled from (17, 64) to (65, 64)" in lines[0]
    assert f"text positions stretched from {context // 2} to {context} (first 20 kept" in lines[1]
    caption = ["a red circle"]  # 5 tokens with start and end
    with torch.no_grad():
        ours = stretched.encode_text(open_clip.get_tokenizer("tiny-s", context_length=context)(caption))
        theirs = source.encode_text(open_clip.get_tokenizer("tiny-s")(caption))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_tensor_that_cannot_be_resampled_refuses_the_load_unless_allowed_fresh(tmp_path):
    """Another patch size (conv1 of another shape) is one error naming the tensor and both shapes; with
    model.pretrained_fresh matching it, it keeps its initialisation and everything else loads."""
    from safetensors.torch import save_file

    from models.run_folder import CheckpointError

    source = create_model("tiny-s").state_dict()
    conv = source["visual.conv1.weight"]
    source["visual.conv1.weight"] = conv[:, :, :-1, :-1].contiguous()
    path = tmp_path / "other-patch.safetensors"
    save_file({k: v.contiguous() for k, v in source.items()}, str(path))
    shape = tuple(conv.shape)
    with pytest.raises(CheckpointError, match=r"visual\.conv1\.weight is .* in the checkpoint but " + re_shape(shape)):
        create_model("tiny-s", pretrained=str(path))
    torch.manual_seed(3)
    model = create_model("tiny-s", pretrained=str(path), pretrained_fresh=["visual.conv1.*"])
    torch.manual_seed(3)
    init = create_model("tiny-s")
    torch.testing.assert_close(model.visual.conv1.weight, init.visual.conv1.weight, rtol=0, atol=0)
    torch.testing.assert_close(model.state_dict()["visual.proj"], source["visual.proj"], rtol=0, atol=0)


def re_shape(shape: tuple) -> str:
    return str(shape).replace("(", r"\(").replace(")", r"\)")
