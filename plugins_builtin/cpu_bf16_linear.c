/* y = x W^T (+ bias) for bfloat16 x [R, K], W [N, K], bias [N] and y [R, N], on an x86 CPU with
 * AVX2 and FMA (or, built with -mavx512bf16, AVX512-BF16: below). Built by cpu_bf16.py with the C
 * compiler at first use.
 *
 * torch's bfloat16 matmul on such a CPU costs in proportion to its rows. Here each weight row is
 * read once for a block of up to six rows of x: its bfloat16 values are widened to float32 in
 * registers (a shift) and multiplied into one float32 accumulator per row of x, so verifying a
 * few drafts costs about what one token does. Each output is a float32 dot product over K in a
 * fixed order (eight lanes, then the lanes summed, then the tail), rounded to bfloat16 once
 * (nearest, ties to even): a row's result does not depend on the other rows or on the threads.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* output columns a thread takes at a time */
#define COLUMN_BLOCK 64
/* the most rows of x that share one read of the weights (the caller's row_block, 1 to this:
 * more rows are split into blocks as even as can be). Six suits the AVX2 CPU this was tuned on;
 * on an AVX-512 CPU blocks of three were faster from 5 rows on (session 38: 6 rows of 2048 x 384,
 * 83 us against 176): fewer loads of x per multiply. Blocks change no result: each row has
 * its own accumulators, summed in the same order whatever the block. */
#define ROW_BLOCK 6
/* how far ahead of its reads, in bytes, the weights are prefetched. The weights are read once
 * a step and are mostly out of the cache by the next (a step reads every layer's): cold, 1-6 rows
 * read them at 4-9 GB/s with the hardware's prefetchers alone on this project's AVX2 CPU, 6-11
 * GB/s with this (session 28: 1,024 to 16,384 bytes tried); weights in the cache read about as
 * fast (6 rows: the same; 1 row: 0-9% slower on the smaller shapes).
 * The address may lie past the end of the weights (computed as an integer: a prefetch does not
 * fault). */
#define PREFETCH 4096

static inline __m256 load8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float lanes_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t narrow(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Output columns [n0, n1) for RB rows of x (float32, [RB, K]), CB weight rows at a time: RB * CB
 * accumulators and CB weight vectors, with x's, at most 16 ymm registers (no spills). */
#define COLUMNS(RB, CB)                                                                           \
    static void columns_##RB(const float *x, long K, const uint16_t *w, long n0, long n1,         \
                             const uint16_t *bias, uint16_t *y, long N) {                         \
        for (long n = n0; n < n1; n += CB) {                                                      \
            int cb = n1 - n < CB ? (int)(n1 - n) : CB;                                            \
            const uint16_t *wc[CB];                                                               \
            for (int c = 0; c < CB; c++) wc[c] = w + (n + (c < cb ? c : 0)) * K;                  \
            __m256 acc[CB][RB];                                                                   \
            _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++)                                  \
                _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) acc[c][r] = _mm256_setzero_ps(); \
            long k = 0;                                                                           \
            for (; k + 8 <= K; k += 8) {                                                          \
                __m256 v[CB];                                                                     \
                _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++) v[c] = load8(wc[c] + k);    \
                if ((k & 31) == 0) /* a new cache line of each row: fetch the one 4 KB on */    \
                    _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++)                          \
                        _mm_prefetch((const char *)((uintptr_t)(wc[c] + k) + PREFETCH), _MM_HINT_T0); \
                _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                            \
                    __m256 xv = _mm256_loadu_ps(x + r * K + k);                                   \
                    _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++)                          \
                        acc[c][r] = _mm256_fmadd_ps(v[c], xv, acc[c][r]);                         \
                }                                                                                 \
            }                                                                                     \
            for (int c = 0; c < cb; c++)                                                          \
                for (int r = 0; r < RB; r++) {                                                    \
                    float s = lanes_sum(acc[c][r]);                                               \
                    for (long t = k; t < K; t++) s += widen(wc[c][t]) * x[r * K + t];             \
                    if (bias) s += widen(bias[n + c]);                                            \
                    y[r * N + n + c] = narrow(s);                                                 \
                }                                                                                 \
        }                                                                                         \
    }

COLUMNS(1, 4)
COLUMNS(2, 4)
COLUMNS(3, 3)
COLUMNS(4, 3)
COLUMNS(5, 2)
COLUMNS(6, 2)

typedef void (*columns_fn)(const float *, long, const uint16_t *, long, long, const uint16_t *,
                           uint16_t *, long);
static const columns_fn COLUMNS_FOR[ROW_BLOCK + 1] = {
    0, columns_1, columns_2, columns_3, columns_4, columns_5, columns_6};

#ifdef __AVX512BF16__
/* Built with -mavx512bf16 (cpu_bf16.py does where the CPU has AVX512-BF16): VDPBF16PS multiplies
 * 32 bfloat16 pairs of a weight row and a row of x exactly and adds each pair's sum into 16
 * float32 lanes, so neither x nor the weights are widened and a 64-byte line of weights takes one
 * instruction a row. Each output is still a float32 sum in a fixed order (16 lanes over K in steps
 * of 32, then the lanes summed, then the tail in float32), rounded to bfloat16 once; the
 * instruction treats subnormal inputs as zero and rounds to nearest even whatever MXCSR says. */
static inline float lanes_sum16(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return lanes_sum(h);
}

#define COLUMNS16(RB, CB)                                                                         \
    static void columns16_##RB(const uint16_t *x, long K, const uint16_t *w, long n0, long n1,    \
                               const uint16_t *bias, uint16_t *y, long N) {                       \
        for (long n = n0; n < n1; n += CB) {                                                      \
            int cb = n1 - n < CB ? (int)(n1 - n) : CB;                                            \
            const uint16_t *wc[CB];                                                               \
            for (int c = 0; c < CB; c++) wc[c] = w + (n + (c < cb ? c : 0)) * K;                  \
            __m512 acc[CB][RB];                                                                   \
            _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++)                                  \
                _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) acc[c][r] = _mm512_setzero_ps(); \
            long k = 0;                                                                           \
            for (; k + 32 <= K; k += 32) {                                                        \
                __m512bh v[CB];                                                                   \
                _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++) {                            \
                    v[c] = (__m512bh)_mm512_loadu_si512((const void *)(wc[c] + k));              \
                    _mm_prefetch((const char *)((uintptr_t)(wc[c] + k) + PREFETCH), _MM_HINT_T0); \
                }                                                                                 \
                _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                            \
                    __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(x + r * K + k));   \
                    _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++)                          \
                        acc[c][r] = _mm512_dpbf16_ps(acc[c][r], v[c], xv);                        \
                }                                                                                 \
            }                                                                                     \
            for (int c = 0; c < cb; c++)                                                          \
                for (int r = 0; r < RB; r++) {                                                    \
                    float s = lanes_sum16(acc[c][r]);                                             \
                    for (long t = k; t < K; t++) s += widen(wc[c][t]) * widen(x[r * K + t]);      \
                    if (bias) s += widen(bias[n + c]);                                            \
                    y[r * N + n + c] = narrow(s);                                                 \
                }                                                                                 \
        }                                                                                         \
    }

/* RB * CB accumulators, CB weight vectors and x's: at most 29 of the 32 zmm registers */
COLUMNS16(1, 8)
COLUMNS16(2, 8)
COLUMNS16(3, 6)
COLUMNS16(4, 5)
COLUMNS16(5, 4)
COLUMNS16(6, 4)

typedef void (*columns16_fn)(const uint16_t *, long, const uint16_t *, long, long, const uint16_t *,
                             uint16_t *, long);
static const columns16_fn COLUMNS16_FOR[ROW_BLOCK + 1] = {
    0, columns16_1, columns16_2, columns16_3, columns16_4, columns16_5, columns16_6};
#endif

/* Returns 0, or 1 when the float32 copy of x could not be allocated (y is then untouched). */
int deepinfer_bf16_linear(const uint16_t *x, long R, long K, const uint16_t *w, long N,
                          const uint16_t *bias, uint16_t *y, int threads, int row_block) {
    if (row_block < 1 || row_block > ROW_BLOCK) row_block = ROW_BLOCK;
#ifdef __AVX512BF16__
    {
        long blocks = (N + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
        long parts = (R + row_block - 1) / row_block;
        if (threads > blocks) threads = (int)blocks;
        if (threads < 1) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (long b = 0; b < blocks; b++) {
            long n0 = b * COLUMN_BLOCK, n1 = n0 + COLUMN_BLOCK < N ? n0 + COLUMN_BLOCK : N;
            for (long p = 0; p < parts; p++) {
                long r0 = R * p / parts, r1 = R * (p + 1) / parts;
                COLUMNS16_FOR[r1 - r0](x + r0 * K, K, w, n0, n1, bias, y + r0 * N, N);
            }
        }
        return 0;
    }
#endif
    float *xf = malloc(sizeof(float) * (size_t)(R * K > 0 ? R * K : 1));
    if (!xf) return 1;
    for (long i = 0; i < R * K; i++) xf[i] = widen(x[i]);
    long blocks = (N + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    long parts = (R + row_block - 1) / row_block; /* blocks as even as can be: 7 rows of 6 are 4 + 3 */
    if (threads > blocks) threads = (int)blocks;
    if (threads < 1) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long b = 0; b < blocks; b++) {
        long n0 = b * COLUMN_BLOCK, n1 = n0 + COLUMN_BLOCK < N ? n0 + COLUMN_BLOCK : N;
        for (long p = 0; p < parts; p++) {
            long r0 = R * p / parts, r1 = R * (p + 1) / parts;
            COLUMNS_FOR[r1 - r0](xf + r0 * K, K, w, n0, n1, bias, y + r0 * N, N);
        }
    }
    free(xf);
    return 0;
}
