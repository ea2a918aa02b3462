#include "head_product.h"

#include "diffuse.h"

#include "repack.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DIFFUSE_HEAD_X86 1
#include <immintrin.h>
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#endif

namespace diffuse {
namespace {

constexpr int QK = 32;   // values per activation block (one scale each); ggml's Q8_0 block
constexpr int NC = 8;    // activation rows fed per sweep of a decoded weight row (accumulators in registers)

// The weight's block formats (ggml's GGUF layout; the sizes are checked against ggml's type table).
constexpr size_t Q8_0_BYTES = 2 + 32;                 // f16 d, 32 x int8
constexpr size_t Q4_K_BYTES = 2 + 2 + 12 + 128;       // f16 d, f16 dmin, 8 x 6-bit scale and min, 256 x 4 bits
constexpr size_t Q6_K_BYTES = 128 + 64 + 16 + 2;      // 256 x (low 4 bits, high 2 bits), 16 x int8 scale, f16 d

inline __attribute__((always_inline)) float half_to_float(uint16_t h) {
    // The exponent and mantissa moved into a float's place are the value times 2^-112 (subnormals
    // included); infinities and NaNs take the float's all-ones exponent.
    const uint32_t em = h & 0x7fffu;
    uint32_t bits = em << 13;
    float f;
    std::memcpy(&f, &bits, 4);
    f *= 0x1p112f;
    std::memcpy(&bits, &f, 4);
    if (em >= 0x7c00u) bits = (em << 13) | 0x7f800000u;
    bits |= (uint32_t) (h & 0x8000u) << 16;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t read_u16(const uint8_t * p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// The activation rows, quantised once per call: int8 per value with a float scale per block of 32
// (amax / 127), plus what each weight format's integer dot product needs beside it. Every lane
// (4 consecutive values: one int32 of the SIMD dot products) carries its block's scale and
// -offset x its values' sum, so the kernels scale and correct lane by lane. Stored step by step
// (a step: the `step` values one SIMD instruction takes, 32 or 64), all rows' data for a step
// together, so a kernel walks one pointer per array and reaches every row by a constant offset.
struct Acts {
    int n = 0, k = 0, step = QK;
    std::vector<int8_t> q;       // (k/step, n, step)
    std::vector<float> d;        // (k/step, n, step/4): the block's scale, per lane
    std::vector<int32_t> corr;   // (k/step, n, step/4): -offset x the lane's 4 values summed
    std::vector<float> dsum;     // (n, k/32): scale x the block's sum (Q4_K's mins)
    std::vector<float> f;        // (k/(step/4), n, step/4): the floats themselves (F16 weights)
};

void quantise_acts(const float * x, int n, int k, int offset, bool floats, int step, Acts & a) {
    a.n = n;
    a.k = k;
    a.step = step;
    if (floats) {
        const int fs = step / 4;
        a.f.resize((size_t) n * k);
        for (int c = 0; c < n; ++c)
            for (int v = 0; v < k; ++v) a.f[((size_t) (v / fs) * n + c) * fs + v % fs] = x[(size_t) c * k + v];
        return;
    }
    a.q.resize((size_t) n * k);
    a.d.resize((size_t) n * k / 4);
    a.corr.resize((size_t) n * k / 4);
    a.dsum.resize((size_t) n * k / QK);
    for (int c = 0; c < n; ++c)
        for (int b = 0; b < k / QK; ++b) {
            const float * xb = x + (size_t) c * k + b * QK;
            float amax = 0.0f;
            for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(xb[j]));
            const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
            const int v = b * QK;   // the block's first value; a block never straddles a step
            const size_t at = ((size_t) (v / step) * n + c) * step + v % step;
            int8_t * q = a.q.data() + at;
            int sum = 0;
            for (int j = 0; j < QK; ++j) {
                q[j] = (int8_t) std::lrintf(xb[j] * id);
                sum += q[j];
            }
            for (int l = 0; l < QK / 4; ++l) {
                a.d[at / 4 + l] = d;
                a.corr[at / 4 + l] = -offset * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
            }
            a.dsum[(size_t) c * (k / QK) + b] = d * (float) sum;
        }
}

// One weight row decoded for the integer dot products: unsigned values (the format's offset
// added; the activations' corr takes it back out), a float scale per lane of 4 values, and
// Q4_K's per-block mins. The SIMD kernels read Q8_0 blocks as stored instead (on AVX2 as |w| and
// w's signs: its unsigned x signed byte product would saturate at w + 128).
struct Row {
    std::vector<uint8_t> u;
    std::vector<float> ls;     // (k/4)
    std::vector<float> mins;   // (k/32): dmin x m, 0 for the other formats
    std::vector<float> sc;     // (k/32): Q4_K's d x scale per block (the SIMD kernels' lanes come from it)
    void resize(int k) {
        u.resize(k);
        sc.resize(k / QK);
        ls.resize(k / 4);
        mins.assign(k / QK, 0.0f);
    }
};

constexpr int offset_of(ggml_type t, bool signed_q8) {
    return t == GGML_TYPE_Q8_0 ? (signed_q8 ? 0 : 128) : t == GGML_TYPE_Q6_K ? 32 : 0;
}

// Decoders, inlined into each instruction set's kernel so the compiler vectorises them for it.
// They write through local restrict pointers: a byte store through the vector itself could alias
// its own data pointer, which would be reloaded after every store.
inline __attribute__((always_inline)) void decode_q8_0(const uint8_t * src, int k, Row & r) {
    uint8_t * __restrict u = r.u.data();
    float * __restrict ls = r.ls.data();
    for (int b = 0; b < k / QK; ++b, src += Q8_0_BYTES) {
        const float d = half_to_float(read_u16(src));
        const int8_t * q = (const int8_t *) (src + 2);
        for (int j = 0; j < QK; ++j) u[b * QK + j] = (uint8_t) (q[j] ^ 0x80);   // q + 128
        for (int l = 0; l < QK / 4; ++l) ls[b * QK / 4 + l] = d;
    }
}

// Q4_K's scales and mins: d x scale and dmin x min per block of 32.
inline __attribute__((always_inline)) void decode_q4_k_scales(const uint8_t * src, int k, Row & r) {
    float * __restrict scales = r.sc.data();
    float * __restrict mins = r.mins.data();
    for (int sb = 0; sb < k / 256; ++sb, src += Q4_K_BYTES) {
        const float d = half_to_float(read_u16(src)), dmin = half_to_float(read_u16(src + 2));
        const uint8_t * sc = src + 4;
        for (int j = 0; j < 8; ++j) {
            // 6-bit scale and min of sub-block j (32 values), packed in 12 bytes.
            const int s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
            const int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
            scales[sb * 8 + j] = d * (float) s;
            mins[sb * 8 + j] = dmin * (float) m;
        }
    }
}

inline __attribute__((always_inline)) void decode_q4_k(const uint8_t * src, int k, Row & r) {
    decode_q4_k_scales(src, k, r);
    for (int b = 0; b < k / QK; ++b)
        for (int l = 0; l < 8; ++l) r.ls[b * 8 + l] = r.sc[b];
    for (int sb = 0; sb < k / 256; ++sb, src += Q4_K_BYTES) {
        const uint8_t * qs = src + 16;
        uint8_t * __restrict u = r.u.data() + sb * 256;
        for (int g = 0; g < 4; ++g)   // 32 bytes: low nibbles sub-block 2g, high nibbles 2g + 1
            for (int l = 0; l < 32; ++l) {
                u[64 * g + l] = qs[32 * g + l] & 0xF;
                u[64 * g + 32 + l] = qs[32 * g + l] >> 4;
            }
    }
}

inline __attribute__((always_inline)) void decode_q6_k(const uint8_t * src, int k, Row & r) {
    for (int sb = 0; sb < k / 256; ++sb, src += Q6_K_BYTES) {
        const uint8_t * ql = src, * qh = src + 128;
        const int8_t * sc = (const int8_t *) (src + 192);
        const float d = half_to_float(read_u16(src + 208));
        float * __restrict ls = r.ls.data() + sb * 64;
        for (int l = 0; l < 64; ++l) ls[l] = d * (float) sc[l / 4];   // 16 values per scale
        uint8_t * __restrict u = r.u.data() + sb * 256;
        for (int h = 0; h < 2; ++h)   // halves of 128: values l, l+32, l+64, l+96 share ql[l], ql[l+32], qh[l]
            for (int l = 0; l < 32; ++l) {
                const uint8_t a = ql[64 * h + l], b = ql[64 * h + l + 32], hi = qh[32 * h + l];
                u[128 * h + l] = (a & 0xF) | ((hi & 3) << 4);
                u[128 * h + l + 32] = (b & 0xF) | (((hi >> 2) & 3) << 4);
                u[128 * h + l + 64] = (a >> 4) | (((hi >> 4) & 3) << 4);
                u[128 * h + l + 96] = (b >> 4) | (((hi >> 6) & 3) << 4);
            }
    }
}

inline __attribute__((always_inline)) void decode(ggml_type t, const uint8_t * src, int k, Row & r) {
    if (t == GGML_TYPE_Q8_0) decode_q8_0(src, k, r);
    else if (t == GGML_TYPE_Q4_K) decode_q4_k(src, k, r);
    else decode_q6_k(src, k, r);
}

// Asks for the row PREFETCH_ROWS ahead (into L1) while this one is computed: one row at a time is
// a short stream (under 1 kB for a 896-wide Q8_0 row) that the hardware prefetcher alone does not
// keep ahead of. Measured, 1 thread, Q8_0 151936 x 896, 4 rows: no prefetch 44 ms, 4 rows ahead
// (non-temporal) 38, 16 rows ahead into L1 29-31, 32 rows 28-30; ggml 37-49.
constexpr int PREFETCH_ROWS = 16;

inline __attribute__((always_inline)) void prefetch_ahead(const ggml_tensor * w, int64_t r, int64_t r1) {
    if (r + PREFETCH_ROWS >= r1) return;
    const char * p = (const char *) w->data + (r + PREFETCH_ROWS) * w->nb[1];
    for (size_t off = 0; off < w->nb[1]; off += 64) __builtin_prefetch(p + off, 0, 3);
}

// ---- plain C++ ----

void rows_generic(const ggml_tensor * w, const Acts & a, float * dst, int64_t r0, int64_t r1) {
    const ggml_type t = w->type;
    const int k = a.k, n = a.n, S = a.step;
    const int64_t n_vocab = w->ne[1];
    thread_local Row tls_row;
    Row & row = tls_row;   // the TLS address taken once
    row.resize(k);
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t * src = (const uint8_t *) w->data + r * w->nb[1];
        prefetch_ahead(w, r, r1);
        if (t == GGML_TYPE_F16) {
            const int fs = S / 4;
            for (int c = 0; c < n; ++c) {
                float s = 0.0f;
                for (int v = 0; v < k; ++v)
                    s += half_to_float(read_u16(src + 2 * v)) * a.f[((size_t) (v / fs) * n + c) * fs + v % fs];
                dst[c * n_vocab + r] = s;
            }
            continue;
        }
        decode(t, src, k, row);
        for (int c = 0; c < n; ++c) {
            float s = 0.0f;
            for (int v = 0; v < k; v += 4) {
                const size_t at = ((size_t) (v / S) * n + c) * S + v % S;
                int32_t p = a.corr[at / 4];
                for (int j = 0; j < 4; ++j) p += row.u[v + j] * a.q[at + j];
                s += row.ls[v / 4] * a.d[at / 4] * (float) p;
            }
            if (t == GGML_TYPE_Q4_K)
                for (int b = 0; b < k / QK; ++b) s -= row.mins[b] * a.dsum[(size_t) c * (k / QK) + b];
            dst[c * n_vocab + r] = s;
        }
    }
}

#ifdef DIFFUSE_HEAD_X86
// GCC 12's AVX-512 headers pass an "undefined" register to some intrinsics (cvtph_ps, the 256-bit
// inserts and extracts), which -Wall reports as uninitialised.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// ---- AVX2 (32 values per step) ----

TARGET_AVX2 inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The sums of N accumulators into dst[c * stride]; eight at once by a tree of adds (a third of the
// instructions of eight separate sums, which cost as much as a third of a 896-wide row's products).
template <int N>
TARGET_AVX2 inline void store_sums(const __m256 * acc, float * dst, int64_t stride) {
    if (N == 8) {
        const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
        const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
        // a: (0 1 2 3 | 0 1 2 3) partial sums of accumulators 0-3 in each half; b: of 4-7
        const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
        alignas(32) float out[8];
        _mm256_store_ps(out, sum);
        for (int c = 0; c < 8; ++c) dst[c * stride] = out[c];
    } else {
        for (int c = 0; c < N; ++c) dst[c * stride] = hsum(acc[c]);
    }
}

// Rows c0 .. c0+N of the activations against one weight row, 32 values per step: a decoded row
// (w), or for Q8_0 (SIGNED) the row's blocks as stored (src), |w| and w's signs taken per block.
template <int N, bool SIGNED>
TARGET_AVX2 void cols_avx2(const Row & w, const uint8_t * src, const Acts & a, int c0, bool mins, float * dst,
                           int64_t stride) {
    const int k = a.k, n = a.n;
    __m256 acc[N];
    for (int c = 0; c < N; ++c) acc[c] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t * q = a.q.data() + c0 * 32;
    const int32_t * corr = a.corr.data() + c0 * 8;
    const float * d = a.d.data() + c0 * 8;
    for (int i = 0; i < k / 32; ++i, q += n * 32, corr += n * 8, d += n * 8) {
        __m256i u, s;
        __m256 ls;
        if (SIGNED) {
            const uint8_t * blk = src + i * Q8_0_BYTES;
            s = _mm256_loadu_si256((const __m256i *) (blk + 2));
            u = _mm256_abs_epi8(s);   // |-128| = 128 as unsigned
            ls = _mm256_set1_ps(_cvtsh_ss(read_u16(blk)));
        } else {
            u = s = _mm256_loadu_si256((const __m256i *) (w.u.data() + 32 * i));
            ls = _mm256_loadu_ps(w.ls.data() + 8 * i);
        }
#pragma GCC unroll 8
        for (int c = 0; c < N; ++c) {
            __m256i x = _mm256_loadu_si256((const __m256i *) (q + 32 * c));
            if (SIGNED) x = _mm256_sign_epi8(x, s);
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones);
            if (!SIGNED) p = _mm256_add_epi32(p, _mm256_loadu_si256((const __m256i *) (corr + 8 * c)));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(ls, _mm256_loadu_ps(d + 8 * c)), acc[c]);
        }
    }
    if (mins)   // Q4_K: minus dmin x m x the block's sum, 8 blocks at a time (rows of 256)
        for (int b = 0; b < k / QK; b += 8) {
            const __m256 m = _mm256_loadu_ps(w.mins.data() + b);
#pragma GCC unroll 8
            for (int c = 0; c < N; ++c)
                acc[c] = _mm256_fnmadd_ps(m, _mm256_loadu_ps(a.dsum.data() + (size_t) (c0 + c) * (k / QK) + b), acc[c]);
        }
    store_sums<N>(acc, dst, stride);
}

template <int N>
TARGET_AVX2 void cols_f16_avx2(const Row &, const uint8_t * src, const Acts & a, int c0, bool, float * dst,
                               int64_t stride) {
    const int k = a.k, n = a.n;
    __m256 acc[N];
    for (int c = 0; c < N; ++c) acc[c] = _mm256_setzero_ps();
    const float * x = a.f.data() + c0 * 8;
    for (int i = 0; i < k / 8; ++i, x += n * 8) {
        const __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (src + 16 * i)));
#pragma GCC unroll 8
        for (int c = 0; c < N; ++c) acc[c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 8 * c), acc[c]);
    }
    store_sums<N>(acc, dst, stride);
}

using ColsFn = void (*)(const Row &, const uint8_t *, const Acts &, int, bool, float *, int64_t);

template <template <int> class Table, class Fn>
inline Fn pick(int n) {
    static constexpr Fn fns[NC + 1] = {nullptr, Table<1>::fn, Table<2>::fn, Table<3>::fn, Table<4>::fn,
                                       Table<5>::fn, Table<6>::fn, Table<7>::fn, Table<8>::fn};
    return fns[n];
}

template <int N> struct Avx2Signed { static constexpr ColsFn fn = cols_avx2<N, true>; };
template <int N> struct Avx2Unsigned { static constexpr ColsFn fn = cols_avx2<N, false>; };
template <int N> struct Avx2F16 { static constexpr ColsFn fn = cols_f16_avx2<N>; };

// The rows [r0, r1) one at a time: each prepared once (decoded where its kernel reads a Row), then
// each chunk of NC activation rows against it. Inlined into each instruction set's rows_ function;
// `cols` picks the kernel for a chunk. (Tiles of 4 weight rows, to keep a chunk of 32 activation
// rows in L1 across them, measured no faster: 144-198 against 144-204 ms for 32 rows.)
template <bool VNNI>
inline __attribute__((always_inline)) void by_rows(const ggml_tensor * w, const Acts & a, float * dst, int64_t r0,
                                                   int64_t r1, ColsFn (*cols)(int)) {
    const ggml_type t = w->type;
    const int k = a.k;
    const int64_t n_vocab = w->ne[1];
    const bool mins = t == GGML_TYPE_Q4_K;
    thread_local Row tls_row;
    Row & row = tls_row;   // the TLS address taken once
    row.resize(k);
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t * src = (const uint8_t *) w->data + r * w->nb[1];
        prefetch_ahead(w, r, r1);
        if (VNNI && t == GGML_TYPE_Q4_K) decode_q4_k_scales(src, k, row);   // the rest in registers
        if (!VNNI && (t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q6_K)) decode(t, src, k, row);
        for (int c0 = 0; c0 < a.n; c0 += NC)
            cols(std::min(NC, a.n - c0))(row, src, a, c0, mins, dst + c0 * n_vocab + r, n_vocab);
    }
}

TARGET_AVX2 void rows_avx2(const ggml_tensor * w, const Acts & a, float * dst, int64_t r0, int64_t r1) {
    // Q8_0 is read as stored; F16 converted in registers.
    by_rows<false>(w, a, dst, r0, r1,
                    w->type == GGML_TYPE_F16 ? pick<Avx2F16, ColsFn>
                    : w->type == GGML_TYPE_Q8_0 ? pick<Avx2Signed, ColsFn> : pick<Avx2Unsigned, ColsFn>);
}

// ---- AVX-512 VNNI (64 values per step; rows of a multiple of 64) ----

// Eight 16-float accumulators halved to 8-float ones, then summed as AVX2's.
template <int N>
TARGET_VNNI inline void store_sums(const __m512 * acc, float * dst, int64_t stride) {
    if (N == 8) {
        __m256 half[8];
        for (int c = 0; c < 8; ++c)
            half[c] = _mm256_add_ps(_mm512_castps512_ps256(acc[c]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[c]), 1)));
        store_sums<8>(half, dst, stride);
    } else {
        for (int c = 0; c < N; ++c) dst[c * stride] = _mm512_reduce_add_ps(acc[c]);
    }
}

// One step of 64 values for N activation rows: acc[c] += ls x d_c x (u . x_c + corr_c), lane by lane.
template <int N>
TARGET_VNNI inline __attribute__((always_inline)) void step_vnni(__m512i u, __m512 ls, const int8_t * q,
                                                                const int32_t * corr, const float * d, __m512 * acc) {
#pragma GCC unroll 8
    for (int c = 0; c < N; ++c) {
        const __m512i p = _mm512_dpbusd_epi32(_mm512_loadu_si512(corr + 16 * c), u, _mm512_loadu_si512(q + 64 * c));
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(ls, _mm512_loadu_ps(d + 16 * c)), acc[c]);
    }
}

// The weight's format: its stored blocks are unpacked in registers, with no trip through memory
// (Q4_K's 6-bit scales and mins come decoded in the Row).
enum Fmt { Q8_0_RAW, Q4_K_RAW, Q6_K_RAW };

// As cols_avx2, 64 values per step.
template <int N, int FMT>
TARGET_VNNI void cols_vnni(const Row & w, const uint8_t * src, const Acts & a, int c0, bool mins, float * dst,
                           int64_t stride) {
    const int k = a.k, n = a.n;
    __m512 acc[N];
    for (int c = 0; c < N; ++c) acc[c] = _mm512_setzero_ps();
    const int8_t * q = a.q.data() + c0 * 64;
    const int32_t * corr = a.corr.data() + c0 * 16;
    const float * d = a.d.data() + c0 * 16;
    const __m512i flip = _mm512_set1_epi8((char) 0x80), low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(3);
    const __m256i low4_256 = _mm256_set1_epi8(0x0F);
    // Lane j (values 4j..4j+3) of step g of a superblock takes scale 2g + j/8 (Q4_K, blocks of 32)
    // or 4g + j/4 (Q6_K, blocks of 16).
    const __m512i q4_lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i q6_lanes = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    if (FMT == Q4_K_RAW || FMT == Q6_K_RAW) {
        for (int sb = 0; sb < k / 256; ++sb) {
            const uint8_t * blk = src + sb * (FMT == Q4_K_RAW ? Q4_K_BYTES : Q6_K_BYTES);
            const __m512 scales = FMT == Q4_K_RAW
                ? _mm512_castps256_ps512(_mm256_loadu_ps(w.sc.data() + 8 * sb))
                : _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(read_u16(blk + 208))),
                                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *) (blk + 192)))));
            for (int g = 0; g < 4; ++g, q += n * 64, corr += n * 16, d += n * 16) {
                __m512i u;
                __m512 ls;
                if (FMT == Q4_K_RAW) {   // 32 bytes: low nibbles block 2g, high nibbles block 2g + 1
                    const __m256i qs = _mm256_loadu_si256((const __m256i *) (blk + 16 + 32 * g));
                    u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(qs, low4_256)),
                                           _mm256_and_si256(_mm256_srli_epi16(qs, 4), low4_256), 1);
                    ls = _mm512_permutexvar_ps(_mm512_add_epi32(q4_lanes, _mm512_set1_epi32(2 * g)), scales);
                } else {   // values 128h + 64hi + (0..63): ql's low (hi 0) or high nibbles, 2 bits of qh each
                    const int h = g / 2, hi = g % 2;
                    const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
                    const __m256i qh = _mm256_loadu_si256((const __m256i *) (blk + 128 + 32 * h));
                    const __m512i qh2 = hi ? _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(qh, 4)),
                                                                _mm256_srli_epi16(qh, 6), 1)
                                           : _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
                    const __m512i lo = _mm512_and_si512(hi ? _mm512_srli_epi16(ql, 4) : ql, low4);
                    u = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(qh2, low2), 4));
                    ls = _mm512_permutexvar_ps(_mm512_add_epi32(q6_lanes, _mm512_set1_epi32(4 * g)), scales);
                }
                step_vnni<N>(u, ls, q, corr, d, acc);
            }
        }
    } else {   // Q8_0: two blocks per step
        for (int i = 0; i < k / 64; ++i, q += n * 64, corr += n * 16, d += n * 16) {
            const uint8_t * b0 = src + 2 * i * Q8_0_BYTES, * b1 = b0 + Q8_0_BYTES;
            __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) (b0 + 2))),
                                           _mm256_loadu_si256((const __m256i *) (b1 + 2)), 1);
            u = _mm512_xor_si512(u, flip);   // w + 128
            const __m512 ls = _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castps_pd(_mm512_set1_ps(_cvtsh_ss(read_u16(b0)))),
                _mm256_castps_pd(_mm256_set1_ps(_cvtsh_ss(read_u16(b1)))), 1));
            step_vnni<N>(u, ls, q, corr, d, acc);
        }
    }
    if (mins)   // Q4_K: minus dmin x m x the block's sum, 16 blocks at a time (8 in the last of an odd count)
        for (int b = 0; b < k / QK; b += 16) {
            const __mmask16 live = k / QK - b >= 16 ? 0xFFFF : 0x00FF;
            const __m512 m = _mm512_maskz_loadu_ps(live, w.mins.data() + b);
#pragma GCC unroll 8
            for (int c = 0; c < N; ++c)
                acc[c] = _mm512_fnmadd_ps(m, _mm512_maskz_loadu_ps(live, a.dsum.data() + (size_t) (c0 + c) * (k / QK) + b),
                                          acc[c]);
        }
    store_sums<N>(acc, dst, stride);
}

template <int N>
TARGET_VNNI void cols_f16_vnni(const Row &, const uint8_t * src, const Acts & a, int c0, bool, float * dst,
                               int64_t stride) {
    const int k = a.k, n = a.n;
    __m512 acc[N];
    for (int c = 0; c < N; ++c) acc[c] = _mm512_setzero_ps();
    const float * x = a.f.data() + c0 * 16;
    for (int i = 0; i < k / 16; ++i, x += n * 16) {
        const __m512 wv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (src + 32 * i)));
#pragma GCC unroll 8
        for (int c = 0; c < N; ++c) acc[c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + 16 * c), acc[c]);
    }
    store_sums<N>(acc, dst, stride);
}

template <int N> struct VnniQ8 { static constexpr ColsFn fn = cols_vnni<N, Q8_0_RAW>; };
template <int N> struct VnniQ4K { static constexpr ColsFn fn = cols_vnni<N, Q4_K_RAW>; };
template <int N> struct VnniQ6K { static constexpr ColsFn fn = cols_vnni<N, Q6_K_RAW>; };
template <int N> struct VnniF16 { static constexpr ColsFn fn = cols_f16_vnni<N>; };

TARGET_VNNI void rows_vnni(const ggml_tensor * w, const Acts & a, float * dst, int64_t r0, int64_t r1) {
    const ggml_type t = w->type;
    by_rows<true>(w, a, dst, r0, r1,
                   t == GGML_TYPE_F16 ? pick<VnniF16, ColsFn> : t == GGML_TYPE_Q8_0 ? pick<VnniQ8, ColsFn>
                   : t == GGML_TYPE_Q4_K ? pick<VnniQ4K, ColsFn> : pick<VnniQ6K, ColsFn>);
}

#pragma GCC diagnostic pop
#endif  // DIFFUSE_HEAD_X86

enum class Isa { generic, avx2, vnni };

Isa cpu_isa() {
#ifdef DIFFUSE_HEAD_X86
    static const Isa isa = [] {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
            return Isa::vnni;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
            return Isa::avx2;
        return Isa::generic;
    }();
    return isa;
#else
    return Isa::generic;
#endif
}

// The instruction set for this weight: the CPU's, or a lower one DIFFUSE_HEAD_ISA names (tests
// reach every path on one machine); AVX-512's 64-value steps need rows of a multiple of 64.
Isa isa_for(const ggml_tensor * w) {
    Isa isa = cpu_isa();
    if (const char * env = std::getenv("DIFFUSE_HEAD_ISA")) {
        const std::string want = env;
        if (want == "generic") isa = Isa::generic;
        else if (want == "avx2" && isa == Isa::vnni) isa = Isa::avx2;
    }
    return isa == Isa::vnni && w->ne[0] % 64 != 0 ? Isa::avx2 : isa;
}

void head_op(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * w = dst->src[0], * x = dst->src[1];
    const int64_t m = w->ne[1];
    // Contiguous vocabulary ranges, 16-row aligned so no two threads write one cache line of a row.
    const int64_t per = ((m + nth - 1) / nth + 15) / 16 * 16;
    const int64_t r0 = std::min(m, ith * per), r1 = std::min(m, r0 + per);
    if (r0 < r1) head_product(w, (const float *) x->data, (int) x->ne[1], (float *) dst->data, r0, r1);
}

}  // namespace

bool head_product_supports(const ggml_tensor * w) {
    if (!w || !w->data || ggml_n_dims(w) != 2 || !ggml_is_contiguous(w)) return false;
    if (w->buffer && (!ggml_backend_buffer_is_host(w->buffer) ||
                      ggml_backend_buffer_get_type(w->buffer) == cpu_repack_buffer_type()))
        return false;   // repacked: ggml's interleaved layout
    switch (w->type) {
        case GGML_TYPE_Q8_0: return ggml_type_size(w->type) == Q8_0_BYTES && w->ne[0] % QK == 0;
        case GGML_TYPE_Q4_K: return ggml_type_size(w->type) == Q4_K_BYTES && w->ne[0] % 256 == 0;
        case GGML_TYPE_Q6_K: return ggml_type_size(w->type) == Q6_K_BYTES && w->ne[0] % 256 == 0;
        case GGML_TYPE_F16: return w->ne[0] % 16 == 0;
        default: return false;
    }
}

void head_product(const ggml_tensor * w, const float * x, int n, float * dst, int64_t r0, int64_t r1) {
    const Isa isa = isa_for(w);
    const int k = (int) w->ne[0];
    thread_local Acts tls_acts;
    Acts & acts = tls_acts;
    quantise_acts(x, n, k, offset_of(w->type, isa == Isa::avx2), w->type == GGML_TYPE_F16, isa == Isa::vnni ? 64 : 32,
                  acts);
    switch (isa) {
#ifdef DIFFUSE_HEAD_X86
        case Isa::vnni: rows_vnni(w, acts, dst, r0, r1); return;
        case Isa::avx2: rows_avx2(w, acts, dst, r0, r1); return;
#endif
        default: rows_generic(w, acts, dst, r0, r1);
    }
}

ggml_tensor * head_product_op(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    if (!ggml_is_contiguous(x)) x = ggml_cont(ctx, x);
    ggml_tensor * args[] = {w, x};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, 2, head_op, GGML_N_TASKS_MAX, nullptr);
}

const char * head_product_isa() {
    switch (cpu_isa()) {
        case Isa::vnni: return "avx512vnni";
        case Isa::avx2: return "avx2";
        default: return "generic";
    }
}

HeadTimes time_head(const ggml_tensor * w, int n, int n_threads, int reps) {
    if (!head_product_supports(w) || n < 1 || n > HEAD_PRODUCT_MAX_ROWS) throw Error("time_head: not a head product");
    ggml_init_params ip = {ggml_tensor_overhead() * 8 + 2 * ggml_graph_overhead(), nullptr, /*no_alloc*/ true};
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx(ggml_init(ip), ggml_free);
    ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, w->ne[0], n);
    ggml_tensor * wt = const_cast<ggml_tensor *>(w);   // read only
    ggml_cgraph * g_ggml = ggml_new_graph(ctx.get()), * g_own = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(g_ggml, ggml_mul_mat(ctx.get(), wt, x));
    ggml_build_forward_expand(g_own, head_product_op(ctx.get(), wt, x));
    std::unique_ptr<ggml_backend, decltype(&ggml_backend_free)> cpu(ggml_backend_cpu_init(), ggml_backend_free);
    std::unique_ptr<ggml_backend_buffer, decltype(&ggml_backend_buffer_free)> buf(
        ggml_backend_alloc_ctx_tensors(ctx.get(), cpu.get()), ggml_backend_buffer_free);
    if (!cpu || !buf) throw Error("time_head: out of memory");
    std::mt19937 gen(0);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> xf((size_t) w->ne[0] * n);
    for (float & v : xf) v = dist(gen);
    ggml_backend_tensor_set(x, xf.data(), 0, xf.size() * sizeof(float));
    ggml_backend_cpu_set_n_threads(cpu.get(), std::max(1, n_threads));
    auto run = [&](ggml_cgraph * g) {
        const auto t0 = std::chrono::steady_clock::now();
        if (ggml_backend_graph_compute(cpu.get(), g) != GGML_STATUS_SUCCESS) throw Error("time_head: compute failed");
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    run(g_ggml);
    run(g_own);
    HeadTimes best{1e30, 1e30};
    for (int r = 0; r < reps; ++r) {
        best.ggml = std::min(best.ggml, run(g_ggml));
        best.own = std::min(best.own, run(g_own));
    }
    return best;
}

bool HeadChoice::own(const ggml_tensor * w, int n, int n_threads) const {
    const bool can = head_product_supports(w) && n >= 1 && n <= HEAD_PRODUCT_MAX_ROWS;
    const char * env = std::getenv("DIFFUSE_HEAD");
    const std::string mode = env ? env : "auto";
    if (mode == "ggml") return false;
    if (mode == "own") return can;
    if (mode != "auto" && !mode.empty())
        throw Error("DIFFUSE_HEAD is '" + mode + "': expected own, ggml or auto");
    if (!can || ggml_nbytes(w) < ((size_t) 16 << 20)) return false;
    int bucket = 0;
    while ((1 << bucket) < n) ++bucket;
    std::lock_guard<std::mutex> lock(mu_);
    if (decided_[bucket] < 0) {
        try {
            const HeadTimes t = time_head(w, 1 << bucket, n_threads, 3);
            decided_[bucket] = t.own < 0.95 * t.ggml;
        } catch (const std::exception &) {
            decided_[bucket] = 0;   // timing failed (out of memory): the pass still runs, on ggml's product
        }
    }
    return decided_[bucket] == 1;
}

}  // namespace diffuse
