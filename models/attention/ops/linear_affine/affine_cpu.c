/* Fused CPU kernel for non-causal linear_affine: o_i = sum_n (1 + q^_i.k^_n) v_n / sum_n (1 + q^_i.k^_n).

   With rk = keep / |k| (k^ zero for padding), z = sum_n k^_n, count = sum_n keep_n, c = sum_n keep_n v_n / count
   (the mean real value; the weights sum to one, so centring v on c changes nothing but keeps the result exact
   when all v are equal, as NormalisedLinear in ops/normalised.py does) and S = sum_n k^_n (v_n - c)^T = K^T V - z c^T:
     den_i = count + q^_i . z,   o_i = c + q^_i S / den_i.
   Backward from g: with p_i = g_i S^T / den_i and dden_i = -(q^_i . p_i) / den_i,
     dS = sum_i q^_i g_i^T / den_i,  dz = sum_i dden_i q^_i,  dc = sum_i g_i - dS^T z,
     dq^_i = p_i + dden_i z,  dk^_n = dS (v_n - c) + dz = v_n dS^T + w with w = dz - dS c,
     dv_n = k^_n dS + keep_n dc / count,
   each dx^ taken through x^ = x / |x|. Same structure as nodenom_cpu.c: two passes forward, two backward. */
#include <float.h>

#include "linear_cpu.h"

/* acc [D + 2, D] = [K^T V; sum keep v; z] of one row range, rk = keep / |k|. */
INLINE void affine_key_pass(const float *k, const float *v, const float *keep, int64_t n0, int64_t n1, float *rk,
                            float *acc, const int nv) {
  const int D = 16 * nv;
  memset(acc, 0, (D + 2) * D * sizeof(float));
  scaled_gram(k, v, keep, n0, n1, rk, acc, acc + (D + 1) * D, nv);
}

/* state [D + 2, D] = [S; c; z]: rq = 1 / |q|, den = count + q^ . z, o = c + rq (q S) / den. */
INLINE void affine_query_pass(const float *q, const float *state, float count, int64_t n0, int64_t n1, float *rq,
                              float *den, float *out, const int nv) {
  const int D = 16 * nv;
  const float *z = state + (D + 1) * D;
  float scale[TILE];
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int t = (int)(n1 - t0 < TILE ? n1 - t0 : TILE);
    inv_norms(q + t0 * D, t, rq + t0, nv);
    for (int n = 0; n < t; n++) {
      vf dot = {0};
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) dot += load(q + (t0 + n) * D + 16 * c) * load(z + 16 * c);
      const float d = count + rq[t0 + n] * hsum(dot);
      den[t0 + n] = d > FLT_MIN ? d : FLT_MIN; /* >= 0 exactly (1 + cos >= 0); the floor of normalised.py */
      scale[n] = rq[t0 + n] / den[t0 + n];
    }
    all_rows_times(q + t0 * D, state, scale, NULL, state + D * D, NULL, out + t0 * D, NULL, t, nv, AFFINE, 0);
  }
}

/* acc [D + 2, D] = [dS; sum g; dz] of one row range, and gq, from St = S^T and z. */
INLINE void affine_grad_query_pass(const float *g, const float *q, const float *rq, const float *den, const float *St,
                                   const float *z, int64_t n0, int64_t n1, float *acc, float *gq, const int nv) {
  const int D = 16 * nv;
  float a[TILE * 128];
  memset(acc, 0, (D + 2) * D * sizeof(float));
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int t = (int)(n1 - t0 < TILE ? n1 - t0 : TILE);
    const float *qt = q + t0 * D, *gt = g + t0 * D;
    for (int n = 0; n < t; n++)
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) store(a + n * D + 16 * c, splat(rq[t0 + n] / den[t0 + n]) * load(qt + n * D + 16 * c));
    const int64_t next = n1 - t0 - t < TILE ? n1 - t0 - t : TILE;
    gram(a, NULL, gt, t, acc, nv, qt + t * D, gt + t * D, next);
    all_rows_times(gt, St, rq + t0, den + t0, z, qt, gq + t0 * D, acc + (D + 1) * D, t, nv, DENOMINATOR, 0);
  }
}

/* half [D + 2, D] = [dS; dc / count; w], Ht = dS^T: gv = rk (k dS) + keep dc / count, gk through k^ of v dS^T + w. */
INLINE void affine_grad_key_pass(const float *k, const float *v, const float *keep, const float *rk, const float *half,
                                 const float *Ht, int64_t n0, int64_t n1, float *gk, float *gv, const int nv) {
  const int D = 16 * nv;
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t = n1 - t0 < TILE ? n1 - t0 : TILE;
    all_rows_times(k + t0 * D, half, rk + t0, keep ? keep + t0 : NULL, half + D * D, NULL, gv + t0 * D, NULL, t, nv, AFFINE, 0);
    all_rows_times(v + t0 * D, Ht, rk + t0, NULL, half + (D + 1) * D, k + t0 * D, gk + t0 * D, NULL, t, nv, RADIAL, 0);
  }
}

typedef struct {
  void (*key)(const float *, const float *, const float *, int64_t, int64_t, float *, float *);
  void (*query)(const float *, const float *, float, int64_t, int64_t, float *, float *, float *);
  void (*grad_query)(const float *, const float *, const float *, const float *, const float *, const float *, int64_t,
                     int64_t, float *, float *);
  void (*grad_key)(const float *, const float *, const float *, const float *, const float *, const float *, int64_t,
                   int64_t, float *, float *);
} affine_passes;

#define AFFINE_PASSES(NV)                                                                                            \
  static void a_key_##NV(const float *k, const float *v, const float *keep, int64_t n0, int64_t n1, float *rk,       \
                         float *acc) { affine_key_pass(k, v, keep, n0, n1, rk, acc, NV); }                           \
  static void a_query_##NV(const float *q, const float *st, float count, int64_t n0, int64_t n1, float *rq,          \
                           float *den, float *out) { affine_query_pass(q, st, count, n0, n1, rq, den, out, NV); }    \
  static void a_grad_query_##NV(const float *g, const float *q, const float *rq, const float *den, const float *St,  \
                                const float *z, int64_t n0, int64_t n1, float *acc, float *gq) {                     \
    affine_grad_query_pass(g, q, rq, den, St, z, n0, n1, acc, gq, NV);                                               \
  }                                                                                                                  \
  static void a_grad_key_##NV(const float *k, const float *v, const float *keep, const float *rk, const float *half,  \
                              const float *Ht, int64_t n0, int64_t n1, float *gk, float *gv) {                       \
    affine_grad_key_pass(k, v, keep, rk, half, Ht, n0, n1, gk, gv, NV);                                              \
  }                                                                                                                  \
  static const affine_passes affine_##NV = {a_key_##NV, a_query_##NV, a_grad_query_##NV, a_grad_key_##NV};
AFFINE_PASSES(1)
AFFINE_PASSES(2)
AFFINE_PASSES(4)
AFFINE_PASSES(8)

static const affine_passes *affine_for(int64_t D) {
  switch (D) {
    case 16: return &affine_1;
    case 32: return &affine_2;
    case 64: return &affine_4;
    case 128: return &affine_8;
    default: return NULL;
  }
}

/* Per head, from the summed [K^T V; sum keep v; z]: c = sum keep v / count, S = K^T V - z c^T, in place. */
static void centre(float *state, const float *count, int64_t G, int64_t D) {
  for (int64_t h = 0; h < G; h++) {
    float *S = state + h * (D + 2) * D, *c = S + D * D, *z = c + D;
    for (int64_t e = 0; e < D; e++) c[e] = count[h] > 0 ? c[e] / count[h] : 0.0f; /* no real key: c = 0 */
    for (int64_t d = 0; d < D; d++)
      for (int64_t e = 0; e < D; e++) S[d * D + e] -= z[d] * c[e];
  }
}

/* Writes out [G, N, D], rq and den [G, N], rk [G, M] and state [G, D + 2, D] = [S; c; z]; count [G]. */
int affine_forward(const float *q, const float *k, const float *v, const float *keep, const float *count, int64_t G,
                   int64_t N, int64_t M, int64_t D, float *out, float *rq, float *rk, float *den, float *state,
                   int threads) {
  const affine_passes *f = affine_for(D);
  const int64_t kparts = parts_for(G, M, threads), qparts = parts_for(G, N, threads), size = (D + 2) * D;
  scratch s;
  const int ok = scratch_alloc(&s, G, kparts, D + 2, D) && f;
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
      {
        reduce_parts(s.partial, G, kparts, D + 2, D, 1.0f, state);
        centre(state, count, G, D);
      }
#pragma omp for schedule(static)
      for (int64_t i = 0; i < G * qparts; i++) {
        int64_t h, n0, n1;
        item_range(i, qparts, N, &h, &n0, &n1);
        f->query(q + h * N * D, state + h * size, count[h], n0, n1, rq + h * N, den + h * N, out + h * N * D);
      }
    }
  }
  scratch_free(&s);
  return ok ? 0 : -1;
}

/* Per head, from the summed [dS; sum g; dz] in half: half becomes [dS; dc / count; w], Ht = dS^T (already). */
static void grad_state(float *half, const float *state, const float *count, int64_t G, int64_t D) {
  for (int64_t h = 0; h < G; h++) {
    float *dS = half + h * (D + 2) * D, *dc = dS + D * D, *w = dc + D;
    const float *c = state + h * (D + 2) * D + D * D, *z = c + D;
    for (int64_t e = 0; e < D; e++) {
      float zdS = 0;
      for (int64_t d = 0; d < D; d++) zdS += z[d] * dS[d * D + e];
      dc[e] = count[h] > 0 ? (dc[e] - zdS) / count[h] : 0.0f;
    }
    for (int64_t d = 0; d < D; d++) {
      float dSc = 0;
      for (int64_t e = 0; e < D; e++) dSc += dS[d * D + e] * c[e];
      w[d] -= dSc;
    }
  }
}

/* Writes gq [G, N, D], gk and gv [G, M, D] from g [G, N, D] and affine_forward's rq, rk, den, state. */
int affine_backward(const float *g, const float *q, const float *k, const float *v, const float *keep,
                    const float *count, const float *rq, const float *rk, const float *den, const float *state,
                    int64_t G, int64_t N, int64_t M, int64_t D, float *gq, float *gk, float *gv, int threads) {
  const affine_passes *f = affine_for(D);
  const int64_t qparts = parts_for(G, N, threads), kparts = parts_for(G, M, threads), size = (D + 2) * D;
  scratch s; /* sum: [dS; sum g; dz], then [dS; dc / count; w]; tr1: S^T, tr2: dS^T */
  const int ok = scratch_alloc(&s, G, qparts, D + 2, D) && f;
  if (ok) {
    transpose_blocks(state, G, D + 2, D, s.tr1);
#pragma omp parallel num_threads(threads)
    {
      touch(gq, G * N * D);
      touch(gk, G * M * D);
      touch(gv, G * M * D);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < G * qparts; i++) {
        int64_t h, n0, n1;
        item_range(i, qparts, N, &h, &n0, &n1);
        f->grad_query(g + h * N * D, q + h * N * D, rq + h * N, den + h * N, s.tr1 + h * D * D,
                      state + h * size + (D + 1) * D, n0, n1, s.partial + i * size, gq + h * N * D);
      }
#pragma omp single
      {
        reduce_parts(s.partial, G, qparts, D + 2, D, 1.0f, s.sum);
        transpose_blocks(s.sum, G, D + 2, D, s.tr2); /* dS^T: grad_state changes only the two rows after dS */
        grad_state(s.sum, state, count, G, D);
      }
#pragma omp for schedule(static)
      for (int64_t i = 0; i < G * kparts; i++) {
        int64_t h, n0, n1;
        item_range(i, kparts, M, &h, &n0, &n1);
        f->grad_key(k + h * M * D, v + h * M * D, keep ? keep + h * M : NULL, rk + h * M, s.sum + h * size,
                    s.tr2 + h * D * D, n0, n1, gk + h * M * D, gv + h * M * D);
      }
    }
  }
  scratch_free(&s);
  return ok ? 0 : -1;
}
