#include "diffuse.h"
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
