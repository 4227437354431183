"""Forward + backward (and, on a GPU, forward-only) time and peak memory of the attentions on q, k, v [B, H, N, D].

    .venv/bin/python -m scripts.bench_attention                 # CPU, full run, about 10 minutes on 2 cores
    .venv/bin/python -m scripts.bench_attention --quick         # a smoke run in seconds
    python -m scripts.bench_attention --device cuda             # GPU: B=4, H=8, D=64, bf16 and fp32, N up to 4e6

Times the attention math only (q, k, v require grad; forward, then backward of a fixed random gradient), best
of several repeats within a per-point budget, softmax through torch SDPA as the peer: on a GPU pinned to its
FLASH backend (FlashAttention-2; fp32, which it lacks, on the memory-efficient one). Up to --paired-max-n tokens
(1,025) each variant's steps alternate with SDPA's and its ratio is to SDPA's best over the same repeats (the
CSV's peer_ms): at 77 tokens a step is about a millisecond, and the machine's speed drifting between softmax's own
row and the variant's, minutes apart, moved ratios by a third on a 2-core VM. The linear ops run the
implementation the dispatcher picks (`--impl`, default auto; the impl column says which ran). A point whose
predicted time is over --max-seconds is not run: its time is extrapolated from the largest measured point of the
same line, O(N^p) with p = 1 for linear variants and 2 for the others, and marked. A point that runs out of
memory is reported as such (and the larger N of its line are not tried); it never stops the run. Timer and
memory probe per device (train/bench/probes.py): perf_counter and the resident-set high-water mark on the CPU,
CUDA events and torch.cuda.max_memory_allocated on a GPU, both above what the inputs hold. Reference rates are
measured in the same run: fp32 GEMM on the CPU (linear variants report GFLOP/s counting the matmuls of the linear
algorithm: non-causal 12 N D^2 per head for forward + backward, causal 12 N (C D + D^2) with chunks of C tokens),
copy bandwidth on a GPU (linear variants report GB/s of their least traffic: q, k, v read and o written forward,
and q, k, v, dL/do read and three gradients written backward). Writes <out>.csv, <out>.png, <out>.md. The
measurements and the page: train/bench/attention.py and attention_page.py.
"""

from __future__ import annotations

from pathlib import Path

from train.bench import attention, attention_page


def main(argv: list[str] | None = None) -> Path:
    args = attention.parse_args(argv)
    frame, info = attention.run(args)
    return attention_page.write(frame, info, args)


if __name__ == "__main__":
    main()
