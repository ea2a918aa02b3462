#include "bindings.h"

#include "diffuse.h"

namespace py = pybind11;

void diffuse_py::register_errors(py::module_ & m) {
    // diffuse.DiffuseError: every error of ours, raised from C++ or Python.
    static py::exception<diffuse::Error> exc(m, "DiffuseError", PyExc_RuntimeError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const diffuse::Error & e) {
            py::set_error(exc, e.what());
        } catch (const std::bad_alloc &) {
            py::set_error(exc, "out of memory");
        }
    });
}
