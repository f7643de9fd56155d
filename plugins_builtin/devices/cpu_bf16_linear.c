/* y = x W^T (+ bias) for bfloat16 x [R, K], W [N, K], bias [N] and y [R, N], on an x86 CPU with
 * AVX2 and FMA (or, built with -mavx512bf16, AVX512-BF16: below). Built by cpu_bf16.py at first
 * use.
 *
 * torch's bfloat16 matmul on such a CPU costs in proportion to its rows. Here each weight row is
 * read once for a block of up to six rows of x: its bfloat16 values are widened to float32 in
 * registers (a shift) and multiplied into one float32 accumulator per row of x, so verifying a
 * few drafts costs about what one token does. Each output is a float32 dot product over K in a
 * fixed order (eight lanes, then the lanes summed, then the tail), rounded to bfloat16 once
 * (nearest, ties to even): a row's result does not depend on the other rows or on the threads.
 *
 * Built also with -mamx-tile -mamx-bf16 (where the CPU has AMX-BF16), the AVX512-BF16 build takes
 * AMX's tiles once deepinfer_bf16_amx_init has been granted them (below).
 *
 * It is C that compiles as C++ too: torch.utils.cpp_extension builds it with the C++ compiler
 * (cpu_bf16.py), its entry points keeping their C names for ctypes.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

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
/* A call whose rows all fit one block reads each weight once: its prefetches are non-temporal
 * (``nta``), so that weights read once a step do not push out of the caches what the next calls
 * read again (session 40, on an AMD EPYC with AVX512-BF16, three runs of 3-5 interleaved turns:
 * batch-1 decode 1-6% faster with no drafter, 4-6% with deepspark). Calls of more rows read each
 * weight again for every block of rows and keep the temporal hint. */

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

/* Output columns [n0, n1) for RB rows of x ([RB, K], of type X_T), CB weight rows at a time, over
 * one build's vector operations (defined before each instantiation below): VEC accumulators
 * (RB * CB of them, CB weight vectors W_VEC and the x vector X_VEC fit in the registers: no
 * spills), STEP values of K a step, ZERO(), LOAD_W(p), LOAD_X(p), MAC(acc, w, x) and SUM(acc), and
 * X_AT(v) for the tail's x values. Each output: SUM of its accumulator (a fixed order), then the
 * tail in float32, then the bias, rounded once. */
#define COLUMNS(NAME, RB, CB)                                                                     \
    static void NAME##_##RB(const void *xs, long K, const uint16_t *w, long n0, long n1,          \
                            const uint16_t *bias, uint16_t *y, long N, int nta) {                 \
        const X_T *x = (const X_T *)xs;                                                           \
        for (long n = n0; n < n1; n += CB) {                                                      \
            int cb = n1 - n < CB ? (int)(n1 - n) : CB;                                            \
            const uint16_t *wc[CB];                                                               \
            for (int c = 0; c < CB; c++) wc[c] = w + (n + (c < cb ? c : 0)) * K;                  \
            VEC acc[CB][RB];                                                                      \
            _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++)                                  \
                _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) acc[c][r] = ZERO();          \
            long k = 0;                                                                           \
            for (; k + STEP <= K; k += STEP) {                                                    \
                W_VEC v[CB];                                                                      \
                _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++) v[c] = LOAD_W(wc[c] + k);   \
                if ((k & 31) == 0) /* a new cache line of each row: fetch the one 4 KB on */    \
                    _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++) {                        \
                        const char *ahead = (const char *)((uintptr_t)(wc[c] + k) + PREFETCH);    \
                        if (nta)                                                                  \
                            _mm_prefetch(ahead, _MM_HINT_NTA);                                    \
                        else                                                                      \
                            _mm_prefetch(ahead, _MM_HINT_T0);                                     \
                    }                                                                             \
                _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                            \
                    X_VEC xv = LOAD_X(x + r * K + k);                                             \
                    _Pragma("GCC unroll 8") for (int c = 0; c < CB; c++)                          \
                        acc[c][r] = MAC(acc[c][r], v[c], xv);                                     \
                }                                                                                 \
            }                                                                                     \
            for (int c = 0; c < cb; c++)                                                          \
                for (int r = 0; r < RB; r++) {                                                    \
                    float s = SUM(acc[c][r]);                                                     \
                    for (long t = k; t < K; t++) s += widen(wc[c][t]) * X_AT(x[r * K + t]);       \
                    if (bias) s += widen(bias[n + c]);                                            \
                    y[r * N + n + c] = narrow(s);                                                 \
                }                                                                                 \
        }                                                                                         \
    }

typedef void (*columns_fn)(const void *, long, const uint16_t *, long, long, const uint16_t *,
                           uint16_t *, long, int);

#ifndef __AVX512BF16__
/* The AVX2 build: x widened to float32 beforehand; each weight vector of 8 widened in registers (a
 * shift) and multiplied in with FMA; at most 16 ymm registers. */
#define X_T float
#define VEC __m256
#define W_VEC __m256
#define X_VEC __m256
#define STEP 8
#define ZERO() _mm256_setzero_ps()
#define LOAD_W(p) load8(p)
#define LOAD_X(p) _mm256_loadu_ps(p)
#define MAC(acc, wv, xv) _mm256_fmadd_ps(wv, xv, acc)
#define SUM(acc) lanes_sum(acc)
#define X_AT(v) (v)
COLUMNS(columns, 1, 4)
COLUMNS(columns, 2, 4)
COLUMNS(columns, 3, 3)
COLUMNS(columns, 4, 3)
COLUMNS(columns, 5, 2)
COLUMNS(columns, 6, 2)
static const columns_fn COLUMNS_FOR[ROW_BLOCK + 1] = {
    0, columns_1, columns_2, columns_3, columns_4, columns_5, columns_6};

#else
/* Built with -mavx512bf16 (cpu_bf16.py does where the CPU has AVX512-BF16): VDPBF16PS multiplies
 * 32 bfloat16 pairs of a weight row and a row of x exactly and adds each pair's sum into 16
 * float32 lanes, so neither x nor the weights are widened and a 64-byte line of weights takes one
 * instruction a row. Each output is still a float32 sum in a fixed order (16 lanes over K in steps
 * of 32, then the lanes summed, then the tail in float32), rounded to bfloat16 once; the
 * instruction treats subnormal inputs as zero and rounds to nearest even whatever MXCSR says.
 * At most 29 of the 32 zmm registers. */
static inline float lanes_sum16(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return lanes_sum(h);
}
#define X_T uint16_t
#define VEC __m512
#define W_VEC __m512bh
#define X_VEC __m512bh
#define STEP 32
#define ZERO() _mm512_setzero_ps()
#define LOAD_W(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
#define LOAD_X(p) ((__m512bh)_mm512_loadu_si512((const void *)(p)))
#define MAC(acc, wv, xv) _mm512_dpbf16_ps(acc, wv, xv)
#define SUM(acc) lanes_sum16(acc)
#define X_AT(v) widen(v)
COLUMNS(columns16, 1, 8)
COLUMNS(columns16, 2, 8)
COLUMNS(columns16, 3, 6)
COLUMNS(columns16, 4, 5)
COLUMNS(columns16, 5, 4)
COLUMNS(columns16, 6, 4)
static const columns_fn COLUMNS16_FOR[ROW_BLOCK + 1] = {
    0, columns16_1, columns16_2, columns16_3, columns16_4, columns16_5, columns16_6};
#endif

/* y's columns from ``first`` on in blocks of COLUMN_BLOCK over the threads, each block's rows in row
 * blocks as even as can be (7 rows of 6 are 4 + 3); x of xsize bytes a value. */
static void all_columns(const columns_fn *columns, const char *x, size_t xsize, long R, long K,
                        const uint16_t *w, long N, const uint16_t *bias, uint16_t *y, int threads,
                        int row_block, long first) {
    long blocks = (N - first + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
    long parts = (R + row_block - 1) / row_block;
    if (threads > blocks) threads = (int)blocks;
    if (threads < 1) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long b = 0; b < blocks; b++) {
        long n0 = first + b * COLUMN_BLOCK, n1 = n0 + COLUMN_BLOCK < N ? n0 + COLUMN_BLOCK : N;
        for (long p = 0; p < parts; p++) {
            long r0 = R * p / parts, r1 = R * (p + 1) / parts;
            columns[r1 - r0](x + (size_t)(r0 * K) * xsize, K, w, n0, n1, bias, y + r0 * N, N,
                             parts == 1);
        }
    }
}

#if defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
/* AMX: TDPBF16PS multiplies a tile A of 16 rows x 32 bfloat16 (16 weight rows, read in place from
 * W with its row stride) by a tile B of 16 pairs of K x 16 columns (x's rows, up to 16, laid out
 * in pairs of K: "VNNI", built per call) into a tile C of 16 x 16 float32 sums: C[m][r] is weight
 * row m times x row r. Each output is a float32 sum over K in a fixed order (the instruction's
 * order within 32 values of K, then K's blocks in turn), rounded to bfloat16 once; C's column r
 * depends on x's row r alone, so a row's result does not depend on the other rows or the threads.
 * The instruction treats subnormal inputs as zero and rounds to nearest even, as VDPBF16PS. No
 * horizontal sums and one instruction for 16 x 16 x 32 products (benchmarks/cpu_amx_ab.py in git history at d2f3059: the
 * demo target's weights for one token in about half VDPBF16PS's time on this project's Xeon, and
 * 16 rows in about the time of one; docs/benchmarks.md, session 50). Taken where K is a multiple
 * of 32; a weight's last N % 16 rows take the VDPBF16PS path (for any number of rows alike). */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
/* the most threads a call takes: a few already read the weights as fast as the memory gives them,
 * and more cost more than they bring (session 50, a 16-core Xeon, the demo target's 33 weights in
 * turn for one row: 2.0 ms on 1 thread, 1.6 on 2 or 4, 2.1 on 8 and 7.6 on 16; VDPBF16PS at best
 * 2.5, on 8) */
#define AMX_THREADS 4
static int amx_granted = 0, amx_on = 0;
static long amx_calls = 0; /* calls that took the tiles (deepinfer_bf16_amx_calls) */

/* Ask Linux for the AMX tile state (a process must before its first tile instruction); 0 when
 * granted, after which the kernel takes AMX (deepinfer_bf16_use_amx can turn it off again). */
int deepinfer_bf16_amx_init(void) {
    amx_granted = amx_on = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return !amx_granted;
}

/* Whether the kernel takes AMX from now on (``on`` 0 or 1; -1: unchanged): only once granted. */
int deepinfer_bf16_use_amx(int on) {
    if (on >= 0) amx_on = on && amx_granted;
    return amx_on;
}

/* How many calls have taken the tiles so far (tests: the tiles did run). */
long deepinfer_bf16_amx_calls(void) {
    return amx_calls;
}

/* narrow() on 16 lanes: nearest, ties to even; NaN stays NaN */
static inline __m256i narrow16(__m512 f) {
    __m512i u = _mm512_castps_si512(f);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i up = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, up, quiet));
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* C tile ``tile``'s 16 x 16 sums (weight rows nb.., x's rows 0..R-1 of y) to y, with the bias,
 * rounded (c, column, bias and N: the calling function's). */
#define STORE_TILE(tile, nb, R, y)                                                                \
    do {                                                                                          \
        _tile_stored(tile, c, 64);                                                                \
        __m512 add = bias ? _mm512_castsi512_ps(_mm512_slli_epi32(                                \
                                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bias + (nb)))), 16)) \
                          : _mm512_setzero_ps();                                                  \
        for (long r = 0; r < (R); r++) /* C's column r: y's 16 outputs of row r */               \
            _mm256_storeu_si256((__m256i *)((y) + r * N + (nb)),                                  \
                                narrow16(_mm512_add_ps(_mm512_i32gather_ps(column, &c[0][r], 4), add))); \
    } while (0)

/* Weight rows [n0, n1) (whole blocks of 16), one block at a time, for 1-4 blocks of x's rows
 * (``blocks``; VNNI layouts xv [K/2][16][2] one after another, R rows in all, a last block's
 * missing rows zeros): each weight tile read once for them all (C tiles 0-3: x's blocks; A tile 4;
 * B tiles 5-6 in turn). Each sum runs over K in the same order whatever the block (same bits). */
static void amx_row_blocks(const uint16_t *xv, long blocks, long R, long K, const uint16_t *w, long n0,
                           long n1, const uint16_t *bias, uint16_t *y, long N) {
    float c[16][16];
    const __m512i column = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208,
                                             224, 240);
    const uint16_t *x1 = xv + K * 16, *x2 = xv + K * 32, *x3 = xv + K * 48;
    for (long n = n0; n < n1; n += 16) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (long k = 0; k < K; k += 32) {
            _tile_loadd(4, w + n * K + k, K * 2);
            _tile_loadd(5, xv + k * 16, 64);
            _tile_dpbf16ps(0, 4, 5);
            if (blocks > 1) {
                _tile_loadd(6, x1 + k * 16, 64);
                _tile_dpbf16ps(1, 4, 6);
            }
            if (blocks > 2) {
                _tile_loadd(5, x2 + k * 16, 64);
                _tile_dpbf16ps(2, 4, 5);
            }
            if (blocks > 3) {
                _tile_loadd(6, x3 + k * 16, 64);
                _tile_dpbf16ps(3, 4, 6);
            }
        }
        STORE_TILE(0, n, R < 16 ? R : 16, y);
        if (blocks > 1) STORE_TILE(1, n, R < 32 ? R - 16 : 16, y + 16 * N);
        if (blocks > 2) STORE_TILE(2, n, R < 48 ? R - 32 : 16, y + 32 * N);
        if (blocks > 3) STORE_TILE(3, n, R - 48, y + 48 * N);
    }
}

/* Rows of x up to 64 at a time, in blocks of 16 (amx_row_blocks); the weight rows, 16 at a time,
 * over the threads. Returns 1 when the VNNI copy of x could not be allocated (y untouched). */
static int amx_linear(const uint16_t *x, long R, long K, const uint16_t *w, long N, const uint16_t *bias,
                      uint16_t *y, int threads) {
    long whole = N / 16 * 16, group = R < 64 ? (R + 15) / 16 * 16 : 64, parts = whole / 16;
    uint16_t *xv = (uint16_t *)aligned_alloc(64, (size_t)K * 32 * (group / 16));
    if (!xv) return 1;
    int t = threads > parts ? (int)parts : threads;
    if (t > AMX_THREADS) t = AMX_THREADS;
    if (t < 1) t = 1;
    for (long r0 = 0; r0 < R; r0 += group) {
        long rows = R - r0 < group ? R - r0 : group, blocks = (rows + 15) / 16;
        memset(xv, 0, (size_t)K * 32 * blocks);
        for (long r = 0; r < rows; r++)
            for (long kp = 0; kp < K / 2; kp++)
                memcpy(xv + (r / 16) * K * 16 + kp * 32 + 2 * (r % 16), x + (r0 + r) * K + 2 * kp, 4);
#pragma omp parallel num_threads(t)
        {
            tile_config cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.palette = 1;
            for (int i = 0; i < 7; i++) { /* C 16 x 16 float32, A 16 x 32 bfloat16, B 16 x 16 x 2 */
                cfg.rows[i] = 16;
                cfg.colsb[i] = 64;
            }
            _tile_loadconfig(&cfg);
#pragma omp for schedule(static)
            for (long p = 0; p < parts; p++)
                amx_row_blocks(xv, blocks, rows, K, w, 16 * p, 16 * p + 16, bias, y + r0 * N, N);
            _tile_release();
        }
    }
    free(xv);
    return 0;
}
#endif

/* Returns 0, or 1 when a copy of x (float32, or AMX's layout) could not be allocated (y is then
 * untouched). */
int deepinfer_bf16_linear(const uint16_t *x, long R, long K, const uint16_t *w, long N,
                          const uint16_t *bias, uint16_t *y, int threads, int row_block) {
    if (row_block < 1 || row_block > ROW_BLOCK) row_block = ROW_BLOCK;
#ifdef __AVX512BF16__
    long first = 0;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (amx_on && K % 32 == 0 && N >= 16) {
        if (amx_linear(x, R, K, w, N, bias, y, threads)) return 1;
        first = N / 16 * 16;
        amx_calls++;
    }
#endif
    if (first < N)
        all_columns(COLUMNS16_FOR, (const char *)x, sizeof *x, R, K, w, N, bias, y, threads, row_block, first);
    return 0;
#else
    float *xf = (float *)malloc(sizeof(float) * (size_t)(R * K > 0 ? R * K : 1));
    if (!xf) return 1;
    for (long i = 0; i < R * K; i++) xf[i] = widen(x[i]);
    all_columns(COLUMNS_FOR, (const char *)xf, sizeof *xf, R, K, w, N, bias, y, threads, row_block, 0);
    free(xf);
    return 0;
#endif
}

#ifdef __cplusplus
}
#endif
