#include "bindings.h"

#include "diffuse.h"

#include "ggml.h"

#include <pybind11/numpy.h>

namespace py = pybind11;

using F32Rows = py::array_t<float, py::array::c_style | py::array::forcecast>;

void diffuse_py::register_quantize(py::module_ & m) {
    m.def("quantize_rows",
          [](F32Rows data, int type) {
              if (data.ndim() != 2) throw diffuse::Error("quantize_rows: expected a 2-D array (rows, cols)");
              const int64_t rows = data.shape(0), cols = data.shape(1);
              std::vector<uint8_t> out;
              {
                  py::gil_scoped_release release;
                  out = diffuse::quantize_rows(data.data(), rows, cols, type);
              }
              py::array_t<uint8_t> a({(py::ssize_t) rows, (py::ssize_t) (out.size() / std::max<int64_t>(rows, 1))});
              std::memcpy(a.mutable_data(), out.data(), out.size());
              return a;
          },
          py::arg("data"), py::arg("ggml_type"),
          "Quantise float32 rows (n_rows, n_cols) to a ggml type; returns uint8 (n_rows, row_bytes). Releases the GIL.");
    m.def("type_info", [](int type) {
              if (type < 0 || type >= GGML_TYPE_COUNT || ggml_type_size((ggml_type) type) == 0)
                  throw diffuse::Error("unknown ggml type " + std::to_string(type));
              py::dict d;
              d["name"] = ggml_type_name((ggml_type) type);
              d["block_size"] = ggml_blck_size((ggml_type) type);
              d["type_size"] = ggml_type_size((ggml_type) type);
              return d;
          }, py::arg("ggml_type"), "Name, block size and block bytes of a ggml type.");
    m.attr("GGML_VERSION") = ggml_version();
}
