#include "diffuse.h"
#include "head_product.h"
#include "repack.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>

namespace diffuse {

double bench_matmul(int type_id, int64_t k, int64_t m, int64_t n, int n_threads, int reps, bool repack) {
    if (type_id < 0 || type_id >= GGML_TYPE_COUNT) throw Error("unknown ggml type");
    const ggml_type type = (ggml_type) type_id;
    if (k <= 0 || m <= 0 || n <= 0 || reps <= 0) throw Error("bench_matmul: sizes must be positive");
    if (k % ggml_blck_size(type) != 0) throw Error("bench_matmul: k must be a multiple of the block size");

    // The weight in its own context, so it can live in the repack buffer as the model's do.
    ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx_w(ggml_init(ip), ggml_free);
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx(ggml_init(ip), ggml_free);
    ggml_tensor * w = ggml_new_tensor_2d(ctx_w.get(), type, k, m);
    ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, k, n);
    ggml_tensor * y = ggml_mul_mat(ctx.get(), w, x);
    ggml_cgraph * gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, y);

    std::unique_ptr<ggml_backend, decltype(&ggml_backend_free)> cpu(ggml_backend_cpu_init(), ggml_backend_free);
    ggml_backend_buffer_type * w_buft = repack && can_repack(w) ? cpu_repack_buffer_type()
                                                                 : ggml_backend_get_default_buffer_type(cpu.get());
    using Buffer = std::unique_ptr<ggml_backend_buffer, decltype(&ggml_backend_buffer_free)>;
    Buffer w_buf(ggml_backend_alloc_ctx_tensors_from_buft(ctx_w.get(), w_buft), ggml_backend_buffer_free);
    Buffer buf(ggml_backend_alloc_ctx_tensors(ctx.get(), cpu.get()), ggml_backend_buffer_free);
    if (!w_buf || !buf) throw Error("bench_matmul: out of memory");

    std::mt19937 gen(0);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> wf(k * m), xf(k * n);
    for (float & v : wf) v = dist(gen);
    for (float & v : xf) v = dist(gen);
    std::vector<uint8_t> wq = quantize_rows(wf.data(), m, k, type);
    ggml_backend_tensor_set(w, wq.data(), 0, wq.size());
    ggml_backend_tensor_set(x, xf.data(), 0, xf.size() * sizeof(float));

    ggml_backend_cpu_set_n_threads(cpu.get(), n_threads);
    ggml_backend_graph_compute(cpu.get(), gf);   // warm-up
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        ggml_backend_graph_compute(cpu.get(), gf);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

}  // namespace diffuse

namespace diffuse {

// A weight W (m, k) of `type` in its own buffer, plain layout, holding `data` (ggml blocks).
struct OwnedWeight {
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx{nullptr, ggml_free};
    std::unique_ptr<ggml_backend_buffer, decltype(&ggml_backend_buffer_free)> buf{nullptr, ggml_backend_buffer_free};
    ggml_tensor * t = nullptr;
    OwnedWeight(ggml_type type, int64_t k, int64_t m, const uint8_t * data) {
        ggml_init_params ip = {ggml_tensor_overhead() * 2, nullptr, true};
        ctx.reset(ggml_init(ip));
        t = ggml_new_tensor_2d(ctx.get(), type, k, m);
        buf.reset(ggml_backend_alloc_ctx_tensors_from_buft(ctx.get(), ggml_backend_cpu_buffer_type()));
        if (!buf) throw Error("out of memory for a " + std::to_string(m) + " x " + std::to_string(k) + " weight");
        ggml_backend_tensor_set(t, data, 0, ggml_nbytes(t));
    }
};

static void check_head_args(int type_id, int64_t k, int64_t m, int64_t n) {
    if (type_id < 0 || type_id >= GGML_TYPE_COUNT || ggml_type_size((ggml_type) type_id) == 0)
        throw Error("unknown ggml type " + std::to_string(type_id));
    if (k <= 0 || m <= 0 || n <= 0) throw Error("head product: sizes must be positive");
    if (k % ggml_blck_size((ggml_type) type_id) != 0) throw Error("head product: k must be a multiple of the block size");
}

std::pair<double, double> bench_head(int type_id, int64_t k, int64_t m, int64_t n, int n_threads, int reps) {
    check_head_args(type_id, k, m, n);
    if (reps <= 0) throw Error("bench_head: reps must be positive");
    std::mt19937 gen(0);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> wf(k * m);
    for (float & v : wf) v = dist(gen);
    const OwnedWeight w((ggml_type) type_id, k, m, quantize_rows(wf.data(), m, k, type_id).data());
    if (!head_product_supports(w.t)) throw Error(std::string("bench_head: no head product for ") + ggml_type_name(w.t->type));
    const HeadTimes t = time_head(w.t, (int) n, n_threads, reps);
    return {t.ggml, t.own};
}

std::vector<float> head_matmul(int type_id, const uint8_t * data, size_t bytes, int64_t m, int64_t k, const float * xf,
                               int64_t n, bool own, int n_threads) {
    check_head_args(type_id, k, m, n);
    if (bytes != ggml_row_size((ggml_type) type_id, k) * m)
        throw Error("head_matmul: the weight is not " + std::to_string(m) + " rows of " + std::to_string(k) + " " +
                    ggml_type_name((ggml_type) type_id) + " values");
    const OwnedWeight w((ggml_type) type_id, k, m, data);
    if (own && (!head_product_supports(w.t) || n > HEAD_PRODUCT_MAX_ROWS))
        throw Error(std::string("head_matmul: no head product for ") + ggml_type_name(w.t->type) + " x " +
                    std::to_string(n) + " rows");
    ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx(ggml_init(ip), ggml_free);
    ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, k, n);
    ggml_tensor * y = own ? head_product_op(ctx.get(), w.t, x) : ggml_mul_mat(ctx.get(), w.t, x);
    ggml_cgraph * gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, y);
    std::unique_ptr<ggml_backend, decltype(&ggml_backend_free)> cpu(ggml_backend_cpu_init(), ggml_backend_free);
    std::unique_ptr<ggml_backend_buffer, decltype(&ggml_backend_buffer_free)> buf(
        ggml_backend_alloc_ctx_tensors(ctx.get(), cpu.get()), ggml_backend_buffer_free);
    if (!buf) throw Error("head_matmul: out of memory");
    ggml_backend_tensor_set(x, xf, 0, sizeof(float) * k * n);
    ggml_backend_cpu_set_n_threads(cpu.get(), std::max(1, n_threads));
    if (ggml_backend_graph_compute(cpu.get(), gf) != GGML_STATUS_SUCCESS) throw Error("head_matmul: compute failed");
    std::vector<float> out((size_t) n * m);
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    return out;
}

}  // namespace diffuse
