/* Shared pieces of the fused CPU kernels of the unit-feature linear attentions (nodenom_cpu.c,
   affine_cpu.c): vector helpers, row norms, the register-blocked micro-kernel and its two uses (rows
   times a D x D matrix with a fused epilogue, and the D x D gram of two row blocks), the split of
   [G, N, D] work into (head, row range) items for OpenMP, and the two OpenMP regions (forward_passes,
   backward_passes) that run an op's four passes over a call. D = 16 nv with nv in {1, 2, 4, 8}. */
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef float vf __attribute__((vector_size(64)));
#define INLINE static inline __attribute__((always_inline))
#define TILE 64  /* rows per gram tile: a scaled tile and its partner rows stay in L1 */
#define AHEAD 32 /* rows between a row's prefetch and its use (prefetches never fault, even past the end) */

INLINE vf load(const float *p) { vf x; memcpy(&x, p, sizeof x); return x; }
INLINE void store(float *p, vf x) { memcpy(p, &x, sizeof x); }
/* An output row written with a non-temporal store when nt (64-byte aligned p): a large output that nobody
   reads soon then skips the read-for-ownership of its cache lines. Measured on this 2-core VM: the same
   speed either way (compute, not bandwidth, limits two cores); it is for machines with less bandwidth per core. */
INLINE void put(float *p, vf x, const int nt) {
#ifdef __AVX512F__
  if (nt) { _mm512_stream_ps(p, (__m512)x); return; }
#endif
  store(p, x);
}
INLINE vf splat(float x) { return (vf){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
/* Lane shuffles of two 16-float vectors (indices 0-31): __builtin_shufflevector is clang's and GCC >= 12's,
   __builtin_shuffle GCC's since 4.7, so older compilers of cluster nodes (GCC 8-11) build this file too. */
#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int vi __attribute__((vector_size(64)));
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (vi){__VA_ARGS__})
#endif

INLINE float hsum(vf x) { /* a tree: the 16 lanes in 4 dependent adds, not 16 */
  x += SHUFFLE(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  x += SHUFFLE(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  x += SHUFFLE(x, x, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  return x[0] + x[1];
}

INLINE vf squares(const float *x, const int nv) { /* lane sums of x^2 over the nv vectors of a row */
  vf acc = {0};
#pragma GCC unroll 8
  for (int c = 0; c < nv; c++) { vf a = load(x + 16 * c); acc += a * a; }
  return acc;
}

/* 1 / max(|x|, 1e-12) of one row of D = 16 nv floats: the floor of F.normalize. */
INLINE float floor_at(float x) { return x > 1e-12f ? x : 1e-12f; } /* not fmaxf: a libm call unless -ffinite-math-only */
INLINE float inv_norm(const float *x, const int nv) { return 1.0f / floor_at(sqrtf(hsum(squares(x, nv)))); }

/* inv_norm of 16 consecutive rows at once, lane j for row j: the 16 lane sums are folded by a tree of
   shuffles (each step halves the partial sums per row and doubles the rows per vector), then one vector
   sqrt and divide; one row at a time, the horizontal sum, sqrt and divide cost more than the row's loads. */
INLINE vf inv_norms16(const float *x, const int nv) {
  const int D = 16 * nv;
  vf a[16], b[8], c[4], d[2];
#pragma GCC unroll 16
  for (int j = 0; j < 16; j++) a[j] = squares(x + j * D, nv);
#pragma GCC unroll 8
  for (int j = 0; j < 8; j++)
    b[j] = SHUFFLE(a[2 * j], a[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           SHUFFLE(a[2 * j], a[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++)
    c[j] = SHUFFLE(b[2 * j], b[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           SHUFFLE(b[2 * j], b[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
#pragma GCC unroll 2
  for (int j = 0; j < 2; j++)
    d[j] = SHUFFLE(c[2 * j], c[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           SHUFFLE(c[2 * j], c[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  const vf sum = SHUFFLE(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
                 SHUFFLE(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  vf norm;
  for (int j = 0; j < 16; j++) norm[j] = floor_at(sqrtf(sum[j])); /* vsqrtps, vmaxps: built with -fno-math-errno */
  return splat(1.0f) / norm;
}

/* inv_norm of rows [0, n) into r: 16 at a time, then one by one. */
INLINE void inv_norms(const float *x, const int64_t n, float *r, const int nv) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store(r + i, inv_norms16(x + i * 16 * nv, nv));
  for (; i < n; i++) r[i] = inv_norm(x + i * 16 * nv, nv);
}

/* The micro-kernel of every matmul here: acc [16 / nv, D] = sum_kk x[i * si + kk * sk] m[kk, :] for kk < K,
   16 accumulators in registers, one row of m loaded per kk and shared by all 16 / nv rows. */
INLINE void products(const float *x, const int64_t si, const int64_t sk, const float *m, const int K, vf acc[16],
                     const int nv) {
  const int D = 16 * nv, rows = 16 / nv;
#pragma GCC unroll 16
  for (int i = 0; i < 16; i++) acc[i] = (vf){0};
  for (int kk = 0; kk < K; kk++) {
    vf mv[8];
#pragma GCC unroll 8
    for (int c = 0; c < nv; c++) mv[c] = load(m + kk * D + 16 * c);
#pragma GCC unroll 16
    for (int i = 0; i < rows; i++) {
      const vf xs = splat(x[i * si + kk * sk]);
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) acc[i * nv + c] += xs * mv[c];
    }
  }
}

enum epilogue { AFFINE, RADIAL, DENOMINATOR };

/* rows [RB = 16 / nv of them] of X [., D] times M [D, D], then per row j:
   AFFINE: out_j = r_j acc_j + b_j bias               (b = keep or 1)
   RADIAL: out_j = r_j a - r_j^3 (y_j . a) y_j with a = acc_j [+ bias]: the gradient through y^ = r y, r = 1/|y|
   DENOMINATOR (affine_cpu.c's query gradient, b = den, bias = z): p = acc_j / b_j, a = p - (r_j y_j . p) / b_j z
   taken through y^ as in RADIAL, and dz += -(r_j y_j . p) / b_j r_j y_j. */
INLINE void rows_times(const float *x, const float *m, const float *r, const float *b, const float *bias,
                       const float *y, float *out, float *dz, const int nv, const enum epilogue mode, const int nt) {
  const int D = 16 * nv, RB = 16 / nv;
  vf acc[16];
  products(x, D, 1, m, D, acc, nv);
#pragma GCC unroll 16
  for (int j = 0; j < RB; j++) {
    const vf rj = splat(r[j]);
    if (mode == AFFINE) {
      const vf bj = splat(b ? b[j] : 1.0f);
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) put(out + j * D + 16 * c, rj * acc[j * nv + c] + bj * load(bias + 16 * c), nt);
      continue;
    }
    if (mode == DENOMINATOR) {
      const vf inv = splat(1.0f / b[j]);
      vf dot = {0};
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) { acc[j * nv + c] *= inv; dot += load(y + j * D + 16 * c) * acc[j * nv + c]; }
      const vf dden = splat(-r[j] * hsum(dot) / b[j]);
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) {
        acc[j * nv + c] += dden * load(bias + 16 * c);
        store(dz + 16 * c, load(dz + 16 * c) + dden * rj * load(y + j * D + 16 * c));
      }
    } else if (bias) {
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) acc[j * nv + c] += load(bias + 16 * c);
    }
    vf dot = {0};
#pragma GCC unroll 8
    for (int c = 0; c < nv; c++) dot += load(y + j * D + 16 * c) * acc[j * nv + c];
    const vf radial = splat(r[j] * r[j] * r[j] * hsum(dot));
#pragma GCC unroll 8
    for (int c = 0; c < nv; c++) put(out + j * D + 16 * c, rj * acc[j * nv + c] - radial * load(y + j * D + 16 * c), nt);
  }
}

/* rows_times over n rows: blocks of RB, the last partial block through zero-padded copies. */
INLINE void all_rows_times(const float *x, const float *m, const float *r, const float *b, const float *bias,
                           const float *y, float *out, float *dz, const int64_t n, const int nv, const enum epilogue mode,
                           const int nt) {
  const int D = 16 * nv, RB = 16 / nv;
  int64_t i = 0;
  for (; i + RB <= n; i += RB) {
    for (int l = 0; l < RB * nv; l++) { /* rows AHEAD further on: the hardware prefetcher alone lags at this compute rate */
      __builtin_prefetch(x + (i + AHEAD) * D + 16 * l);
      if (y) __builtin_prefetch(y + (i + AHEAD) * D + 16 * l);
    }
    rows_times(x + i * D, m, r + i, b ? b + i : NULL, bias, y ? y + i * D : NULL, out + i * D, dz, nv, mode, nt);
  }
  if (i == n) return;
  float xp[256] = {0}, yp[256] = {0}, op[256], rp[16] = {0}, bp[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  const int64_t left = n - i; /* padded rows: x = y = r = 0 and b = 1, so they add nothing to dz */
  memcpy(xp, x + i * D, left * D * sizeof(float));
  memcpy(rp, r + i, left * sizeof(float));
  if (b) memcpy(bp, b + i, left * sizeof(float));
  if (y) memcpy(yp, y + i * D, left * D * sizeof(float));
  rows_times(xp, m, rp, b ? bp : NULL, bias, yp, op, dz, nv, mode, 0);
  memcpy(out + i * D, op, left * D * sizeof(float));
}

/* acc [D + 1, D] += [a; b]^T y over t <= TILE rows: a [t, D] scaled rows, b [t] row weights (NULL: ones).
   next_x, next_y: the next tile's next_rows rows, prefetched a slice per d-block while this tile computes
   (the key pass went from 34 to 25 ms at N = 65536 on one thread). */
INLINE void gram(const float *a, const float *b, const float *y, const int t, float *acc, const int nv,
                 const float *next_x, const float *next_y, const int64_t next_rows) {
  const int D = 16 * nv, DB = 16 / nv;
  const int64_t lines = next_rows * nv, per_block = (lines + D / DB - 1) / (D / DB);
  for (int d0 = 0; d0 < D; d0 += DB) {
    for (int64_t l = d0 / DB * per_block; l < (d0 / DB + 1) * per_block && l < lines; l++) {
      __builtin_prefetch(next_x + 16 * l);
      __builtin_prefetch(next_y + 16 * l);
    }
    vf part[16];
    products(a + d0, 1, D, y, t, part, nv);
#pragma GCC unroll 16
    for (int i = 0; i < DB; i++)
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) store(acc + (d0 + i) * D + 16 * c, load(acc + (d0 + i) * D + 16 * c) + part[i * nv + c]);
  }
  vf sums[8];
#pragma GCC unroll 8
  for (int c = 0; c < nv; c++) sums[c] = load(acc + D * D + 16 * c);
  for (int n = 0; n < t; n++) {
    const vf bn = splat(b ? b[n] : 1.0f);
#pragma GCC unroll 8
    for (int c = 0; c < nv; c++) sums[c] += bn * load(y + n * D + 16 * c);
  }
#pragma GCC unroll 8
  for (int c = 0; c < nv; c++) store(acc + D * D + 16 * c, sums[c]);
}

/* One row range [n0, n1) of one head: r = keep / |x| per row into r_out, acc [D + 1, D] += [r x; keep]^T y,
   and z [D] += sum of the rows r x when z is not NULL. */
INLINE void scaled_gram(const float *x, const float *y, const float *keep, int64_t n0, int64_t n1, float *r_out,
                        float *acc, float *z, const int nv) {
  const int D = 16 * nv;
  float a[TILE * 128];
  for (int64_t t0 = n0; t0 < n1; t0 += TILE) {
    const int t = (int)(n1 - t0 < TILE ? n1 - t0 : TILE);
    inv_norms(x + t0 * D, t, r_out + t0, nv);
    for (int n = 0; n < t; n++) {
      const float *row = x + (t0 + n) * D;
      const float r = keep ? (r_out[t0 + n] *= keep[t0 + n]) : r_out[t0 + n];
#pragma GCC unroll 8
      for (int c = 0; c < nv; c++) store(a + n * D + 16 * c, splat(r) * load(row + 16 * c));
    }
    if (z)
      for (int n = 0; n < t; n++)
#pragma GCC unroll 8
        for (int c = 0; c < nv; c++) store(z + 16 * c, load(z + 16 * c) + load(a + n * D + 16 * c));
    const int64_t next = n1 - t0 - t < TILE ? n1 - t0 - t : TILE;
    gram(a, keep ? keep + t0 : NULL, y + t0 * D, t, acc, nv, x + (t0 + t) * D, y + (t0 + t) * D, next);
  }
}

/* Work items: each of G heads split into `parts` row ranges of [0, n). */
static void item_range(int64_t i, int64_t parts, int64_t n, int64_t *head, int64_t *n0, int64_t *n1) {
  *head = i / parts;
  *n0 = n * (i % parts) / parts;
  *n1 = n * (i % parts + 1) / parts;
}

static int64_t parts_for(int64_t G, int64_t n, int threads) {
  int64_t parts = (2 * threads + G - 1) / G; /* at least two items per thread when there are few heads */
  const int64_t most = (n + 255) / 256;      /* but no ranges of fewer than 256 rows */
  if (parts > most) parts = most;
  return parts < 1 ? 1 : parts;
}

/* Sums the items' accumulators [G * parts, rows, D] into out [G, rows, D] times `scale`. */
static void reduce_parts(const float *partial, int64_t G, int64_t parts, int64_t rows, int64_t D, float scale, float *out) {
  const int64_t size = rows * D;
  for (int64_t g = 0; g < G; g++) {
    float *o = out + g * size;
    memset(o, 0, size * sizeof(float));
    for (int64_t p = 0; p < parts; p++)
      for (int64_t e = 0; e < size; e++) o[e] += partial[(g * parts + p) * size + e];
    for (int64_t e = 0; e < size; e++) o[e] *= scale;
  }
}

static void fence(void) { /* non-temporal stores are weakly ordered: make them visible before returning */
#ifdef __AVX512F__
  _mm_sfence();
#endif
}

/* Writes one float per 4 KB page of x [n floats], pages split over the threads of the enclosing region.
   Outputs are new memory every step: faulting their pages in (the kernel zeroes each) all at once, before
   the passes, was measured 7% faster at N = 65536 than faults scattered through the streaming passes. */
static void touch(float *x, int64_t n) {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < n; i += 1024) x[i] = 0;
}

static int aligned(const float *p) { return (uintptr_t)p % 64 == 0; }

/* The scratch of one call: the items' accumulators [G * parts, rows, D], their reduction [G, rows, D], and two
   [G, D, D] blocks for transposes. */
typedef struct { float *partial, *sum, *tr1, *tr2; } scratch;

static int scratch_alloc(scratch *s, int64_t G, int64_t parts, int64_t rows, int64_t D) {
  s->partial = malloc(G * parts * rows * D * sizeof(float));
  s->sum = malloc(G * rows * D * sizeof(float));
  s->tr1 = malloc(G * D * D * sizeof(float));
  s->tr2 = malloc(G * D * D * sizeof(float));
  return s->partial && s->sum && s->tr1 && s->tr2;
}

static void scratch_free(scratch *s) {
  free(s->partial);
  free(s->sum);
  free(s->tr1);
  free(s->tr2);
}

/* tr [G, D, D] = the transposed first D x D block of each head's [rows, D] in x. */
static void transpose_blocks(const float *x, int64_t G, int64_t rows, int64_t D, float *tr) {
  for (int64_t h = 0; h < G; h++)
    for (int64_t i = 0; i < D; i++)
      for (int64_t j = 0; j < D; j++) tr[h * D * D + j * D + i] = x[h * rows * D + i * D + j];
}

/* One call of a non-causal kernel (nodenom_cpu.c, affine_cpu.c): its tensors, NULL where an op or a direction has
   none, and its sizes. Shapes: q, g, out, gq [G, N, D]; k, v, gk, gv [G, M, D]; keep [G, M]; count [G]; rq, den [G, N];
   rk [G, M]; state [G, rows, D]. The backward reads the forward's rq, rk, den and state; its scratch is St = S^T and
   Ht (the reduced query pass's first D x D block transposed) [G, D, D] and sum, that reduction [G, rows, D]. */
typedef struct {
  const float *q, *k, *v, *keep, *count, *g;
  float *out, *rq, *rk, *den, *state, *gq, *gk, *gv, *St, *sum, *Ht;
  int64_t G, N, M, D, rows;
  int nt; /* non-temporal stores of the outputs (put) */
} call;

#define AT(p, offset) ((p) ? (p) + (offset) : (p))

/* The call seen from head h: every pointer at that head's rows. */
static call head_of(const call *c, int64_t h) {
  const int64_t N = c->N, M = c->M, D = c->D, DD = D * D, S = c->rows * D;
  call x = *c;
  x.q = AT(c->q, h * N * D), x.g = AT(c->g, h * N * D), x.out = AT(c->out, h * N * D), x.gq = AT(c->gq, h * N * D);
  x.k = AT(c->k, h * M * D), x.v = AT(c->v, h * M * D), x.gk = AT(c->gk, h * M * D), x.gv = AT(c->gv, h * M * D);
  x.keep = AT(c->keep, h * M), x.rk = AT(c->rk, h * M), x.rq = AT(c->rq, h * N), x.den = AT(c->den, h * N);
  x.count = AT(c->count, h), x.state = AT(c->state, h * S), x.sum = AT(c->sum, h * S);
  x.St = AT(c->St, h * DD), x.Ht = AT(c->Ht, h * DD);
  return x;
}
#undef AT

/* A pass over the rows [n0, n1) of one head (head_of); acc: the item's own [rows, D] accumulator, or NULL. */
typedef void (*pass)(const call *, int64_t n0, int64_t n1, float *acc);

/* An op's four passes at one head size (nv constant, so loops unroll and accumulators live in registers); the
   OpenMP regions below, outlined by the compiler before any inlining, call them through this table. */
typedef struct { pass key, query, grad_query, grad_key; } passes;

/* The table OP##_##NV of OP##_key_pass, OP##_query_pass, OP##_grad_query_pass and OP##_grad_key_pass, each taking
   (const call *, n0, n1, acc, nv), compiled with nv = NV. */
#define PASSES(OP, NV)                                                                                             \
  static void OP##_key_##NV(const call *c, int64_t n0, int64_t n1, float *acc) { OP##_key_pass(c, n0, n1, acc, NV); } \
  static void OP##_query_##NV(const call *c, int64_t n0, int64_t n1, float *acc) {                                 \
    OP##_query_pass(c, n0, n1, acc, NV);                                                                           \
  }                                                                                                                \
  static void OP##_grad_query_##NV(const call *c, int64_t n0, int64_t n1, float *acc) {                            \
    OP##_grad_query_pass(c, n0, n1, acc, NV);                                                                      \
  }                                                                                                                \
  static void OP##_grad_key_##NV(const call *c, int64_t n0, int64_t n1, float *acc) {                              \
    OP##_grad_key_pass(c, n0, n1, acc, NV);                                                                        \
  }                                                                                                                \
  static const passes OP##_##NV = {OP##_key_##NV, OP##_query_##NV, OP##_grad_query_##NV, OP##_grad_key_##NV};

/* The tables for D = 16, 32, 64, 128 and OP##_for(D), NULL for another D. */
#define PASSES_FOR(OP)                                                                                             \
  PASSES(OP, 1)                                                                                                    \
  PASSES(OP, 2)                                                                                                    \
  PASSES(OP, 4)                                                                                                    \
  PASSES(OP, 8)                                                                                                    \
  static const passes *OP##_for(int64_t D) {                                                                       \
    switch (D) {                                                                                                   \
      case 16: return &OP##_1;                                                                                     \
      case 32: return &OP##_2;                                                                                     \
      case 64: return &OP##_4;                                                                                     \
      case 128: return &OP##_8;                                                                                    \
      default: return NULL;                                                                                        \
    }                                                                                                              \
  }

/* Inside an OpenMP region: the G * parts items of a pass over n rows per head; item i accumulates into
   partial + i * rows * D (partial NULL: the pass accumulates nothing). */
static void run_pass(pass p, const call *c, int64_t parts, int64_t n, float *partial) {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < c->G * parts; i++) {
    int64_t h, n0, n1;
    item_range(i, parts, n, &h, &n0, &n1);
    const call head = head_of(c, h);
    p(&head, n0, n1, partial ? partial + i * c->rows * c->D : NULL);
  }
}

/* The forward of a non-causal kernel in one OpenMP region: the key pass over [G, M], its items summed times `scale`
   into state, then finish(c) when not NULL, then the query pass over [G, N]. Returns 0, or -1 for an unsupported D
   (f NULL) or a failed allocation (the caller falls back). */
static int forward_passes(const passes *f, const call *c, float scale, void (*finish)(const call *), int threads) {
  const int64_t G = c->G, kparts = parts_for(G, c->M, threads), qparts = parts_for(G, c->N, threads);
  scratch s;
  const int ok = scratch_alloc(&s, G, kparts, c->rows, c->D) && f;
  if (ok) {
#pragma omp parallel num_threads(threads)
    {
      touch(c->out, G * c->N * c->D);
      run_pass(f->key, c, kparts, c->M, s.partial);
#pragma omp single
      {
        reduce_parts(s.partial, G, kparts, c->rows, c->D, scale, c->state);
        if (finish) finish(c);
      }
      run_pass(f->query, c, qparts, c->N, NULL);
    }
  }
  fence();
  scratch_free(&s);
  return ok ? 0 : -1;
}

/* The backward from g in one OpenMP region: St from the state, the query-gradient pass over [G, N], its items summed
   times `scale` into sum and Ht from it, then finish(c) when not NULL, then the key-gradient pass over [G, M]. */
static int backward_passes(const passes *f, call c, float scale, void (*finish)(const call *), int threads) {
  const int64_t G = c.G, qparts = parts_for(G, c.N, threads), kparts = parts_for(G, c.M, threads);
  scratch s;
  const int ok = scratch_alloc(&s, G, qparts, c.rows, c.D) && f;
  if (ok) {
    c.St = s.tr1, c.sum = s.sum, c.Ht = s.tr2;
    transpose_blocks(c.state, G, c.rows, c.D, c.St);
#pragma omp parallel num_threads(threads)
    {
      touch(c.gq, G * c.N * c.D);
      touch(c.gk, G * c.M * c.D);
      touch(c.gv, G * c.M * c.D);
      run_pass(f->grad_query, &c, qparts, c.N, s.partial);
#pragma omp single
      {
        reduce_parts(s.partial, G, qparts, c.rows, c.D, scale, c.sum);
        transpose_blocks(c.sum, G, c.rows, c.D, c.Ht); /* before finish, which changes only the rows after dS */
        if (finish) finish(&c);
      }
      run_pass(f->grad_key, &c, kparts, c.M, NULL);
    }
  }
  fence();
  scratch_free(&s);
  return ok ? 0 : -1;
}
