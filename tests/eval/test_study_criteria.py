"""eval/study_report.criteria: the checks a study must pass; the check across model sizes only where there are sizes
to compare (a one-size study such as configs/study/tokens577.yaml does not fail it)."""

from eval.study_report import criteria


def run(attention, params, top1):
    size = f"w{params}"
    return dict(attention=attention, params_without_token_embedding=params, size=size, top1=top1, samples_seen=1000,
                tail_slope=-0.5)  # fmt: skip


def test_the_size_check_needs_two_sizes():
    one = [run("softmax", 10, 0.9), run("linear_affine_nodenom", 10, 0.8)]
    names = [name for name, _, _ in criteria(one, {}, num_classes=24)]
    assert not any("model size" in n for n in names) and any("learning curve still falls" in n for n in names)
    two = [*one, run("softmax", 40, 0.95), run("linear_affine_nodenom", 40, 0.7)]
    checks = {name: ok for name, ok, _ in criteria(two, {}, num_classes=24)}
    sized = {n: ok for n, ok in checks.items() if "model size" in n}
    assert len(sized) == 2 and not any(sized.values())  # no error-vs-parameters fit given: the check cannot hold
