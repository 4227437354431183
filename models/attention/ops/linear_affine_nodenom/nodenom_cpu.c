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

/* The four passes on one row range [n0, n1) of one head; acc is the range's own [D + 1, D] accumulator. */
INLINE void key_pass(const float *k, const float *v, const float *keep, int64_t n0, int64_t n1, float *rk, float *acc,
                     const int nv) { /* rk = keep / |k|, acc = [S; s] before halving */
  memset(acc, 0, (16 * nv + 1) * 16 * nv * sizeof(float));
  scaled_gram(k, v, keep, n0, n1, rk, acc, NULL, nv);
}

INLINE void query_pass(const float *q, const float *state, int64_t n0, int64_t n1, float *rq, float *out, int nt,
                       const int nv) { /* rq = 1 / |q|, o = rq (q S) + s */
  const int D = 16 * nv;
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t = n1 - t0 < TILE ? n1 - t0 : TILE;
    inv_norms(q + t0 * D, t, rq + t0, nv);
    all_rows_times(q + t0 * D, state, rq + t0, NULL, state + D * D, NULL, out + t0 * D, NULL, t, nv, AFFINE, nt);
  }
}

INLINE void grad_query_pass(const float *g, const float *q, const float *rq, const float *St, int64_t n0, int64_t n1,
                            float *acc, float *gq, int nt, const int nv) { /* acc = [q^^T g; sum g], gq through q^ of g S^T */
  const int D = 16 * nv;
  float a[TILE * 128];
  memset(acc, 0, (D + 1) * D * sizeof(float));
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int t = (int)(n1 - t0 < TILE ? n1 - t0 : TILE);
    for (int n = 0; n < t; n++)
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) store(a + n * D + 16 * c, splat(rq[t0 + n]) * load(q + (t0 + n) * D + 16 * c));
    const int64_t next = n1 - t0 - t < TILE ? n1 - t0 - t : TILE;
    gram(a, NULL, g + t0 * D, t, acc, nv, q + (t0 + t) * D, g + (t0 + t) * D, next);
    all_rows_times(g + t0 * D, St, rq + t0, NULL, NULL, q + t0 * D, gq + t0 * D, NULL, t, nv, RADIAL, nt);
  }
}

INLINE void grad_key_pass(const float *k, const float *v, const float *keep, const float *rk, const float *half,
                          const float *Ht, int64_t n0, int64_t n1, float *gk, float *gv, int nt, const int nv) {
  const int D = 16 * nv; /* gv = k^ H + keep h, gk through k^ of v H^T */
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t = n1 - t0 < TILE ? n1 - t0 : TILE;
    all_rows_times(k + t0 * D, half, rk + t0, keep ? keep + t0 : NULL, half + D * D, NULL, gv + t0 * D, NULL, t, nv, AFFINE, nt);
    all_rows_times(v + t0 * D, Ht, rk + t0, NULL, NULL, k + t0 * D, gk + t0 * D, NULL, t, nv, RADIAL, nt);
  }
}

/* Each pass compiled once per head size (nv constant, so loops unroll and accumulators live in registers);
   the OpenMP regions below, outlined by the compiler before any inlining, call them through this table. */
typedef struct {
  void (*key)(const float *, const float *, const float *, int64_t, int64_t, float *, float *);
  void (*query)(const float *, const float *, int64_t, int64_t, float *, float *, int);
  void (*grad_query)(const float *, const float *, const float *, const float *, int64_t, int64_t, float *, float *, int);
  void (*grad_key)(const float *, const float *, const float *, const float *, const float *, const float *, int64_t,
                   int64_t, float *, float *, int);
} passes;

#define PASSES(NV)                                                                                                   \
  static void key_##NV(const float *k, const float *v, const float *keep, int64_t n0, int64_t n1, float *rk,         \
                       float *acc) { key_pass(k, v, keep, n0, n1, rk, acc, NV); }                                    \
  static void query_##NV(const float *q, const float *st, int64_t n0, int64_t n1, float *rq, float *out, int nt) {   \
    query_pass(q, st, n0, n1, rq, out, nt, NV);                                                                      \
  }                                                                                                                  \
  static void grad_query_##NV(const float *g, const float *q, const float *rq, const float *St, int64_t n0,           \
                              int64_t n1, float *acc, float *gq, int nt) {                                           \
    grad_query_pass(g, q, rq, St, n0, n1, acc, gq, nt, NV);                                                          \
  }                                                                                                                  \
  static void grad_key_##NV(const float *k, const float *v, const float *keep, const float *rk, const float *half,    \
                            const float *Ht, int64_t n0, int64_t n1, float *gk, float *gv, int nt) {                 \
    grad_key_pass(k, v, keep, rk, half, Ht, n0, n1, gk, gv, nt, NV);                                                 \
  }                                                                                                                  \
  static const passes passes_##NV = {key_##NV, query_##NV, grad_query_##NV, grad_key_##NV};
PASSES(1)
PASSES(2)
PASSES(4)
PASSES(8)

static const passes *passes_for(int64_t D) {
  switch (D) {
    case 16: return &passes_1;
    case 32: return &passes_2;
    case 64: return &passes_4;
    case 128: return &passes_8;
    default: return NULL;
  }
}

/* Entry points (ctypes). stream: write outputs with non-temporal stores (for outputs larger than the caches). Return 0, or -1 for an unsupported D or a failed allocation (the caller falls back).
   Forward writes out [G, N, D], rq [G, N], rk [G, M] and state [G, D + 1, D] = [S; s] (halved). */
int nodenom_forward(const float *q, const float *k, const float *v, const float *keep, int64_t G, int64_t N,
                    int64_t M, int64_t D, float *out, float *rq, float *rk, float *state, int threads, int stream) {
  const passes *f = passes_for(D);
  const int nt = stream && aligned(out);
  const int64_t kparts = parts_for(G, M, threads), qparts = parts_for(G, N, threads), size = (D + 1) * D;
  scratch s;
  const int ok = scratch_alloc(&s, G, kparts, D + 1, D) && f;
  if (ok) {
#pragma omp parallel num_threads(threads)
    {
      touch(out, G * N * D);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < G * kparts; i++) {
        int64_t h, n0, n1;
        item_range(i, kparts, M, &h, &n0, &n1);
        f->key(k + h * M * D, v + h * M * D, keep ? keep + h * M : NULL, n0, n1, rk + h * M, s.partial + i * size);
      }
#pragma omp single
      reduce_parts(s.partial, G, kparts, D + 1, D, 0.5f, state);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < G * qparts; i++) {
        int64_t h, n0, n1;
        item_range(i, qparts, N, &h, &n0, &n1);
        f->query(q + h * N * D, state + h * size, n0, n1, rq + h * N, out + h * N * D, nt);
      }
    }
  }
  fence();
  scratch_free(&s);
  return ok ? 0 : -1;
}

/* Backward from g = dL/do [G, N, D] and the forward's rq, rk, state; writes gq [G, N, D], gk and gv [G, M, D]. */
int nodenom_backward(const float *g, const float *q, const float *k, const float *v, const float *keep,
                     const float *rq, const float *rk, const float *state, int64_t G, int64_t N, int64_t M, int64_t D,
                     float *gq, float *gk, float *gv, int threads, int stream) {
  const passes *f = passes_for(D);
  const int nt = stream && aligned(gq) && aligned(gk) && aligned(gv);
  const int64_t qparts = parts_for(G, N, threads), kparts = parts_for(G, M, threads), size = (D + 1) * D;
  scratch s; /* sum: [H; h] = [q^^T g; sum g] / 2, tr1: S^T, tr2: H^T */
  const int ok = scratch_alloc(&s, G, qparts, D + 1, D) && f;
  if (ok) {
    transpose_blocks(state, G, D + 1, D, s.tr1);
#pragma omp parallel num_threads(threads)
    {
      touch(gq, G * N * D);
      touch(gk, G * M * D);
      touch(gv, G * M * D);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < G * qparts; i++) {
        int64_t h, n0, n1;
        item_range(i, qparts, N, &h, &n0, &n1);
        f->grad_query(g + h * N * D, q + h * N * D, rq + h * N, s.tr1 + h * D * D, n0, n1, s.partial + i * size,
                      gq + h * N * D, nt);
      }
#pragma omp single
      {
        reduce_parts(s.partial, G, qparts, D + 1, D, 0.5f, s.sum);
        transpose_blocks(s.sum, G, D + 1, D, s.tr2);
      }
#pragma omp for schedule(static)
      for (int64_t i = 0; i < G * kparts; i++) {
        int64_t h, n0, n1;
        item_range(i, kparts, M, &h, &n0, &n1);
        f->grad_key(k + h * M * D, v + h * M * D, keep ? keep + h * M : NULL, rk + h * M, s.sum + h * size,
                    s.tr2 + h * D * D, n0, n1, gk + h * M * D, gv + h * M * D, nt);
      }
    }
  }
  fence();
  scratch_free(&s);
  return ok ? 0 : -1;
}
