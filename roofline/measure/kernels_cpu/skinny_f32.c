/* Skinny fp32 GEMM for the CPU: Y[M,N] = X[M,K] . W[N,K]^T, every matrix row-major and
   contiguous, for the token counts of decode and verification (M = 1 .. ~128).

   Why: at small M a decoder's GEMMs are bound by reading W, and torch's fp32 F.linear (MKL
   sgemm) packs W on every call, so it streams W below the memory roof at M = 1 and its time
   grows with M long before the FLOP ridge (docs/cpu.md). This kernel reads each element of W
   once per tile of up to six tokens: blocks of 12 rows of W (one per thread at a time, re-read
   from L2 by every tile of tokens), and inside a block register tiles of R rows by MT tokens
   (R*MT <= 12 accumulators of 8 floats), one FMA per loaded W vector and token.
   Vectors are GCC/Clang vector extensions: built with -march=native they become AVX2, AVX-512
   or SSE instructions of the machine at hand. Threads: OpenMP over blocks of rows; with torch
   imported, libgomp.so.1 is torch's own, so this kernel shares torch's thread pool. */
#include <string.h>
#ifdef __cplusplus
extern "C" {
#endif
typedef float v8 __attribute__((vector_size(32)));
static inline v8 ld(const float* p) { v8 v; memcpy(&v, p, 32); return v; }
static inline float hsum(v8 v) { float s = 0; for (int i = 0; i < 8; i++) s += v[i]; return s; }

#define TILE(R, MT)                                                                              \
  static void tile_##R##_##MT(const float* W, const float* X, float* Y, long K, long N, long n0, \
                              long m0) {                                                         \
    v8 acc[R][MT];                                                                               \
    for (int r = 0; r < R; r++)                                                                  \
      for (int m = 0; m < MT; m++) acc[r][m] = (v8){0, 0, 0, 0, 0, 0, 0, 0};                     \
    long k = 0;                                                                                  \
    for (; k + 8 <= K; k += 8) {                                                                 \
      v8 w[R];                                                                                   \
      for (int r = 0; r < R; r++) w[r] = ld(W + (n0 + r) * K + k);                               \
      for (int m = 0; m < MT; m++) {                                                             \
        v8 xv = ld(X + (m0 + m) * K + k);                                                        \
        for (int r = 0; r < R; r++) acc[r][m] += w[r] * xv;                                      \
      }                                                                                          \
    }                                                                                            \
    for (int r = 0; r < R; r++)                                                                  \
      for (int m = 0; m < MT; m++) {                                                             \
        float s = hsum(acc[r][m]);                                                               \
        for (long kk = k; kk < K; kk++) s += W[(n0 + r) * K + kk] * X[(m0 + m) * K + kk];        \
        Y[(m0 + m) * N + n0 + r] = s;                                                            \
      }                                                                                          \
  }
TILE(4, 1)
TILE(4, 2)
TILE(4, 3)
TILE(3, 4)
TILE(2, 5)
TILE(2, 6)
TILE(1, 1)
TILE(1, 2)
TILE(1, 3)
TILE(1, 4)
TILE(1, 5)
TILE(1, 6)
typedef void (*tile_fn)(const float*, const float*, float*, long, long, long, long);
/* by tile width MT = 1..6: the widest register tile, its rows, and the one-row tile (tail rows) */
static const tile_fn BEST[7] = {0, tile_4_1, tile_4_2, tile_4_3, tile_3_4, tile_2_5, tile_2_6};
static const int ROWS[7] = {0, 4, 4, 4, 3, 2, 2};
static const tile_fn ONE[7] = {0, tile_1_1, tile_1_2, tile_1_3, tile_1_4, tile_1_5, tile_1_6};
#define BLOCK 12 /* rows of W per block: a multiple of every ROWS entry */

int skinny_version(void) { return 1; }

void skinny_f32(const float* W, const float* X, float* Y, long M, long N, long K, int threads) {
  if (M <= 0 || N <= 0) return;
  long tiles = (M + 5) / 6, base = M / tiles, extra = M % tiles; /* M split into near-equal tiles */
  long blocks = N / BLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (long b = 0; b < blocks; b++) {
    long m0 = 0;
    for (long t = 0; t < tiles; t++) {
      int mt = (int)(base + (t < extra));
      for (long n0 = b * BLOCK; n0 < (b + 1) * BLOCK; n0 += ROWS[mt]) BEST[mt](W, X, Y, K, N, n0, m0);
      m0 += mt;
    }
  }
  for (long n0 = blocks * BLOCK; n0 < N; n0++) {
    long m0 = 0;
    for (long t = 0; t < tiles; t++) {
      int mt = (int)(base + (t < extra));
      ONE[mt](W, X, Y, K, N, n0, m0);
      m0 += mt;
    }
  }
}
#ifdef __cplusplus
}
#endif
