#include "diffuse.h"

#include "ggml.h"

namespace diffuse {

std::vector<uint8_t> quantize_rows(const float * data, int64_t n_rows, int64_t n_cols, int type_id) {
    if (type_id < 0 || type_id >= GGML_TYPE_COUNT) throw Error("unknown ggml type " + std::to_string(type_id));
    const ggml_type type = (ggml_type) type_id;
    if (ggml_type_size(type) == 0 || ggml_blck_size(type) <= 0) throw Error("unusable ggml type " + std::to_string(type_id));
    if (n_cols % ggml_blck_size(type) != 0)
        throw Error(std::string("row length ") + std::to_string(n_cols) + " is not a multiple of the " +
                    ggml_type_name(type) + " block size " + std::to_string(ggml_blck_size(type)));
    if (ggml_quantize_requires_imatrix(type))
        throw Error(std::string(ggml_type_name(type)) + " needs an importance matrix; not supported");
    std::vector<uint8_t> out(ggml_row_size(type, n_cols) * n_rows);
    ggml_quantize_init(type);
    ggml_quantize_chunk(type, data, out.data(), 0, n_rows, n_cols, nullptr);
    return out;
}

}  // namespace diffuse
