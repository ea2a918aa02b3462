#include "bindings.h"

PYBIND11_MODULE(_core, m) {
    m.doc() = "diffuse engine (C++/GGML). Use the `diffuse` package, not this module.";
    diffuse_py::register_errors(m);
    diffuse_py::register_gguf(m);
    diffuse_py::register_quantize(m);
    diffuse_py::register_model(m);
    diffuse_py::register_generate(m);
    diffuse_py::register_bench(m);
}
