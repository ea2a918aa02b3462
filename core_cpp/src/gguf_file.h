// A GGUF file opened through ggml's reader, with getters that check types instead of asserting.
// ggml's gguf_get_val_* abort on a type mismatch; a hostile file must only ever raise diffuse::Error.
#pragma once

#include "diffuse.h"

#include <optional>
#include <string>
#include <vector>

struct gguf_context;
struct ggml_context;

namespace diffuse {

class GGUFFile {
public:
    // with_tensors: also create a no-alloc ggml context holding one tensor per GGUF tensor.
    GGUFFile(const std::string & path, bool with_tensors);
    ~GGUFFile();
    GGUFFile(const GGUFFile &) = delete;
    GGUFFile & operator=(const GGUFFile &) = delete;

    const std::string & path() const { return path_; }
    gguf_context * gguf() const { return gguf_; }
    ggml_context * tensors() const { return meta_; }
    uint64_t file_size() const { return file_size_; }
    size_t data_offset() const;

    bool has(const std::string & key) const;
    std::optional<int64_t>     get_int(const std::string & key) const;     // any integer type
    std::optional<double>      get_float(const std::string & key) const;   // any numeric type
    std::optional<bool>        get_bool(const std::string & key) const;
    std::optional<std::string> get_string(const std::string & key) const;
    // An array of integers or bools (per-layer keys), or one such value repeated n times; a length
    // other than n fails.
    std::optional<std::vector<int64_t>> get_int_array(const std::string & key, size_t n) const;

    // "<path>: <what>" as a diffuse::Error.
    [[noreturn]] void fail(const std::string & what) const;

private:
    std::string path_;
    gguf_context * gguf_ = nullptr;
    ggml_context * meta_ = nullptr;
    uint64_t file_size_ = 0;
};

// Messages ggml logged on this thread since the last call (used to explain a failed parse).
std::string take_ggml_log();
void install_ggml_log();

}  // namespace diffuse
