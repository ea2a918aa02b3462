#include "gguf_file.h"

#include "ggml.h"
#include "gguf.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

namespace diffuse {

// ---- ggml log capture: errors become part of our exception messages, not stray stderr ----

static thread_local std::string g_log;

static void log_to_buffer(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_CONT) {
        if (g_log.size() < 4096) g_log += text;
    }
    if (std::getenv("DIFFUSE_VERBOSE")) fputs(text, stderr);
}

void install_ggml_log() {
    static std::once_flag once;
    std::call_once(once, [] { ggml_log_set(log_to_buffer, nullptr); });
}

std::string take_ggml_log() {
    std::string s;
    s.swap(g_log);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

// ggml's log lines as one line for a message: innermost cause last in the log, first here,
// without the C function names ("gguf_init_from_reader: failed to read key-value pairs").
static std::string log_as_one_line(const std::string & log) {
    std::vector<std::string> causes;
    size_t start = 0;
    while (start <= log.size()) {
        size_t end = log.find('\n', start);
        if (end == std::string::npos) end = log.size();
        std::string line = log.substr(start, end - start);
        const size_t colon = line.find(": ");
        if (colon != std::string::npos && colon > 0 &&
            line.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == colon)
            line = line.substr(colon + 2);
        while (!line.empty() && line.back() == ' ') line.pop_back();
        if (!line.empty()) causes.push_back(line);
        start = end + 1;
    }
    std::string s;
    for (auto it = causes.rbegin(); it != causes.rend(); ++it) s += (s.empty() ? "" : "; ") + *it;
    return s;
}

// ---- GGUFFile ----

GGUFFile::GGUFFile(const std::string & path, bool with_tensors) : path_(path) {
    install_ggml_log();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) fail("no such file");
    file_size_ = std::filesystem::file_size(path, ec);
    if (ec) fail("cannot read the file size: " + ec.message());
    if (file_size_ < 24) fail("file is too small to be a GGUF model (" + std::to_string(file_size_) + " bytes)");

    take_ggml_log();
    gguf_init_params params = {/*no_alloc*/ true, with_tensors ? &meta_ : nullptr};
    gguf_ = gguf_init_from_file(path.c_str(), params);
    if (!gguf_) {
        const std::string why = log_as_one_line(take_ggml_log());
        fail("not a valid GGUF file" + (why.empty() ? std::string() : ": " + why));
    }
}

GGUFFile::~GGUFFile() {
    if (meta_) ggml_free(meta_);
    if (gguf_) gguf_free(gguf_);
}

void GGUFFile::fail(const std::string & what) const { throw Error(path_ + ": " + what); }

size_t GGUFFile::data_offset() const { return gguf_get_data_offset(gguf_); }

bool GGUFFile::has(const std::string & key) const { return gguf_find_key(gguf_, key.c_str()) >= 0; }

std::optional<int64_t> GGUFFile::get_int(const std::string & key) const {
    const int64_t id = gguf_find_key(gguf_, key.c_str());
    if (id < 0) return std::nullopt;
    switch (gguf_get_kv_type(gguf_, id)) {
        case GGUF_TYPE_UINT8:  return gguf_get_val_u8(gguf_, id);
        case GGUF_TYPE_INT8:   return gguf_get_val_i8(gguf_, id);
        case GGUF_TYPE_UINT16: return gguf_get_val_u16(gguf_, id);
        case GGUF_TYPE_INT16:  return gguf_get_val_i16(gguf_, id);
        case GGUF_TYPE_UINT32: return gguf_get_val_u32(gguf_, id);
        case GGUF_TYPE_INT32:  return gguf_get_val_i32(gguf_, id);
        case GGUF_TYPE_UINT64: {
            const uint64_t v = gguf_get_val_u64(gguf_, id);
            if (v > (uint64_t) INT64_MAX) fail("key " + key + " is out of range");
            return (int64_t) v;
        }
        case GGUF_TYPE_INT64:  return gguf_get_val_i64(gguf_, id);
        default: fail("key " + key + " should be an integer but has type " +
                      gguf_type_name(gguf_get_kv_type(gguf_, id)));
    }
}

std::optional<double> GGUFFile::get_float(const std::string & key) const {
    const int64_t id = gguf_find_key(gguf_, key.c_str());
    if (id < 0) return std::nullopt;
    switch (gguf_get_kv_type(gguf_, id)) {
        case GGUF_TYPE_FLOAT32: return gguf_get_val_f32(gguf_, id);
        case GGUF_TYPE_FLOAT64: return gguf_get_val_f64(gguf_, id);
        default: return (double) *get_int(key);
    }
}

std::optional<bool> GGUFFile::get_bool(const std::string & key) const {
    const int64_t id = gguf_find_key(gguf_, key.c_str());
    if (id < 0) return std::nullopt;
    if (gguf_get_kv_type(gguf_, id) == GGUF_TYPE_BOOL) return gguf_get_val_bool(gguf_, id);
    return *get_int(key) != 0;
}

std::optional<std::vector<int64_t>> GGUFFile::get_int_array(const std::string & key, size_t n) const {
    const int64_t id = gguf_find_key(gguf_, key.c_str());
    if (id < 0) return std::nullopt;
    if (gguf_get_kv_type(gguf_, id) != GGUF_TYPE_ARRAY) {
        if (gguf_get_kv_type(gguf_, id) == GGUF_TYPE_BOOL) return std::vector<int64_t>(n, *get_bool(key));
        return std::vector<int64_t>(n, *get_int(key));
    }
    if (gguf_get_arr_n(gguf_, id) != n)
        fail("key " + key + " has " + std::to_string(gguf_get_arr_n(gguf_, id)) + " values, expected " +
             std::to_string(n) + " (one per layer)");
    const void * data = gguf_get_arr_data(gguf_, id);
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) {
        switch (gguf_get_arr_type(gguf_, id)) {
            case GGUF_TYPE_BOOL:   out[i] = ((const int8_t *) data)[i] != 0; break;
            case GGUF_TYPE_UINT8:  out[i] = ((const uint8_t *) data)[i]; break;
            case GGUF_TYPE_INT8:   out[i] = ((const int8_t *) data)[i]; break;
            case GGUF_TYPE_UINT16: out[i] = ((const uint16_t *) data)[i]; break;
            case GGUF_TYPE_INT16:  out[i] = ((const int16_t *) data)[i]; break;
            case GGUF_TYPE_UINT32: out[i] = ((const uint32_t *) data)[i]; break;
            case GGUF_TYPE_INT32:  out[i] = ((const int32_t *) data)[i]; break;
            default: fail("key " + key + " should be an array of integers or bools but holds " +
                          gguf_type_name(gguf_get_arr_type(gguf_, id)));
        }
    }
    return out;
}

std::optional<std::string> GGUFFile::get_string(const std::string & key) const {
    const int64_t id = gguf_find_key(gguf_, key.c_str());
    if (id < 0) return std::nullopt;
    if (gguf_get_kv_type(gguf_, id) != GGUF_TYPE_STRING) fail("key " + key + " should be a string");
    return std::string(gguf_get_val_str(gguf_, id));
}

}  // namespace diffuse
