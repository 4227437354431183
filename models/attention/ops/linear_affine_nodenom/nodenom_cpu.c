/* Fused CPU kernel for non-causal linear_affine_nodenom (Gerami, Madani, Duraiswami 2026, Eq. 7).

   o_i = sum_n (1 + q^_i.k^_n) / 2 v_n = rq_i (q_i S) + s,  S = sum_n rk_n k_n v_n^T / 2,  s = sum_n keep_n v_n / 2.
   Forward and backward are each one OpenMP region (torch's own runtime: the process has one libgomp.so.1)
   doing two passes over [G, N, D] fp32 rows; every row-scaling, norm, bias and radial projection is
   applied to rows still in registers or L1, so memory sees only the reads of q, k, v, g and the writes
   of o and the three gradients. The matmuls are register-blocked on GCC vector extensions (16 floats),
   which GCC lowers to AVX-512, AVX2 or SSE, whatever -march allows. The same math in PyTorch ops is
   torch.py beside this file; ops/cpu_build.py builds this file, cpu.py calls it, and tests compare both with the
   O(N^2) reference.
   Shapes: q [G, N, D], k and v [G, M, D], keep [G, M] (1 real key, 0 padding) or NULL, D = 16 nv with
   nv in {1, 2, 4, 8}. */
#include "linear_cpu.h"

/* The four passes on one row range [n0, n1) of one head of a call (head_of); acc is the range's own [D + 1, D]
   accumulator. */
INLINE void nodenom_key_pass(const call *hd, int64_t n0, int64_t n1, float *acc, const int nv) {
  /* rk = keep / |k|, acc = [S; s] before halving */
  memset(acc, 0, (16 * nv + 1) * 16 * nv * sizeof(float));
  scaled_gram(hd->k, hd->v, hd->keep, n0, n1, hd->rk, acc, NULL, nv);
}

INLINE void nodenom_query_pass(const call *hd, int64_t n0, int64_t n1, float *acc, const int nv) {
  const int D = 16 * nv; /* rq = 1 / |q|, o = rq (q S) + s */
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t = n1 - t0 < TILE ? n1 - t0 : TILE;
    inv_norms(hd->q + t0 * D, t, hd->rq + t0, nv);
    all_rows_times(hd->q + t0 * D, hd->state, hd->rq + t0, NULL, hd->state + D * D, NULL, hd->out + t0 * D, NULL, t, nv,
                   AFFINE, hd->nt);
  }
}

INLINE void nodenom_grad_query_pass(const call *hd, int64_t n0, int64_t n1, float *acc, const int nv) {
  const int D = 16 * nv; /* acc = [q^^T g; sum g], gq through q^ of g S^T */
  const float *q = hd->q, *g = hd->g, *rq = hd->rq;
  float a[TILE * 128];
  memset(acc, 0, (D + 1) * D * sizeof(float));
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int t = (int)(n1 - t0 < TILE ? n1 - t0 : TILE);
    for (int n = 0; n < t; n++)
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) store(a + n * D + 16 * c, splat(rq[t0 + n]) * load(q + (t0 + n) * D + 16 * c));
    const int64_t next = n1 - t0 - t < TILE ? n1 - t0 - t : TILE;
    gram(a, NULL, g + t0 * D, t, acc, nv, q + (t0 + t) * D, g + (t0 + t) * D, next);
    all_rows_times(g + t0 * D, hd->St, rq + t0, NULL, NULL, q + t0 * D, hd->gq + t0 * D, NULL, t, nv, RADIAL, hd->nt);
  }
}

INLINE void nodenom_grad_key_pass(const call *hd, int64_t n0, int64_t n1, float *acc, const int nv) {
  const int D = 16 * nv; /* with [H; h] = sum: gv = k^ H + keep h, gk through k^ of v H^T */
  const float *k = hd->k, *keep = hd->keep, *rk = hd->rk;
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t = n1 - t0 < TILE ? n1 - t0 : TILE;
    all_rows_times(k + t0 * D, hd->sum, rk + t0, keep ? keep + t0 : NULL, hd->sum + D * D, NULL, hd->gv + t0 * D, NULL,
                   t, nv, AFFINE, hd->nt);
    all_rows_times(hd->v + t0 * D, hd->Ht, rk + t0, NULL, NULL, k + t0 * D, hd->gk + t0 * D, NULL, t, nv, RADIAL,
                   hd->nt);
  }
}

PASSES_FOR(nodenom)

/* Entry points (ctypes). stream: write outputs with non-temporal stores (for outputs larger than the caches). Return 0, or -1 for an unsupported D or a failed allocation (the caller falls back).
   Forward writes out [G, N, D], rq [G, N], rk [G, M] and state [G, D + 1, D] = [S; s] (halved). */
int nodenom_forward(const float *q, const float *k, const float *v, const float *keep, int64_t G, int64_t N,
                    int64_t M, int64_t D, float *out, float *rq, float *rk, float *state, int threads, int stream) {
  const call c = {.q = q, .k = k, .v = v, .keep = keep, .out = out, .rq = rq, .rk = rk, .state = state,
                  .G = G, .N = N, .M = M, .D = D, .rows = D + 1, .nt = stream && aligned(out)};
  return forward_passes(nodenom_for(D), &c, 0.5f, NULL, threads);
}

/* Backward from g = dL/do [G, N, D] and the forward's rq, rk, state; writes gq [G, N, D], gk and gv [G, M, D]
   (the reduced query pass: [H; h] = [q^^T g; sum g] / 2). */
int nodenom_backward(const float *g, const float *q, const float *k, const float *v, const float *keep,
                     const float *rq, const float *rk, const float *state, int64_t G, int64_t N, int64_t M, int64_t D,
                     float *gq, float *gk, float *gv, int threads, int stream) {
  const call c = {.g = g, .q = q, .k = k, .v = v, .keep = keep, .rq = (float *)rq, .rk = (float *)rk,
                  .state = (float *)state, .gq = gq, .gk = gk, .gv = gv, .G = G, .N = N, .M = M, .D = D, .rows = D + 1,
                  .nt = stream && aligned(gq) && aligned(gk) && aligned(gv)};
  return backward_passes(nodenom_for(D), c, 0.5f, NULL, threads);
}
