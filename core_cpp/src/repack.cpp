#include "repack.h"

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cstring>
#include <memory>

namespace diffuse {

ggml_backend_buffer_type * cpu_repack_buffer_type() {
    static ggml_backend_buffer_type * buft = [] () -> ggml_backend_buffer_type * {
        ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        if (!dev) return nullptr;
        auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
        if (!get_extra) return nullptr;
        for (ggml_backend_buffer_type_t * b = get_extra(dev); b && *b; ++b)
            if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
        return nullptr;
    }();
    return buft;
}

bool can_repack(ggml_tensor * weight) {
    ggml_backend_buffer_type * buft = cpu_repack_buffer_type();
    if (!buft || ggml_n_dims(weight) != 2 || weight->buffer) return false;
    // Ask the CPU device, as llama.cpp does: a mat-mul whose weight sits in an (empty) repack buffer.
    ggml_init_params ip = {ggml_tensor_overhead() * 2, nullptr, /*no_alloc*/ true};
    std::unique_ptr<ggml_context, decltype(&ggml_free)> ctx(ggml_init(ip), ggml_free);
    ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, weight->ne[0], 512);
    ggml_tensor * op = ggml_mul_mat(ctx.get(), weight, x);
    std::unique_ptr<ggml_backend_buffer, decltype(&ggml_backend_buffer_free)> probe(
        ggml_backend_buft_alloc_buffer(buft, 0), ggml_backend_buffer_free);
    weight->buffer = probe.get();
    const bool ok = ggml_backend_dev_supports_op(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), op);
    weight->buffer = nullptr;
    return ok;
}

}  // namespace diffuse
