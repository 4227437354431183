/* Fused CPU kernel for the causal forms of the linear ops at short lengths (the text tower's 77 tokens).

   Each call takes the op's description (ops/op.py) as two flags, unit and normalised. On one head's [N, D] rows,
   with phi(q), phi(k) the features and padded keys (keep_n = 0) left out:
     not normalised (Gerami et al. 2026, Eq. 7):  o_i = sum_{n <= i} w_in v_n,          w_in = (1 + q^_i.k^_n) / 2
     normalised, unit features:                   o_i = sum_{n <= i} w_in v_n / den_i,  w_in = 1 + q^_i.k^_n
     normalised, elu features:                    o_i = sum_{n <= i} w_in v_n / den_i,  w_in = phi(q_i).phi(k_n)
     raw features (neither unit nor normalised):  o_i = sum_{n <= i} w_in v_n,          w_in = (q_i e_i).(k_n / e_n)
   with den_i = sum_{n <= i} w_in and q^ = q / |q|, phi(x) = elu(x) + 1. Without unit features q and k arrive as
   phi(q), phi(k) and the gradients leave as dL/dphi: ops/causal_cpu.py applies elu + 1 and its derivative in PyTorch, whose
   exponential is vectorised. This is ops/causal.py's quadratic form (the same math in PyTorch ops, and its
   definitions of the corner cases: |x| clamped at 1e-12, 1 / den = 0 where den <= 0), computed R = 4 rows at a
   time over the lower triangle only, so the N x N weights are never stored: a dozen PyTorch ops each way cost more
   than the O(N^2 D) work at N = 77. Keys and values are transposed once per head, so a tile's scores are products
   along the keys in registers, with no horizontal reductions and no store-to-load chains (perf showed both
   dominating a first version built on dot products); each key's or value's row loaded serves the tile's 4 rows
   (row by row, forward + backward took 21% longer at N = 77 on a 2-core AVX2 EPYC). One OpenMP region per call, heads split over threads;
   ops/causal_cpu.py calls it for N up to causal.QUADRATIC_MAX and tests compare it with the fp64 reference.
   Raw features are the decay families' one-chunk causal form (decay.py, gated.py, delta.py): e = e^(b), b the
   cumulative log decay, per token [G, N, 1] or per token and feature [G, N, D] (E = 1 or D), or NULL for 1; the
   kernel scales q and k itself and returns dL/de, so the decay costs the caller no PyTorch ops but b's exp.
   Shapes: q, k, v, o [G, N, D] fp32, keep [G, N] or NULL, e [G, N, E] or NULL, D in {16, 32, 64, 128}.
   At the end of the file, on the same tiles: deltanet's one chunk (delta_forward, delta_backward; delta.py). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

INLINE float dot(const float *x, const float *y, const int D) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int d = 0; d < D; d++) s += x[d] * y[d];
  return s;
}

INLINE void axpy(float a, const float *x, float *y, const int D) {
#pragma omp simd
  for (int d = 0; d < D; d++) y[d] += a * x[d];
}

/* 1 / max(|x_n|, 1e-12) of N rows, times keep_n when given (unit features only). */
INLINE void scales(const float *x, const float *keep, int64_t N, float *r, const int D) {
  for (int64_t n = 0; n < N; n++) r[n] = (keep ? keep[n] : 1.f) / fmaxf(sqrtf(dot(x + n * D, x + n * D, D)), 1e-12f);
}

/* phi(x) of N rows into f [N, D]: x r (unit features) or x keep (elu: x is phi already). */
INLINE void features(const float *x, const float *keep, const float *r, int64_t N, int unit, float *f, const int D) {
  for (int64_t n = 0; n < N; n++) {
    const float *xn = x + n * D;
    float *fn = f + n * D;
    const float kn = unit ? r[n] : (keep ? keep[n] : 1.f);
#pragma omp simd
    for (int d = 0; d < D; d++) fn[d] = xn[d] * kn;
  }
}

/* Raw features f = x e (queries) or keep x / e (keys; keep NULL: 1) of N rows. */
INLINE void raw_features(const float *x, const float *e, const float *keep, int64_t E, int64_t N, int keys, float *f,
                         const int D) {
  for (int64_t n = 0; n < N; n++) {
    const float *xn = x + n * D, *en = e + n * E, kn = keys && keep ? keep[n] : 1.f;
    float *fn = f + n * D;
    if (E == 1) {
      const float c = keys ? kn / en[0] : en[0];
#pragma omp simd
      for (int d = 0; d < D; d++) fn[d] = xn[d] * c;
    } else if (keys) {
#pragma omp simd
      for (int d = 0; d < D; d++) fn[d] = kn * xn[d] / en[d];
    } else {
#pragma omp simd
      for (int d = 0; d < D; d++) fn[d] = xn[d] * en[d];
    }
  }
}

/* dL/dx and dL/de (added into ge) of raw features from gf = dL/df, f = x e (queries) or keep x / e (keys): dL/dx =
   gf e or keep gf / e, dL/de = gf x or -gf f / e, summed over the features when E = 1. */
INLINE void raw_grads(const float *x, const float *f, const float *e, const float *keep, int64_t E, int64_t N,
                      int keys, const float *gf, float *gx, float *ge, const int D) {
  for (int64_t n = 0; n < N; n++) {
    const float *xn = x + n * D, *fn = f + n * D, *gn = gf + n * D, *en = e + n * E;
    const float kn = keys && keep ? keep[n] : 1.f;
    float *out = gx + n * D, *gen = ge + n * E, sum = 0.f;
    if (E == 1 && keys) {
      const float c = 1.f / en[0];
#pragma omp simd reduction(+ : sum)
      for (int d = 0; d < D; d++) {
        out[d] = kn * gn[d] * c;
        sum += gn[d] * fn[d];
      }
      gen[0] -= sum * c;
    } else if (E == 1) {
#pragma omp simd reduction(+ : sum)
      for (int d = 0; d < D; d++) {
        out[d] = gn[d] * en[0];
        sum += gn[d] * xn[d];
      }
      gen[0] += sum;
    } else if (keys) {
#pragma omp simd
      for (int d = 0; d < D; d++) {
        const float c = 1.f / en[d];
        out[d] = kn * gn[d] * c;
        gen[d] -= gn[d] * fn[d] * c;
      }
    } else {
#pragma omp simd
      for (int d = 0; d < D; d++) {
        out[d] = gn[d] * en[d];
        gen[d] += gn[d] * xn[d];
      }
    }
  }
}

/* The transpose xt [D, P] of x [N, D], P = N rounded up to 16, the padding columns zero. */
INLINE void transpose(const float *x, int64_t N, int64_t P, float *xt, const int D) {
  for (int d = 0; d < D; d++) {
    for (int64_t n = 0; n < N; n++) xt[d * P + n] = x[n * D + d];
    for (int64_t n = N; n < P; n++) xt[d * P + n] = 0.f;
  }
}

/* s_n = x . (yt[:, n] - b) (b NULL: 0) for n < m rounded up to 16: yt [D, P] holds the rows as columns. Blocks of
   16 columns with four partial sums in registers (no reductions, no store-to-load chains through s). */
INLINE void row_times(const float *x, const float *yt, const float *b, int64_t P, int64_t m, float *s, const int D) {
  for (int64_t n0 = 0; n0 < m; n0 += 16) {
    float acc[4][16] = {{0.f}};
    for (int d = 0; d < D; d += 4)
      for (int u = 0; u < 4; u++) {
        const float a = x[d + u], c = b ? b[d + u] : 0.f, *y = yt + (d + u) * P + n0;
#pragma omp simd
        for (int j = 0; j < 16; j++) acc[u][j] += a * (y[j] - c);
      }
#pragma omp simd
    for (int j = 0; j < 16; j++) s[n0 + j] = (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j]);
  }
}

/* y = sum_{n < m} w_n x_n for rows x [m, D], 64 columns at a time accumulated in registers and stored once. */
INLINE void rows_times(const float *w, const float *x, int64_t m, float *y, const int D) {
  const int W = D < 64 ? D : 64;
  for (int d0 = 0; d0 < D; d0 += W) {
    float acc[W];
#pragma omp simd
    for (int j = 0; j < W; j++) acc[j] = 0.f;
    for (int64_t n = 0; n < m; n++) {
      const float a = w[n], *xn = x + n * D + d0;
#pragma omp simd
      for (int j = 0; j < W; j++) acc[j] += a * xn[j];
    }
#pragma omp simd
    for (int j = 0; j < W; j++) y[d0 + j] = acc[j];
  }
}

/* Register tiles of R query rows (keys in the column pass): each key's or value's row loaded once serves R rows,
   where row-by-row products load it once per row (matrix-vector products at 77 tokens ran at a fraction of the
   FMA rate). VW columns per accumulator row: 16 floats (two AVX2 registers, R x 16 = 8 of the 16) or 32 with
   AVX-512 (two of its 32). */
#define R 4
#ifdef __AVX512F__
#define VW 32
#else
#define VW 16
#endif

/* s[r P + n] = x_r . (yt[:, n] - b_r) (b NULL: 0) for the R rows x_r = x + r D and n < m rounded up to 16. */
INLINE void tile_times(const float *x, const float *yt, const float *b, int64_t P, int64_t m, float *s, const int D) {
  for (int64_t n0 = 0; n0 < m; n0 += 16) {
    float acc[R][16] = {{0.f}};
    for (int d = 0; d < D; d++) {
      const float *y = yt + d * P + n0;
      for (int r = 0; r < R; r++) {
        const float a = x[r * D + d], c = b ? b[r * D + d] : 0.f;
#pragma omp simd
        for (int j = 0; j < 16; j++) acc[r][j] += a * (y[j] - c);
      }
    }
    for (int r = 0; r < R; r++)
#pragma omp simd
      for (int j = 0; j < 16; j++) s[r * P + n0 + j] = acc[r][j];
  }
}

/* y_r = sum_{n < m} w[r P + n] x_n for R rows, x [m, D], y [R, D]: VW columns at a time in registers, stored once. */
INLINE void tile_rows_times(const float *w, int64_t P, const float *x, int64_t m, float *y, const int D) {
  const int W = D < VW ? D : VW;
  for (int d0 = 0; d0 < D; d0 += W) {
    float acc[R][VW] = {{0.f}};
    for (int64_t n = 0; n < m; n++) {
      const float *xn = x + n * D + d0;
      for (int r = 0; r < R; r++) {
        const float a = w[r * P + n];
#pragma omp simd
        for (int j = 0; j < W; j++) acc[r][j] += a * xn[j];
      }
    }
    for (int r = 0; r < R; r++)
#pragma omp simd
      for (int j = 0; j < W; j++) y[r * D + d0 + j] = acc[r][j];
  }
}

/* The R rows of x [N, D] from row i0: x itself, or where fewer than R are left a copy in pad, zero-filled. */
INLINE const float *tile_rows(const float *x, int64_t i0, int64_t N, float *pad, const int D) {
  if (i0 + R <= N) return x + i0 * D;
  memset(pad, 0, R * D * sizeof(float));
  memcpy(pad, x + i0 * D, (N - i0) * D * sizeof(float));
  return pad;
}

/* sum_{i >= n} x[i P + n] y_i for the R columns n0.. of the lower triangle of x [N, P] (strict: i > n), into
   out [N, D] rows n0..: R columns gathered, then one register tile. */
INLINE void column_times(const float *x, const float *y, int64_t N, int64_t P, int64_t n0, int strict, float *col,
                         float *tile, float *out, const int D) {
  for (int64_t i = n0; i < N; i++)
    for (int r = 0; r < R; r++) {
      const int64_t n = n0 + r;
      col[r * P + i - n0] = n < N && (strict ? i > n : i >= n) ? x[i * P + n] : 0.f;
    }
  tile_rows_times(col, P, y + n0 * D, N - n0, tile, D);
  for (int r = 0; r < R && n0 + r < N; r++) memcpy(out + (n0 + r) * D, tile + r * D, D * sizeof(float));
}

/* w_in = c (1 + s) keep_n with unit features, c s without (elu's phi(k) is zero for padding), c = 1/2 for Eq. 7
   (unit, not normalised), else 1, for n < m, in place. */
INLINE float half_of(int unit, int normalised) { return unit && !normalised ? 0.5f : 1.f; }

INLINE void weights(float *s, const float *keep, int64_t m, int unit, int normalised) {
  if (!unit) return;
  const float c = half_of(unit, normalised), one = 1.f;
#pragma omp simd
  for (int64_t n = 0; n < m; n++) s[n] = c * (one + s[n]) * (keep && unit ? keep[n] : 1.f);
}

INLINE void head_forward(const float *q, const float *k, const float *v, const float *keep, const float *e, int64_t E,
                         int64_t N, int unit, int normalised, float scale, float *o, float *rq, float *rk,
                         float *inv_den, float *s, const int D) {
  const int64_t P = (N + 15) / 16 * 16;
  float *qf = s, *kf = s + N * D, *kft = s + 2 * N * D, *w = kft + D * P, *pad = w + R * P, *ot = pad + R * D;
  if (unit) {
    scales(q, NULL, N, rq, D);
    scales(k, keep, N, rk, D);
  }
  if (e) {
    raw_features(q, e, NULL, E, N, 0, qf, D);
    raw_features(k, e, keep, E, N, 1, kf, D);
  } else {
    features(q, NULL, rq, N, unit, qf, D);
    features(k, keep, rk, N, unit, kf, D);
  }
  transpose(kf, N, P, kft, D);
  for (int64_t i0 = 0; i0 < N; i0 += R) { /* R query rows at a time over the keys n < m of the last */
    const int64_t m = i0 + R < N ? i0 + R : N;
    float inv[R];
    tile_times(tile_rows(qf, i0, N, pad, D), kft, NULL, P, m, w, D);
    for (int r = 0; r < R; r++) {
      const int64_t i = i0 + r;
      float *wr = w + r * P, den = 0.f;
      if (i >= N) {
        memset(wr, 0, m * sizeof(float));
        continue;
      }
      weights(wr, keep, i + 1, unit, normalised);
      for (int64_t n = i + 1; n < m; n++) wr[n] = 0.f; /* causal inside the tile */
      for (int64_t n = 0; n <= i; n++) den += wr[n];
      inv[r] = den > 0.f ? 1.f / den : 0.f; /* no real key yet (padding, never used): o = 0 */
      if (normalised) inv_den[i] = inv[r];
    }
    tile_rows_times(w, P, v, m, ot, D);
    for (int r = 0; r < R && i0 + r < N; r++) {
      const float c = normalised ? inv[r] : scale;
      float *oi = o + (i0 + r) * D;
#pragma omp simd
      for (int d = 0; d < D; d++) oi[d] = ot[r * D + d] * c;
    }
  }
}

/* dL/dx from dL/dphi(x) in gf: unit features remove the radial part and scale by r; elu's are dL/dphi(x) times
   keep (its caller applies elu's derivative). */
INLINE void feature_grads(const float *f, const float *r, int64_t N, int unit, const float *gf, float *gx,
                          const int D) {
  for (int64_t n = 0; n < N; n++) {
    const float *fn = f + n * D, *gn = gf + n * D;
    float *out = gx + n * D;
    if (!unit) {
      for (int d = 0; d < D; d++) out[d] = gn[d] * (r ? r[n] : 1.f);
    } else {
      const float radial = dot(fn, gn, D), rn = r[n];
      for (int d = 0; d < D; d++) out[d] = (gn[d] - radial * fn[d]) * rn;
    }
  }
}

/* dL/dw_in = g_i . v_n (not normalised) or g_i . (v_n - o_i) / den_i; dL/ds = dL/dw_in dw/ds. g_i . (v_n - o_i) rather
   than g_i . v_n - g_i . o_i: exactly zero where o_i = v_n (a single key gets no gradient). Two passes: row by row
   (queries) the weights w_in / den_i and dL/ds_in into [N, P] scratch and dL/dq_i; then column by column (keys)
   dL/dk_n = sum_{i >= n} dL/ds_in q_i and dL/dv_n = sum_{i >= n} (w_in / den_i) g_i, each accumulated in registers and
   stored once (adding into every key's row once per later query cost three times the forward). */
INLINE void head_backward(const float *g, const float *q, const float *k, const float *v, const float *keep,
                          const float *e, int64_t E, const float *rq, const float *rk, const float *inv_den,
                          const float *o, int64_t N, int unit, int normalised, float scale, float *gq, float *gk,
                          float *gv, float *ge, float *s, const int D) {
  const int64_t P = (N + 15) / 16 * 16, NR = (N + R - 1) / R * R;
  float *qf = s, *kf = s + N * D, *gkf = s + 2 * N * D, *kft = s + 3 * N * D, *vt = kft + D * P, *pad = vt + D * P;
  float *gpad = pad + R * D, *opad = gpad + R * D, *tile = opad + R * D, *ws = tile + R * D, *gws = ws + NR * P;
  float *col = gws + NR * P;
  if (e) {
    raw_features(q, e, NULL, E, N, 0, qf, D);
    raw_features(k, e, keep, E, N, 1, kf, D);
    memset(ge, 0, N * E * sizeof(float));
  } else {
    features(q, NULL, rq, N, unit, qf, D); /* from the forward's scales */
    features(k, keep, rk, N, unit, kf, D);
  }
  transpose(kf, N, P, kft, D);
  transpose(v, N, P, vt, D);
  const float c = half_of(unit, normalised);
  for (int64_t i0 = 0; i0 < N; i0 += R) { /* queries, R rows at a time */
    const int64_t m = i0 + R < N ? i0 + R : N;
    float *w = ws + i0 * P, *gw = gws + i0 * P;
    tile_times(tile_rows(qf, i0, N, pad, D), kft, NULL, P, m, w, D);
    tile_times(tile_rows(g, i0, N, gpad, D), vt, normalised ? tile_rows(o, i0, N, opad, D) : NULL, P, m, gw, D);
    for (int r = 0; r < R; r++) {
      const int64_t i = i0 + r;
      float *wr = w + r * P, *gr = gw + r * P;
      const int64_t last = i < N ? i : -1;
      if (i < N) weights(wr, keep, i + 1, unit, normalised);
      const float inv = normalised && i < N ? inv_den[i] : scale;
#pragma omp simd
      for (int64_t n = 0; n <= last; n++) {
        gr[n] *= inv * (unit ? c * (keep ? keep[n] : 1.f) : c);
        wr[n] *= inv;
      }
      for (int64_t n = last + 1; n < m; n++) wr[n] = gr[n] = 0.f; /* causal inside the tile */
    }
    tile_rows_times(gw, P, kf, m, tile, D);
    for (int r = 0; r < R && i0 + r < N; r++) {
      const int64_t i = i0 + r;
      if (e) raw_grads(q + i * D, qf + i * D, e + i * E, NULL, E, 1, 0, tile + r * D, gq + i * D, ge + i * E, D);
      else feature_grads(qf + i * D, unit ? rq + i : NULL, 1, unit, tile + r * D, gq + i * D, D);
    }
  }
  for (int64_t n0 = 0; n0 < N; n0 += R) { /* keys, R at a time: the queries i >= n of their columns */
    column_times(gws, qf, N, P, n0, 0, col, tile, gkf, D);
    column_times(ws, g, N, P, n0, 0, col, tile, gv, D);
  }
  if (e) raw_grads(k, kf, e, keep, E, N, 1, gkf, gk, ge, D);
  else feature_grads(kf, unit ? rk : keep, N, unit, gkf, gk, D);
}

#define HEAD_DIM_OK(D) ((D) == 16 || (D) == 32 || (D) == 64 || (D) == 128)

/* Heads split over threads, each with its own scratch of `rows` [N, D] blocks and `square` [N, N] blocks; 1 when it
   cannot be allocated. */
#define FOR_EACH_HEAD(rows, square, call)                                                                      \
  int status = 0;                                                                                              \
  _Pragma("omp parallel num_threads(threads) reduction(| : status)") {                                         \
    size_t floats = (size_t)(rows) * (N + 16) * D + (size_t)(square) * (N + 16) * (N + 16) + 3 * (N + 16) + D; \
    float *s = malloc(floats * sizeof(float));                                                                 \
    if (!s) status = 1;                                                                                        \
    else {                                                                                                     \
      _Pragma("omp for schedule(static)") for (int64_t h = 0; h < G; h++) switch (D) {                         \
          case 16: call(16); break;                                                                            \
          case 32: call(32); break;                                                                            \
          case 64: call(64); break;                                                                            \
          default: call(128); break;                                                                           \
        }                                                                                                      \
    }                                                                                                          \
    free(s);                                                                                                   \
  }                                                                                                            \
  return status;

int causal_forward(const float *q, const float *k, const float *v, const float *keep, const float *e, int64_t E,
                   int64_t G, int64_t N, int64_t D, int unit, int normalised, float *o, float *rq, float *rk,
                   float *inv_den, int threads) {
  if (!HEAD_DIM_OK(D)) return 2;
#define FORWARD(d)                                                                                        \
  head_forward(q + h * N * d, k + h * N * d, v + h * N * d, keep ? keep + h * N : NULL, e ? e + h * N * E : NULL, \
               E, N, unit, normalised, 1.f, o + h * N * d, rq + h * N, rk + h * N, inv_den + h * N, s, d)
  FOR_EACH_HEAD(4, 0, FORWARD)
}

int causal_backward(const float *g, const float *q, const float *k, const float *v, const float *keep,
                    const float *e, int64_t E, const float *rq, const float *rk, const float *inv_den, const float *o,
                    int64_t G, int64_t N, int64_t D, int unit, int normalised, float *gq, float *gk, float *gv,
                    float *ge, int threads) {
  if (!HEAD_DIM_OK(D)) return 2;
#define BACKWARD(d)                                                                                         \
  head_backward(g + h * N * d, q + h * N * d, k + h * N * d, v + h * N * d, keep ? keep + h * N : NULL,          \
                e ? e + h * N * E : NULL, E, rq + h * N, rk + h * N, inv_den + h * N, o ? o + h * N * d : NULL, N, \
                unit, normalised, 1.f, gq + h * N * d, gk + h * N * d, gv + h * N * d, ge ? ge + h * N * E : NULL, s, \
                d)
  FOR_EACH_HEAD(6, 2, BACKWARD)
}

/* DeltaNet's one chunk (models/attention/delta.py's Whole, the text tower's call) on one head, from normalised q^, k^:
     u_i = beta_i (v_i - sum_{j < i} (k^_i . k^_j) u_j)      (the triangular system, forward substitution)
     o_i = sum_{j <= i} (q^_i . k^_j) u_j
   The forward saves u; the backward (delta.py's docstring): du_j = sum_{i >= j} p_ij g_i with p_ij = q^_i . k^_j;
   dp_ij = g_i . u_j; gv_j = du_j - sum_{i > j} s_ij beta_i gv_i (back substitution, s_ij = k^_i . k^_j);
   dA_ij = -gv_i . u_j (j < i); dbeta_i = gv_i . v_i + sum_{j < i} dA_ij s_ij; dk^ gains sum_j (dA_ij beta_i +
   dA_ji beta_j) k^_j; dL/dv = beta gv; the normalisations' Jacobians last. Shapes: q, k, v, u, o [G, N, D], beta [G, N]. */
INLINE void delta_head_forward(const float *q, const float *k, const float *v, const float *beta, int64_t N, float *o,
                               float *u, float *rq, float *rk, float *s, const int D) {
  const int64_t P = (N + 15) / 16 * 16;
  float *qn = s, *kn = s + N * D, *knt = s + 2 * N * D, *w = knt + D * P, *pad = w + R * P, *t = pad + R * D;
  scales(q, NULL, N, rq, D);
  scales(k, NULL, N, rk, D);
  features(q, NULL, rq, N, 1, qn, D);
  features(k, NULL, rk, N, 1, kn, D);
  transpose(kn, N, P, knt, D);
  for (int64_t i0 = 0; i0 < N; i0 += R) { /* u: earlier tiles' rows in registers, then the tile's own in order */
    const int64_t m = i0 + R < N ? i0 + R : N;
    tile_times(tile_rows(kn, i0, N, pad, D), knt, NULL, P, m, w, D);
    tile_rows_times(w, P, u, i0, t, D);
    for (int64_t i = i0; i < m; i++) {
      const float *wi = w + (i - i0) * P;
      float *ui = u + i * D, *ti = t + (i - i0) * D;
      for (int64_t j = i0; j < i; j++) axpy(wi[j], u + j * D, ti, D);
#pragma omp simd
      for (int d = 0; d < D; d++) ui[d] = beta[i] * (v[i * D + d] - ti[d]);
    }
  }
  for (int64_t i0 = 0; i0 < N; i0 += R) { /* o = tril(Q^ K^T) U */
    const int64_t m = i0 + R < N ? i0 + R : N;
    tile_times(tile_rows(qn, i0, N, pad, D), knt, NULL, P, m, w, D);
    for (int r = 0; r < R; r++)
      for (int64_t n = i0 + r + 1; n < m; n++) w[r * P + n] = 0.f;
    tile_rows_times(w, P, u, m, t, D);
    for (int r = 0; r < R && i0 + r < N; r++) memcpy(o + (i0 + r) * D, t + r * D, D * sizeof(float));
  }
}

INLINE void delta_head_backward(const float *g, const float *q, const float *k, const float *v, const float *beta,
                                const float *rq, const float *rk, const float *u, int64_t N, float *gq, float *gk,
                                float *gv, float *gbeta, float *s, const int D) {
  const int64_t P = (N + 15) / 16 * 16;
  float *qn = s, *kn = qn + N * D, *knt = kn + N * D, *ut = knt + D * P, *dqn = ut + D * P, *dkn = dqn + N * D;
  float *du = dkn + N * D, *gs = du + N * D, *bg = gs + N * D, *tmp = bg + N * D, *tile = tmp + N * D;
  float *pad = tile + R * D, *col = pad + R * D, *ps = col + R * P, *dps = ps + (N + R) * P;
  float *ss = dps + (N + R) * P, *das = ss + (N + R) * P; /* rows up to N + R: whole tiles */
  features(q, NULL, rq, N, 1, qn, D);
  features(k, NULL, rk, N, 1, kn, D);
  transpose(kn, N, P, knt, D);
  transpose(u, N, P, ut, D);
  for (int64_t i0 = 0; i0 < N; i0 += R) { /* p_i. and dp_i. (n <= i); dq^_i = sum_n dp_in k^_n; s_i. for every n */
    const int64_t m = i0 + R < N ? i0 + R : N;
    float *p = ps + i0 * P, *dp = dps + i0 * P;
    tile_times(tile_rows(qn, i0, N, pad, D), knt, NULL, P, m, p, D);
    tile_times(tile_rows(g, i0, N, pad, D), ut, NULL, P, m, dp, D);
    tile_times(tile_rows(kn, i0, N, pad, D), knt, NULL, P, N, ss + i0 * P, D);
    for (int r = 0; r < R; r++)
      for (int64_t n = i0 + r + 1; n < m; n++) dp[r * P + n] = 0.f;
    tile_rows_times(dp, P, kn, m, tile, D);
    for (int r = 0; r < R && i0 + r < N; r++) memcpy(dqn + (i0 + r) * D, tile + r * D, D * sizeof(float));
  }
  for (int64_t n0 = 0; n0 < N; n0 += R) { /* du_n = sum_{i >= n} p_in g_i; dk^_n = sum_{i >= n} dp_in q^_i */
    column_times(ps, g, N, P, n0, 0, col, tile, du, D);
    column_times(dps, qn, N, P, n0, 0, col, tile, dkn, D);
  }
  for (int64_t j1 = N; j1 > 0; j1 -= R) { /* back substitution, tiles of rows j0..j1 - 1 from the end: gv_j = du_j
                                              - sum_{i > j} s_ji beta_i gv_i, later tiles' rows in registers first */
    const int64_t j0 = j1 - R > 0 ? j1 - R : 0;
    tile_rows_times(ss + j0 * P + j1, P, bg + j1 * D, N - j1, tile, D);
    for (int64_t j = j1 - 1; j >= j0; j--) {
      float *gj = gs + j * D, *bj = bg + j * D, *tj = tile + (j - j0) * D;
      for (int64_t i = j + 1; i < j1; i++) axpy(ss[j * P + i], bg + i * D, tj, D);
#pragma omp simd
      for (int d = 0; d < D; d++) {
        gj[d] = du[j * D + d] - tj[d];
        bj[d] = beta[j] * gj[d];
        gv[j * D + d] = bj[d];
      }
    }
  }
  for (int64_t i0 = 0; i0 < N; i0 += R) { /* dA_ij = -gv_i . u_j (j < i); dbeta_i; dsk_ij = dA_ij beta_i into das */
    const int64_t m = i0 + R < N ? i0 + R : N;
    float *da = das + i0 * P;
    tile_times(tile_rows(gs, i0, N, pad, D), ut, NULL, P, m, da, D);
    for (int r = 0; r < R; r++) {
      const int64_t i = i0 + r;
      float *di = da + r * P, acc = i < N ? dot(gs + i * D, v + i * D, D) : 0.f;
      for (int64_t j = 0; j < i && j < m; j++) {
        di[j] = -di[j];
        acc += di[j] * ss[i * P + j];
        di[j] *= beta[i];
      }
      for (int64_t j = i; j < m; j++) di[j] = 0.f;
      if (i < N) gbeta[i] = acc;
    }
    tile_rows_times(da, P, kn, m, tile, D); /* sum_{j < i} dsk_ij k^_j */
    for (int r = 0; r < R && i0 + r < N; r++) axpy(1.f, tile + r * D, dkn + (i0 + r) * D, D);
  }
  for (int64_t n0 = 0; n0 < N; n0 += R) { /* sum_{i > n} dsk_in k^_i */
    column_times(das, kn, N, P, n0, 1, col, tile, tmp, D);
    for (int64_t n = n0; n < N && n < n0 + R; n++) axpy(1.f, tmp + n * D, dkn + n * D, D);
  }
  feature_grads(qn, rq, N, 1, dqn, gq, D);
  feature_grads(kn, rk, N, 1, dkn, gk, D);
}

/* Gates read where the layer's projection wrote them (the decay families' log decays, deltanet's beta logits):
   x [B, N, H E] token-major, all heads of a token side by side as F.linear leaves them; head i = (b, h) = (i / H,
   i % H) starts at x + b N H E + h E, and H E floats lie between one token's values and the next. H = 1 reads x as
   [G, N, E]. So the caller's transpose to heads, its copy and the gates' elementwise ops with their backward are
   none. keep [B, N] (B = G / H) or NULL. */
INLINE const float *head_gates(const float *x, int64_t i, int64_t H, int64_t N, int64_t E) {
  return x + (i / H) * N * H * E + (i % H) * E;
}

/* exp_neg: e^x for -87 <= x <= 0 (smaller x clamped), the range reduction x = n log 2 + r, |r| <= log(2) / 2, and a
   degree-7 polynomial for e^r (Taylor; relative error under 3e-7 there), 2^n through the exponent bits; a plain loop
   of it vectorises (with -fno-trapping-math: the clamp's select), where libm's expf is one call per element. */
INLINE float exp_neg(float x) {
  x = x < -87.f ? -87.f : x;
  const float n = nearbyintf(x * 1.44269504f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  union {
    int32_t i;
    float f;
  } scale = {.i = ((int32_t)n + 127) << 23};
  return p * scale.f;
}

/* log(1 + t) for 0 <= t <= 1: 2 atanh(s), s = t / (2 + t) in [0, 1/3], its odd series through s^13 (truncation
   under 1e-8 there); vectorises as exp_neg does. */
INLINE float log1p_unit(float t) {
  const float s = t / (2.f + t), s2 = s * s;
  float p = 1.f / 13.f;
  p = p * s2 + 1.f / 11.f;
  p = p * s2 + 1.f / 9.f;
  p = p * s2 + 1.f / 7.f;
  p = p * s2 + 1.f / 5.f;
  p = p * s2 + 1.f / 3.f;
  p = p * s2 + 1.f;
  return 2.f * s * p;
}

/* log sigmoid(y) = min(y, 0) - log(1 + e^-|y|), and sigmoid(-y) (its derivative), each from one exponential. */
INLINE float log_sigmoid(float y) { return (y < 0.f ? y : 0.f) - log1p_unit(exp_neg(-fabsf(y))); }

INLINE float sigmoid_neg(float y) {
  const float t = exp_neg(-fabsf(y));
  return (y < 0.f ? 1.f : t) / (1.f + t);
}

/* deltanet's beta [N] = sigmoid(x) of one head's logits (H floats from one token's to the next). */
INLINE void betas(const float *x, int64_t H, int64_t N, float *beta) {
#pragma omp simd
  for (int64_t n = 0; n < N; n++) beta[n] = sigmoid_neg(-x[n * H]);
}

int delta_forward(const float *q, const float *k, const float *v, const float *x, int64_t H, int64_t G, int64_t N,
                  int64_t D, float *o, float *u, float *rq, float *rk, int threads) {
  if (!HEAD_DIM_OK(D)) return 2;
#define DELTA_FORWARD(d)                                                                                    \
  betas(head_gates(x, h, H, N, 1), H, N, s);                                                                \
  delta_head_forward(q + h * N * d, k + h * N * d, v + h * N * d, s, N, o + h * N * d, u + h * N * d, rq + h * N, \
                     rk + h * N, s + (N + 16) * d, d)
  FOR_EACH_HEAD(5, 0, DELTA_FORWARD)
}

/* The backward's dL/dbeta into scratch, then dL/dx = dL/dbeta beta (1 - beta) where x lies. */
int delta_backward(const float *g, const float *q, const float *k, const float *v, const float *x, const float *rq,
                   const float *rk, const float *u, int64_t H, int64_t G, int64_t N, int64_t D, float *gq, float *gk,
                   float *gv, float *gx, int threads) {
  if (!HEAD_DIM_OK(D)) return 2;
#define DELTA_BACKWARD(d)                                                                                            \
  do {                                                                                                               \
    float *gx_h = (float *)head_gates(gx, h, H, N, 1);                                                               \
    betas(head_gates(x, h, H, N, 1), H, N, s);                                                                       \
    delta_head_backward(g + h * N * d, q + h * N * d, k + h * N * d, v + h * N * d, s, rq + h * N, rk + h * N,        \
                        u + h * N * d, N, gq + h * N * d, gk + h * N * d, gv + h * N * d, s + N + 16,                 \
                        s + (N + 16) * d, d);                                                                        \
    for (int64_t n = 0; n < N; n++) gx_h[n * H] = s[N + 16 + n] * s[n] * (1.f - s[n]);                               \
  } while (0)
  FOR_EACH_HEAD(13, 6, DELTA_BACKWARD)
}

/* The decay families' one chunk (decay.py's retention, gated.py's ssd and gla) from their gates x: per head the log
   decays g [N, E] (E = 1: ssd, one per token; E = D: gla, one per token and key feature) are g = x (gate 0) or
   c log sigmoid(gate x) (gate +-1: ssd's -softplus(x) is gate -1, gla's log sigmoid(x) / 16 gate 1 with c = 1/16),
   zero for padded tokens (keep_n = 0: decay 1); b = cumsum_n g and e = e^b are computed here, q e and keep k / e are
   the raw features, the output is scaled by `scale` (1 / sqrt(D)). The forward also writes what the backward needs
   of the gates, e [G, N, E] and dg/dx (x's layout), so the backward has no exponential or logarithm to compute (NULL
   for both without a backward); the backward returns dL/dx = dL/dg dg/dx with dL/dg = sum_{m >= n} dL/db_m, dL/db
   = dL/de e. The factorised form needs e^-b far inside fp32: a head whose b falls below -limit leaves the forward
   with status 4 and its output unwritten (ops/causal_cpu.py's Steep; the caller takes its chunked form). */
INLINE int decay_factors(const float *x, const float *keep, int64_t HE, int gate, float c, float limit, int64_t N,
                         int64_t E, float *e, float *dg) {
  int steep = 0;
  for (int64_t n = 0; n < N; n++) {
    const float *xn = x + n * HE, kn = keep ? keep[n] : 1.f, sign = (float)gate;
    float *en = e + n * E, *dn = dg ? dg + n * HE : NULL;
    if (gate && dn) {
#pragma omp simd
      for (int64_t j = 0; j < E; j++) {
        const float y = sign * xn[j], t = exp_neg(-fabsf(y));
        en[j] = kn * c * ((y < 0.f ? y : 0.f) - log1p_unit(t));
        dn[j] = kn * c * sign * (y < 0.f ? 1.f : t) / (1.f + t);
      }
    } else if (gate) {
#pragma omp simd
      for (int64_t j = 0; j < E; j++) en[j] = kn * c * log_sigmoid(sign * xn[j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < E; j++) en[j] = kn * xn[j];
      if (dn)
        for (int64_t j = 0; j < E; j++) dn[j] = kn;
    }
    if (n > 0) {
#pragma omp simd
      for (int64_t j = 0; j < E; j++) en[j] += en[j - E];
    }
#pragma omp simd reduction(| : steep)
    for (int64_t j = 0; j < E; j++) steep |= en[j] < -limit;
  }
#pragma omp simd
  for (int64_t i = 0; i < N * E; i++) e[i] = exp_neg(e[i]);
  return steep;
}

/* dL/dx [N rows, HE floats apart] from ge = dL/de [N, E] (overwritten with dL/dg), e and dg/dx (x's layout). */
INLINE void gate_grads(float *ge, const float *e, const float *dg, int64_t HE, int64_t N, int64_t E, float *gx) {
  for (int64_t n = N - 1; n >= 0; n--) {
    const float *en = e + n * E, *dn = dg + n * HE;
    float *gn = ge + n * E, *out = gx + n * HE;
#pragma omp simd
    for (int64_t j = 0; j < E; j++) gn[j] *= en[j];
    if (n < N - 1) {
#pragma omp simd
      for (int64_t j = 0; j < E; j++) gn[j] += gn[j + E];
    }
#pragma omp simd
    for (int64_t j = 0; j < E; j++) out[j] = dn[j] * gn[j];
  }
}

int decayed_forward(const float *q, const float *k, const float *v, const float *x, const float *keep, int64_t E,
                    int64_t H, int gate, float c, float scale, float limit, int64_t G, int64_t N, int64_t D, float *o,
                    float *e, float *dg, int threads) {
  if (!HEAD_DIM_OK(D)) return 2;
#define DECAYED_FORWARD(d)                                                                                           \
  do {                                                                                                               \
    const float *kp = keep ? keep + h / H * N : NULL;                                                                \
    float *eh = e ? e + h * N * E : s, *dh = dg ? (float *)head_gates(dg, h, H, N, E) : NULL;                         \
    if (decay_factors(head_gates(x, h, H, N, E), kp, H * E, gate, c, limit, N, E, eh, dh)) status |= 4;              \
    else head_forward(q + h * N * d, k + h * N * d, v + h * N * d, kp, eh, E, N, 0, 0, scale, o + h * N * d, NULL,    \
                      NULL, NULL, s + (N + 16) * d, d);                                                              \
  } while (0)
  FOR_EACH_HEAD(5, 0, DECAYED_FORWARD)
}

int decayed_backward(const float *grad, const float *q, const float *k, const float *v, const float *e,
                     const float *dg, const float *keep, int64_t E, int64_t H, float scale, int64_t G, int64_t N,
                     int64_t D, float *gq, float *gk, float *gv, float *gx, int threads) {
  if (!HEAD_DIM_OK(D)) return 2;
#define DECAYED_BACKWARD(d)                                                                                          \
  do {                                                                                                               \
    const float *kp = keep ? keep + h / H * N : NULL, *eh = e + h * N * E;                                           \
    head_backward(grad + h * N * d, q + h * N * d, k + h * N * d, v + h * N * d, kp, eh, E, NULL, NULL, NULL, NULL,   \
                  N, 0, 0, scale, gq + h * N * d, gk + h * N * d, gv + h * N * d, s, s + (N + 16) * d, d);           \
    gate_grads(s, eh, head_gates(dg, h, H, N, E), H * E, N, E, (float *)head_gates(gx, h, H, N, E));                  \
  } while (0)
  FOR_EACH_HEAD(7, 2, DECAYED_BACKWARD)
}
