/* Skinny fp32 GEMM for the CPU: Y[M,N] = X[M,K] . W[N,K]^T, every matrix row-major and
   contiguous, for the token counts of decode and verification (M = 1 .. ~128).

   Why: at small M a decoder's GEMMs are bound by reading W, and torch's fp32 F.linear (MKL
   sgemm) packs W on every call, so it streams W below the memory roof at M = 1 and its time
   grows with M long before the FLOP ridge (docs/cpu.md). This kernel reads each element of W
   once per tile of up to MTMAX tokens: blocks of 12 rows of W (one per thread at a time, re-read
   from L2 by every tile of tokens), and inside a block register tiles of R rows by MT tokens
   (R*MT <= 12 accumulators), one FMA per loaded W vector and token. MTMAX is 6 with AVX-512
   (32 registers) and 4 with 16 (AVX2): on the 2-vCPU Zen 1 EPYC (AVX2) the 2x6 tile, 8 vector
   loads per 12 FMAs, ran at 49 GFLOP/s with W warm in L2 where the 3x4 tile (7 loads) ran at 58,
   and over the cpu-demo model's 85 linears (W from DRAM) tiles of at most 4 tokens cost
   T(12)/T(1) = 2.13 and T(16)/T(1) = 2.66 against 2.46 and 3.12 with tiles of 6 (docs/cpu.md).
   Vectors are GCC/Clang vector extensions: built with -march=native they become AVX2, AVX-512
   or SSE instructions of the machine at hand. Threads: OpenMP over blocks of rows; with torch
   imported, libgomp.so.1 is torch's own, so this kernel shares torch's thread pool.

   skinny_bf16w is the same kernel over bfloat16 weights (X and Y float32): each W vector is
   widened to float32 in registers (a bfloat16 is the top half of a float32: zero-extend, shift
   left 16), so it reads 2 bytes per weight and needs no native bf16 arithmetic (AVX2 suffices);
   accumulation is float32, as in oneDNN's bf16 GEMMs. */
#include <string.h>
#ifdef __cplusplus
extern "C" {
#endif
/* VW floats per vector: a register of the machine the kernel is built on (-march=native):
   16 with AVX-512 (32 registers), else 8 (AVX2's 16 registers hold the largest tile's 12
   accumulators, its weights and one token at 8 wide, not at 16). */
#ifdef __AVX512F__
#define VW 16
#else
#define VW 8
#endif
typedef float v8 __attribute__((vector_size(VW * 4)));
typedef unsigned short u16x8 __attribute__((vector_size(VW * 2)));
typedef unsigned int u32x8 __attribute__((vector_size(VW * 4)));
static inline v8 ld(const float* p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline v8 ldb(const unsigned short* p) { /* VW bfloat16 -> VW float32 */
  u16x8 h; memcpy(&h, p, sizeof h);
  u32x8 w = __builtin_convertvector(h, u32x8) << 16;
  v8 v; memcpy(&v, &w, sizeof v); return v;
}
static inline float f(float x) { return x; }
static inline float fb(unsigned short h) { unsigned int w = (unsigned int)h << 16; float x; memcpy(&x, &w, 4); return x; }
static inline float hsum(v8 v) { float s = 0; for (int i = 0; i < VW; i++) s += v[i]; return s; }

/* a register tile of R rows of W by MT tokens; WT the weight type, LD its vector load, CV its scalar */
#define TILE(P, WT, LD, CV, R, MT)                                                               \
  static void P##_##R##_##MT(const WT* W, const float* X, float* Y, long K, long N, long n0,      \
                             long m0) {                                                          \
    v8 acc[R][MT];                                                                               \
    for (int r = 0; r < R; r++)                                                                  \
      for (int m = 0; m < MT; m++) acc[r][m] = (v8){};                                           \
    long k = 0;                                                                                  \
    for (; k + VW <= K; k += VW) {                                                               \
      v8 w[R];                                                                                   \
      for (int r = 0; r < R; r++) w[r] = LD(W + (n0 + r) * K + k);                               \
      for (int m = 0; m < MT; m++) {                                                             \
        v8 xv = ld(X + (m0 + m) * K + k);                                                        \
        for (int r = 0; r < R; r++) acc[r][m] += w[r] * xv;                                      \
      }                                                                                          \
    }                                                                                            \
    for (int r = 0; r < R; r++)                                                                  \
      for (int m = 0; m < MT; m++) {                                                             \
        float s = hsum(acc[r][m]);                                                               \
        for (long kk = k; kk < K; kk++) s += CV(W[(n0 + r) * K + kk]) * X[(m0 + m) * K + kk];    \
        Y[(m0 + m) * N + n0 + r] = s;                                                            \
      }                                                                                          \
  }

#ifdef __AVX512BF16__
/* With AVX512-BF16 the tokens stay bfloat16 too: VDPBF16PS multiplies 32 pairs of bfloat16 and
   adds each pair's two products into 16 float32 lanes, one instruction per 32 weights and token
   (twice the multiplies of a float32 FMA, and no widening of the weights). */
#include <immintrin.h>
typedef unsigned short bf16_t;
#define TILE_DP(R, MT)                                                                           \
  static void skinny_bf16_##R##_##MT(const bf16_t* W, const bf16_t* X, float* Y, long K, long N, \
                                     long n0, long m0) {                                         \
    __m512 acc[R][MT];                                                                           \
    for (int r = 0; r < R; r++)                                                                  \
      for (int m = 0; m < MT; m++) acc[r][m] = _mm512_setzero_ps();                              \
    long k = 0;                                                                                  \
    for (; k + 32 <= K; k += 32) {                                                               \
      __m512bh w[R];                                                                             \
      for (int r = 0; r < R; r++) w[r] = (__m512bh)_mm512_loadu_si512(W + (n0 + r) * K + k);    \
      for (int m = 0; m < MT; m++) {                                                             \
        __m512bh xv = (__m512bh)_mm512_loadu_si512(X + (m0 + m) * K + k);                        \
        for (int r = 0; r < R; r++) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], w[r], xv);           \
      }                                                                                          \
    }                                                                                            \
    for (int r = 0; r < R; r++)                                                                  \
      for (int m = 0; m < MT; m++) {                                                             \
        float s = _mm512_reduce_add_ps(acc[r][m]);                                               \
        for (long kk = k; kk < K; kk++) s += fb(W[(n0 + r) * K + kk]) * fb(X[(m0 + m) * K + kk]); \
        Y[(m0 + m) * N + n0 + r] = s;                                                            \
      }                                                                                          \
  }
#endif

/* the tiles of one weight type, and its entry point */
#define TILES(P, WT, LD, CV)                                                                     \
  TILE(P, WT, LD, CV, 4, 1) TILE(P, WT, LD, CV, 4, 2) TILE(P, WT, LD, CV, 4, 3)                  \
  TILE(P, WT, LD, CV, 3, 4) TILE(P, WT, LD, CV, 2, 5) TILE(P, WT, LD, CV, 2, 6)                  \
  TILE(P, WT, LD, CV, 1, 1) TILE(P, WT, LD, CV, 1, 2) TILE(P, WT, LD, CV, 1, 3)                  \
  TILE(P, WT, LD, CV, 1, 4) TILE(P, WT, LD, CV, 1, 5) TILE(P, WT, LD, CV, 1, 6)
#define GEMM(P, WT, XT)                                                                          \
  typedef void (*P##_fn)(const WT*, const XT*, float*, long, long, long, long);                  \
  /* by tile width MT = 1..6: the widest register tile, and the one-row tile (tail rows) */      \
  static const P##_fn P##_BEST[7] = {0, P##_4_1, P##_4_2, P##_4_3, P##_3_4, P##_2_5, P##_2_6};   \
  static const P##_fn P##_ONE[7] = {0, P##_1_1, P##_1_2, P##_1_3, P##_1_4, P##_1_5, P##_1_6};    \
  void P(const WT* W, const XT* X, float* Y, long M, long N, long K, int threads) {              \
    if (M <= 0 || N <= 0) return;                                                                \
    long tiles = (M + MTMAX - 1) / MTMAX, base = M / tiles, extra = M % tiles; /* near-equal tiles */       \
    long blocks = N / BLOCK;                                                                     \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                            \
    for (long b = 0; b < blocks; b++) {                                                          \
      long m0 = 0;                                                                               \
      for (long t = 0; t < tiles; t++) {                                                         \
        int mt = (int)(base + (t < extra));                                                      \
        for (long n0 = b * BLOCK; n0 < (b + 1) * BLOCK; n0 += ROWS[mt])                          \
          P##_BEST[mt](W, X, Y, K, N, n0, m0);                                                   \
        m0 += mt;                                                                                \
      }                                                                                          \
    }                                                                                            \
    for (long n0 = blocks * BLOCK; n0 < N; n0++) {                                               \
      long m0 = 0;                                                                               \
      for (long t = 0; t < tiles; t++) {                                                         \
        int mt = (int)(base + (t < extra));                                                      \
        P##_ONE[mt](W, X, Y, K, N, n0, m0);                                                      \
        m0 += mt;                                                                                \
      }                                                                                          \
    }                                                                                            \
  }

static const int ROWS[7] = {0, 4, 4, 4, 3, 2, 2}; /* rows of the widest tile, by MT */
#ifdef __AVX512F__
#define MTMAX 6 /* tokens per tile, at most (see the head of this file) */
#else
#define MTMAX 4
#endif
#define BLOCK 12 /* rows of W per block: a multiple of every ROWS entry */

int skinny_version(void) { return 5; }
int skinny_max_tile(void) { return MTMAX; } /* tokens per register tile, at most */
int skinny_vector_floats(void) { return VW; }

TILES(skinny_f32, float, ld, f)
GEMM(skinny_f32, float, float)
TILES(skinny_bf16w, unsigned short, ldb, fb)
GEMM(skinny_bf16w, unsigned short, float)
#ifdef __AVX512BF16__
TILE_DP(4, 1) TILE_DP(4, 2) TILE_DP(4, 3) TILE_DP(3, 4) TILE_DP(2, 5) TILE_DP(2, 6)
TILE_DP(1, 1) TILE_DP(1, 2) TILE_DP(1, 3) TILE_DP(1, 4) TILE_DP(1, 5) TILE_DP(1, 6)
GEMM(skinny_bf16, bf16_t, bf16_t)

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
/* With AMX (Sapphire Rapids and later) one TDPBF16PS multiplies a 16 x 32 tile of weights by a
   32 x 16 tile of tokens into 16 x 16 float32 sums: 8192 multiply-adds per 1 KiB of weights read,
   so for every M <= 16 the tiles cost what M = 1 costs and the weights stream once per call.
   The weights are the A operand as they lie (16 rows of W, 64 bytes of K each, stride K); the
   tokens are the B operand, packed once per call into VNNI pairs (Xp[kpair][token][2], 16 tokens
   per block, zero-padded): C[n][m] = sum_k W[n][k] X[m][k], stored transposed into Y.
   Linux hands a process the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM). */
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
struct tilecfg { unsigned char palette, start_row, reserved[14]; unsigned short colsb[16]; unsigned char rows[16]; };
static int amx_state = -1;
int skinny_amx_init(void) { /* 1 where the kernel may use the tiles */
  if (amx_state < 0) amx_state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return amx_state;
}
static void amx_config(void) { /* every tile 16 rows of 64 bytes (0: sums, 4: weights, 7: tokens) */
  struct tilecfg c;
  memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int i = 0; i < 8; i++) { c.colsb[i] = 64; c.rows[i] = 16; }
  _tile_loadconfig(&c);
}
/* One row group of 16 rows per call of amx_rows: measured on the 2-vCPU AMX Xeon over the cpu-demo
   model's 85 linears (432 MB, M = 1 / 8), 16 rows at a time streamed 18.1 / 16.9 GB/s, 32 rows
   (two accumulators sharing each token tile) 15-16, 64 rows 9.0 / 8.7: more strided streams in
   flight stream worse; software prefetch 512-4096 B ahead did not help. */
static void amx_rows(const bf16_t* W, const bf16_t* Xp, float* Y, long M, long N, long K, long n0) {
  float c[16 * 16];
  long MB = (M + 15) / 16, kp = K / 2;
  for (long mb = 0; mb < MB; mb++) {
    const bf16_t* xb = Xp + mb * kp * 32;
    _tile_zero(0);
    for (long k = 0; k < K; k += 32) {
      _tile_loadd(7, xb + k * 16, 64);
      _tile_loadd(4, W + n0 * K + k, K * 2);
      _tile_dpbf16ps(0, 4, 7);
    }
    _tile_stored(0, c, 64);
    for (long m = mb * 16; m < M && m < mb * 16 + 16; m++)
      for (int r = 0; r < 16; r++) Y[m * N + n0 + r] = c[r * 16 + (m - mb * 16)];
  }
}
static bf16_t* amx_scratch(long elems) { /* the packed tokens: one buffer, grown, never freed */
  static bf16_t* buf = 0;
  static long cap = 0;
  if (elems > cap) { free(buf); buf = (bf16_t*)aligned_alloc(64, (size_t)elems * 2); cap = buf ? elems : 0; }
  return buf;
}
/* 0 on success; -1 where it does not apply (N % 16, K % 32, no tile permission): the caller
   then runs skinny_bf16. */
int skinny_amx(const bf16_t* W, const bf16_t* X, float* Y, long M, long N, long K, int threads) {
  if (M <= 0 || N <= 0) return 0;
  if (N % 16 || K % 32 || !skinny_amx_init()) return -1;
  long MB = (M + 15) / 16, kp = K / 2;
  bf16_t* Xp = amx_scratch(MB * kp * 32);
  if (!Xp) return -1;
  memset(Xp, 0, (size_t)MB * kp * 64);
  const unsigned int* x32 = (const unsigned int*)X; /* a pair of bfloat16 as one 32-bit word */
  unsigned int* p32 = (unsigned int*)Xp;
  for (long m = 0; m < M; m++)
    for (long p = 0; p < kp; p++) p32[((m / 16) * kp + p) * 16 + m % 16] = x32[m * kp + p];
  _Pragma("omp parallel num_threads(threads)")
  {
    amx_config();
    _Pragma("omp for schedule(static)")
    for (long n0 = 0; n0 < N; n0 += 16) amx_rows(W, Xp, Y, M, N, K, n0);
    _tile_release();
  }
  return 0;
}
#else
int skinny_amx_init(void) { return 0; }
#endif
int skinny_has_dpbf16(void) { return 1; }
#else
int skinny_has_dpbf16(void) { return 0; }
#endif
#ifdef __cplusplus
}
#endif
