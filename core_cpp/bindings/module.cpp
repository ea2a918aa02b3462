#include "bindings.h"

#include "gguf_file.h"

PYBIND11_MODULE(_core, m) {
    m.doc() = "diffuse engine (C++/GGML). Use the `diffuse` package, not this module.";
    diffuse::install_ggml_log();   // ggml's messages go into our exceptions, not onto stderr
    diffuse_py::register_errors(m);
    diffuse_py::register_gguf(m);
    diffuse_py::register_quantize(m);
    diffuse_py::register_model(m);
    diffuse_py::register_generate(m);
    diffuse_py::register_bench(m);
    diffuse_py::register_sampling(m);
}
