// The output head for few rows: logits = W x for a (n_embd, n_vocab) weight W and up to
// HEAD_PRODUCT_MAX_ROWS activation rows. ggml's mat-mul streams W once per row it is given (a
// 152k x 896 Q8_0 head: 5.4 ms for 1 row, 23 ms for 8 on 2 threads); this product decodes each
// weight row once and feeds every activation row's dot product from it, so a few rows cost about
// what one costs. The activations are quantised to 8 bits per block of 32 (a float scale each), as
// ggml does for its quantised products; F16 weights multiply F32 activations.
//
// Which product a pass uses is measured per model and machine on first use (head_product_faster),
// or forced with DIFFUSE_HEAD=own|ggml (benchmarks, tests).
#pragma once

#include <cstdint>
#include <mutex>

struct ggml_context;
struct ggml_tensor;

namespace diffuse {

constexpr int HEAD_PRODUCT_MAX_ROWS = 32;

// Whether head_product computes this weight: Q8_0, Q4_K, Q6_K or F16 in ggml's plain layout
// (not repacked), rows a whole number of blocks.
bool head_product_supports(const ggml_tensor * w);

// dst[c * n_vocab + r] = (W x_c)[r] for vocabulary rows r in [r0, r1), c < n (<= HEAD_PRODUCT_MAX_ROWS);
// x: n rows of n_embd floats. Uses AVX-512 VNNI, AVX2 or plain C++, as this CPU allows.
void head_product(const ggml_tensor * w, const float * x, int n, float * dst, int64_t r0, int64_t r1);

// The graph node computing W x (x: F32 (n_embd, n)) with head_product, the vocabulary split
// across the pass's threads: F32 (n_vocab, n), the same as ggml_mul_mat(ctx, w, x).
ggml_tensor * head_product_op(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

// Which product a model's head uses for a pass of n logit rows. DIFFUSE_HEAD=own or ggml forces
// one (own only where head_product applies); unset or auto, each power-of-two bucket of n is
// timed once, both products alternated on the model's own weight at the first pass's thread count,
// and head_product is kept where it beats ggml's by more than 5% (a near tie keeps ggml's, so the
// choice does not flip between runs). A head that fits in a core's cache (under 16 MiB) keeps
// ggml's: the saving is in streaming the matrix from memory once, and a product of microseconds
// cannot be timed reliably. Thread-safe (a model is shared by its contexts).
class HeadChoice {
public:
    bool own(const ggml_tensor * w, int n, int n_threads) const;
private:
    mutable std::mutex mu_;
    mutable int8_t decided_[6] = {-1, -1, -1, -1, -1, -1};   // n in (2^(i-1), 2^i]: -1 not yet, 0 ggml, 1 own
};

// Best wall time (s) of `reps` products W x, x (k, n) random F32, by head_product (own) or
// ggml_mul_mat, alternated with the other after a warm-up of each: {ggml, own}.
struct HeadTimes { double ggml, own; };
HeadTimes time_head(const ggml_tensor * w, int n, int n_threads, int reps);

// The instruction set head_product runs on this CPU: "avx512vnni", "avx2" or "generic".
const char * head_product_isa();

}  // namespace diffuse
