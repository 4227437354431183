/* retention_2d's two-sided grid on the CPU (models/attention/decay.py): for the tokens of an R x W patch grid,
   row-major, per head

       o_i = sum_j gamma^(|r_i - r_j| + |c_i - c_j|) (q_i . k_j) v_j          (every j: two-sided)

   without forming the N x N matrix and without a d x d state per token. Rows are processed in order; each column c
   keeps one state S[c] = sum over the rows r' seen so far of gamma^(distance in rows) k v^T (D x D: the rows
   above, decayed to the current row), and within a row two running sums over the columns read it, one left to
   right over the keys at c' <= c and one right to left over c' > c, so o_rc = q_rc (L + U) covers the rows r' <= r
   (the states including the current row's keys); a second sweep from the bottom row up, whose states exclude the
   current row, adds the rows r' > r. Work: about 13 D^2 multiply-adds per token (the states' update, the two column
   sums, the two readouts, in each sweep), O(N D^2) against the matrix's O(N^2 D); memory: the W column states.

   The running sums are kept scaled, L~ = sum_{c' <= c} gamma^-c' S'[c'] and U~ = sum_{c' > c} gamma^c' S'[c'], so
   each takes one multiply-add per column, and the readouts scale q instead, q_c gamma^c L~ and q_c gamma^-c U~ (each
   term's two factors multiply to gamma to a distance >= 0; W <= MAX_WIDTH keeps gamma^-c far inside fp32). The value
   features are taken T = 16 at a time (two AVX2 registers), so one tile's states, W x D x 16 floats (256 KB at W =
   64, D = 64), stay in the core's L2 cache; the loop over the columns runs inside the loop over blocks of IB key
   features, so a block's running sums stay in registers and each column's outputs are read and written once per
   block (a first form with the sums in memory and each column's outputs in registers took 85 ms a call at G = 6,
   W = 64, D = 64 on a 2-core AVX2 EPYC, this one 58 ms). (head, tile) pairs over threads.

   The matrix is symmetric, so the backward is this forward three times (ops/manhattan.py): dL/dq = op(dO, v, k),
   dL/dk = op(v, dO, q), dL/dv = op(k, q, dO). Shapes: q, k, v, o [G, R W, D] fp32, gamma [H] (head g uses
   gamma[g % H]), D in {16, 32, 64, 128}; returns 2 for other D or W > MAX_WIDTH, 1 when out of memory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WIDTH 1024 /* gamma^-(W - 1) at most e^33 (gamma = 1 - 2^-5, retention's steepest head) */
#define T 16
#define IB 8 /* key features per register block (4: 15% slower, 16: 12% slower at W = 64, D = 64) */

typedef float v8 __attribute__((vector_size(32)));                 /* 32-byte aligned: S and acc (our allocations) */
typedef float v8u __attribute__((vector_size(32), aligned(4)));    /* q, k, v and o rows: any float alignment */

/* One (head, tile): o[:, t0 .. t0 + T) of the head's R x W grid. S: W x D x T floats (the column states), acc:
   W x T (one row's outputs), both 32-byte aligned; gc: 2 W (gamma^c, then gamma^-c). */
static void grid_tile(const float *q, const float *k, const float *v, float gamma, int64_t R, int64_t W, int D,
                      int t0, float *o, float *S, float *acc, const float *gc) {
  const float *gci = gc + W;
  v8 *Sv = (v8 *)S, *av = (v8 *)acc;
  for (int sweep = 0; sweep < 2; sweep++) { /* 0: rows from the top, states inclusive; 1: from the bottom, strict */
    memset(S, 0, (size_t)W * D * T * sizeof(float));
    for (int64_t step = 0; step < R; step++) {
      const int64_t r = sweep ? R - 1 - step : step;
      const float *qr = q + r * W * D, *kr = k + r * W * D, *vr = v + r * W * D + t0;
      memset(acc, 0, (size_t)W * T * sizeof(float));
      for (int i0 = 0; i0 < D; i0 += IB) { /* left to right: every key at c' <= c */
        v8 L[IB][2];
        for (int b = 0; b < IB; b++) L[b][0] = L[b][1] = (v8){0};
        for (int64_t c = 0; c < W; c++) {
          const float *qc = qr + c * D + i0, *kc = kr + c * D + i0, *vc = vr + c * D;
          const v8 *Sc = Sv + (c * D + i0) * 2, x0 = *(const v8u *)vc, x1 = *(const v8u *)(vc + 8);
          const float up = gci[c], down = gc[c];
          v8 a0 = av[2 * c], a1 = av[2 * c + 1];
#pragma GCC unroll 8
          for (int b = 0; b < IB; b++) {
            const float ki = sweep ? 0.f : kc[b], qi = qc[b] * down; /* sweep 0: S' = S + k v, the row's key */
            L[b][0] += up * (Sc[2 * b] + ki * x0);
            L[b][1] += up * (Sc[2 * b + 1] + ki * x1);
            a0 += qi * L[b][0];
            a1 += qi * L[b][1];
          }
          av[2 * c] = a0, av[2 * c + 1] = a1;
        }
      }
      for (int i0 = 0; i0 < D; i0 += IB) { /* right to left: every key at c' > c; then the states move a row on */
        v8 U[IB][2];
        for (int b = 0; b < IB; b++) U[b][0] = U[b][1] = (v8){0};
        for (int64_t c = W - 1; c >= 0; c--) {
          const float *qc = qr + c * D + i0, *kc = kr + c * D + i0, *vc = vr + c * D;
          const v8 x0 = *(const v8u *)vc, x1 = *(const v8u *)(vc + 8);
          const float up = gci[c], down = gc[c];
          v8 *Sc = Sv + (c * D + i0) * 2, a0 = av[2 * c], a1 = av[2 * c + 1];
#pragma GCC unroll 8
          for (int b = 0; b < IB; b++) {
            /* sweep 0: S' = S + k v read again (the row counted), stored decayed; sweep 1: the states held the rows
               below, the row's key joins after they are read */
            const float ki = kc[b], qi = qc[b] * up;
            const v8 s0 = sweep ? Sc[2 * b] : Sc[2 * b] + ki * x0, s1 = sweep ? Sc[2 * b + 1] : Sc[2 * b + 1] + ki * x1;
            a0 += qi * U[b][0];
            a1 += qi * U[b][1];
            U[b][0] += down * s0;
            U[b][1] += down * s1;
            Sc[2 * b] = gamma * (sweep ? s0 + ki * x0 : s0);
            Sc[2 * b + 1] = gamma * (sweep ? s1 + ki * x1 : s1);
          }
          av[2 * c] = a0, av[2 * c + 1] = a1;
        }
      }
      for (int64_t c = 0; c < W; c++) {
        v8u *ot = (v8u *)(o + (r * W + c) * D + t0);
        ot[0] = sweep ? ot[0] + av[2 * c] : av[2 * c];
        ot[1] = sweep ? ot[1] + av[2 * c + 1] : av[2 * c + 1];
      }
    }
  }
}

int manhattan_forward(const float *q, const float *k, const float *v, const float *gamma, int64_t H, int64_t G,
                      int64_t R, int64_t W, int64_t D, float *o, int threads) {
  if (!(D == 16 || D == 32 || D == 64 || D == 128) || W > MAX_WIDTH) return 2;
  const int64_t tiles = D / T, items = G * tiles, N = R * W;
  int status = 0;
#pragma omp parallel num_threads(threads) reduction(| : status)
  {
    float *S = aligned_alloc(64, ((size_t)W * D * T + W * T + 2 * W + 16) / 16 * 16 * sizeof(float));
    if (!S) status = 1;
    else {
      float *acc = S + W * D * T, *gc = acc + W * T;
#pragma omp for schedule(static)
      for (int64_t item = 0; item < items; item++) {
        const int64_t g = item / tiles;
        const int t0 = (int)(item % tiles) * T;
        const float gm = gamma[g % H];
        gc[0] = gc[W] = 1.f;
        for (int64_t c = 1; c < W; c++) gc[c] = gc[c - 1] * gm, gc[W + c] = gc[W + c - 1] / gm;
        grid_tile(q + g * N * D, k + g * N * D, v + g * N * D, gm, R, W, (int)D, t0, o + g * N * D, S, acc, gc);
      }
    }
    free(S);
  }
  return status;
}
