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

/* The four passes on one row range [n0, n1) of one head of a call (head_of); acc is the range's own [D + 2, D]
   accumulator. Key pass: acc = [K^T V; sum keep v; z], rk = keep / |k|. */
INLINE void affine_key_pass(const call *hd, int64_t n0, int64_t n1, float *acc, const int nv) {
  const int D = 16 * nv;
  memset(acc, 0, (D + 2) * D * sizeof(float));
  scaled_gram(hd->k, hd->v, hd->keep, n0, n1, hd->rk, acc, acc + (D + 1) * D, nv);
}

/* state [D + 2, D] = [S; c; z]: rq = 1 / |q|, den = count + q^ . z, o = c + rq (q S) / den. */
INLINE void affine_query_pass(const call *hd, int64_t n0, int64_t n1, float *acc, const int nv) {
  const int D = 16 * nv;
  const float *q = hd->q, *state = hd->state, *z = state + (D + 1) * D, count = hd->count[0];
  float *rq = hd->rq, *den = hd->den, scale[TILE];
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
    all_rows_times(q + t0 * D, state, scale, NULL, state + D * D, NULL, hd->out + t0 * D, NULL, t, nv, AFFINE, 0);
  }
}

/* acc [D + 2, D] = [dS; sum g; dz] of one row range, and gq, from St = S^T and z. */
INLINE void affine_grad_query_pass(const call *hd, int64_t n0, int64_t n1, float *acc, const int nv) {
  const int D = 16 * nv;
  const float *rq = hd->rq, *den = hd->den, *z = hd->state + (D + 1) * D;
  float a[TILE * 128];
  memset(acc, 0, (D + 2) * D * sizeof(float));
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int t = (int)(n1 - t0 < TILE ? n1 - t0 : TILE);
    const float *qt = hd->q + t0 * D, *gt = hd->g + t0 * D;
    for (int n = 0; n < t; n++)
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) store(a + n * D + 16 * c, splat(rq[t0 + n] / den[t0 + n]) * load(qt + n * D + 16 * c));
    const int64_t next = n1 - t0 - t < TILE ? n1 - t0 - t : TILE;
    gram(a, NULL, gt, t, acc, nv, qt + t * D, gt + t * D, next);
    all_rows_times(gt, hd->St, rq + t0, den + t0, z, qt, hd->gq + t0 * D, acc + (D + 1) * D, t, nv, DENOMINATOR, 0);
  }
}

/* sum [D + 2, D] = [dS; dc / count; w], Ht = dS^T: gv = rk (k dS) + keep dc / count, gk through k^ of v dS^T + w. */
INLINE void affine_grad_key_pass(const call *hd, int64_t n0, int64_t n1, float *acc, const int nv) {
  const int D = 16 * nv;
  const float *k = hd->k, *keep = hd->keep, *rk = hd->rk, *half = hd->sum;
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int64_t t = n1 - t0 < TILE ? n1 - t0 : TILE;
    all_rows_times(k + t0 * D, half, rk + t0, keep ? keep + t0 : NULL, half + D * D, NULL, hd->gv + t0 * D, NULL, t, nv,
                   AFFINE, 0);
    all_rows_times(hd->v + t0 * D, hd->Ht, rk + t0, NULL, half + (D + 1) * D, k + t0 * D, hd->gk + t0 * D, NULL, t, nv,
                   RADIAL, 0);
  }
}

PASSES_FOR(affine)

/* Per head, from the summed [K^T V; sum keep v; z]: c = sum keep v / count, S = K^T V - z c^T, in place. */
static void centre(const call *x) {
  const int64_t D = x->D;
  for (int64_t h = 0; h < x->G; h++) {
    float *S = x->state + h * (D + 2) * D, *c = S + D * D, *z = c + D;
    const float count = x->count[h];
    for (int64_t e = 0; e < D; e++) c[e] = count > 0 ? c[e] / count : 0.0f; /* no real key: c = 0 */
    for (int64_t d = 0; d < D; d++)
      for (int64_t e = 0; e < D; e++) S[d * D + e] -= z[d] * c[e];
  }
}

/* Writes out [G, N, D], rq and den [G, N], rk [G, M] and state [G, D + 2, D] = [S; c; z]; count [G]. */
int affine_forward(const float *q, const float *k, const float *v, const float *keep, const float *count, int64_t G,
                   int64_t N, int64_t M, int64_t D, float *out, float *rq, float *rk, float *den, float *state,
                   int threads) {
  const call c = {.q = q, .k = k, .v = v, .keep = keep, .count = count, .out = out, .rq = rq, .rk = rk, .den = den,
                  .state = state, .G = G, .N = N, .M = M, .D = D, .rows = D + 2};
  return forward_passes(affine_for(D), &c, 1.0f, centre, threads);
}

/* Per head, from the summed [dS; sum g; dz]: sum becomes [dS; dc / count; w] (Ht = dS^T already). */
static void grad_state(const call *x) {
  const int64_t D = x->D;
  for (int64_t h = 0; h < x->G; h++) {
    float *dS = x->sum + h * (D + 2) * D, *dc = dS + D * D, *w = dc + D;
    const float *c = x->state + h * (D + 2) * D + D * D, *z = c + D, count = x->count[h];
    for (int64_t e = 0; e < D; e++) {
      float zdS = 0;
      for (int64_t d = 0; d < D; d++) zdS += z[d] * dS[d * D + e];
      dc[e] = count > 0 ? (dc[e] - zdS) / count : 0.0f;
    }
    for (int64_t d = 0; d < D; d++) {
      float dSc = 0;
      for (int64_t e = 0; e < D; e++) dSc += dS[d * D + e] * c[e];
      w[d] -= dSc;
    }
  }
}

/* Writes gq [G, N, D], gk and gv [G, M, D] from g [G, N, D] and affine_forward's rq, rk, den, state (the reduced
   query pass: [dS; sum g; dz], then [dS; dc / count; w]). */
int affine_backward(const float *g, const float *q, const float *k, const float *v, const float *keep,
                    const float *count, const float *rq, const float *rk, const float *den, const float *state,
                    int64_t G, int64_t N, int64_t M, int64_t D, float *gq, float *gk, float *gv, int threads) {
  const call c = {.g = g, .q = q, .k = k, .v = v, .keep = keep, .count = count, .rq = (float *)rq, .rk = (float *)rk,
                  .den = (float *)den, .state = (float *)state, .gq = gq, .gk = gk, .gv = gv, .G = G, .N = N, .M = M,
                  .D = D, .rows = D + 2};
  return backward_passes(affine_for(D), c, 1.0f, grad_state, threads);
}
