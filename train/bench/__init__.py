"""The benchmarks' measurements and pages; scripts/bench_*.py, scripts/profile_step.py and scripts/gpu_train_check.py
are their command lines.

    probes        timer, peak-memory probe, out-of-memory recognition, reference rates, a race of contenders
    attention     the attention math timed on q, k, v [B, H, N, D] (scripts.bench_attention; scripts.demo's table)
    attention_page  that benchmark's ratios, aims, tables and plot
    training      a training step of our CLIP against open_clip's, and per image attention (scripts.bench_train)
    long          training-step time against sequence length, with a FLOP-model bound (scripts.bench_long)
    distill_step  a linearisation step against a training step of the student (scripts.bench_distill)
    step          `python -m train` processes of this tree against a baseline commit (scripts.bench_step)
    zeroshot      zero-shot evaluation against clip_benchmark (scripts.bench_eval)
    loader        our shard loader against open_clip's webdataset pipeline (scripts.bench_data)
    checkpoint    writing, hashing and checking a checkpoint (scripts.bench_checkpoint)
    profiling     where the main job's training step spends its time (scripts.profile_step)
    gpu_check     the real training loop on synthetic batches, DDP and FSDP (scripts.gpu_train_check)
    fsdp_on_cpu   accelerate's FSDP path on a gloo CPU mesh (scripts.fsdp_on_cpu, the tests, gpu_check on a CPU)

Imported one module at a time: some need open_clip, clip_benchmark or open_clip_train, which a GPU machine running
gpu_check need not have.
"""
