// Each file registers one concept on the module; module.cpp only calls them.
#pragma once

#include <pybind11/pybind11.h>

namespace diffuse_py {
void register_errors(pybind11::module_ & m);
void register_gguf(pybind11::module_ & m);
void register_quantize(pybind11::module_ & m);
void register_model(pybind11::module_ & m);
void register_generate(pybind11::module_ & m);
void register_bench(pybind11::module_ & m);
void register_sampling(pybind11::module_ & m);
}
