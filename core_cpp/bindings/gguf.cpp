// read_gguf(path): metadata and tensor table of any GGUF file, through ggml's own reader, so the
// CLI, info, converter tests and quantizer see a file exactly as the engine does.
#include "bindings.h"

#include "gguf_dialects.h"
#include "gguf_file.h"

#include "ggml.h"
#include "gguf.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

namespace py = pybind11;

static py::str utf8(const char * s, size_t n) {
    PyObject * o = PyUnicode_DecodeUTF8(s, (Py_ssize_t) n, "replace");
    if (!o) throw py::error_already_set();
    return py::reinterpret_steal<py::str>(o);
}

template <typename T>
static py::array numbers(const void * data, size_t n) {
    py::array_t<T> a(n);
    if (n) std::memcpy(a.mutable_data(), data, n * sizeof(T));
    return a;
}

static py::object scalar(gguf_context * g, int64_t id) {
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_UINT8:   return py::int_(gguf_get_val_u8(g, id));
        case GGUF_TYPE_INT8:    return py::int_(gguf_get_val_i8(g, id));
        case GGUF_TYPE_UINT16:  return py::int_(gguf_get_val_u16(g, id));
        case GGUF_TYPE_INT16:   return py::int_(gguf_get_val_i16(g, id));
        case GGUF_TYPE_UINT32:  return py::int_(gguf_get_val_u32(g, id));
        case GGUF_TYPE_INT32:   return py::int_(gguf_get_val_i32(g, id));
        case GGUF_TYPE_UINT64:  return py::int_(gguf_get_val_u64(g, id));
        case GGUF_TYPE_INT64:   return py::int_(gguf_get_val_i64(g, id));
        case GGUF_TYPE_FLOAT32: return py::float_(gguf_get_val_f32(g, id));
        case GGUF_TYPE_FLOAT64: return py::float_(gguf_get_val_f64(g, id));
        case GGUF_TYPE_BOOL:    return py::bool_(gguf_get_val_bool(g, id));
        case GGUF_TYPE_STRING: {
            const char * s = gguf_get_val_str(g, id);
            return utf8(s, std::strlen(s));
        }
        default: return py::none();
    }
}

static py::object array(gguf_context * g, int64_t id) {
    const size_t n = gguf_get_arr_n(g, id);
    const gguf_type t = gguf_get_arr_type(g, id);
    if (t == GGUF_TYPE_STRING) {
        py::list out(n);
        for (size_t i = 0; i < n; ++i) {
            const char * s = gguf_get_arr_str(g, id, i);
            out[i] = utf8(s, std::strlen(s));
        }
        return out;
    }
    if (t == GGUF_TYPE_ARRAY) return py::none();   // nested arrays: not used by any model key
    const void * d = gguf_get_arr_data(g, id);
    switch (t) {
        case GGUF_TYPE_UINT8:   return numbers<uint8_t>(d, n);
        case GGUF_TYPE_INT8:    return numbers<int8_t>(d, n);
        case GGUF_TYPE_UINT16:  return numbers<uint16_t>(d, n);
        case GGUF_TYPE_INT16:   return numbers<int16_t>(d, n);
        case GGUF_TYPE_UINT32:  return numbers<uint32_t>(d, n);
        case GGUF_TYPE_INT32:   return numbers<int32_t>(d, n);
        case GGUF_TYPE_UINT64:  return numbers<uint64_t>(d, n);
        case GGUF_TYPE_INT64:   return numbers<int64_t>(d, n);
        case GGUF_TYPE_FLOAT32: return numbers<float>(d, n);
        case GGUF_TYPE_FLOAT64: return numbers<double>(d, n);
        case GGUF_TYPE_BOOL:    return numbers<bool>(d, n);
        default: return py::none();
    }
}

static py::dict read_gguf(const std::string & path) {
    diffuse::GGUFFile f(path, /*with_tensors*/ false);
    gguf_context * g = f.gguf();
    py::dict kv, kv_types;
    for (int64_t id = 0; id < gguf_get_n_kv(g); ++id) {
        const char * key_c = gguf_get_key(g, id);
        const py::str key = utf8(key_c, std::strlen(key_c));
        const gguf_type t = gguf_get_kv_type(g, id);
        if (t == GGUF_TYPE_ARRAY) {
            kv[key] = array(g, id);
            kv_types[key] = std::string("array[") + gguf_type_name(gguf_get_arr_type(g, id)) + "]";
        } else {
            kv[key] = scalar(g, id);
            kv_types[key] = gguf_type_name(t);
        }
    }
    py::list tensors;
    const size_t data_offset = gguf_get_data_offset(g);
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        const ggml_type type = gguf_get_tensor_type(g, i);
        const int64_t * ne = gguf_get_tensor_ne(g, i);
        int n_dims = GGML_MAX_DIMS;
        while (n_dims > 1 && ne[n_dims - 1] == 1) --n_dims;
        py::list shape;
        for (int d = 0; d < n_dims; ++d) shape.append(ne[d]);
        py::dict t;
        const char * name = gguf_get_tensor_name(g, i);
        t["name"] = utf8(name, std::strlen(name));
        t["type"] = (int) type;
        t["type_name"] = ggml_type_name(type);
        t["shape"] = shape;   // ggml order: fastest dimension first
        t["offset"] = (uint64_t) (data_offset + gguf_get_tensor_offset(g, i));
        t["nbytes"] = (uint64_t) gguf_get_tensor_size(g, i);
        tensors.append(t);
    }
    py::dict out;
    out["path"] = path;
    out["version"] = gguf_get_version(g);
    out["alignment"] = gguf_get_alignment(g);
    out["data_offset"] = data_offset;
    out["file_size"] = f.file_size();
    out["kv"] = kv;
    out["kv_types"] = kv_types;
    out["tensors"] = tensors;
    // The engine's reading of the file: architecture, family and dialect, or None when it runs no such file.
    py::object identity = py::none();
    try {
        const diffuse::Identity id = diffuse::identify(f);
        py::dict d;
        d["arch"] = id.arch->name;
        d["family"] = diffuse::family_name(id.arch->family);
        d["dialect"] = id.keys->name;
        identity = d;
    } catch (const diffuse::Error &) {
    }
    out["identity"] = identity;
    return out;
}

void diffuse_py::register_gguf(py::module_ & m) {
    m.def("read_gguf", &read_gguf, py::arg("path"),
          "Metadata (kv, kv_types) and tensor table (name, type, type_name, shape, offset, nbytes) of a GGUF file.");
}
