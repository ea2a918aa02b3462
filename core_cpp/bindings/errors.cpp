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
            // Messages may quote bytes from a damaged file: decode leniently.
            const std::string msg = e.what();
            PyObject * text = PyUnicode_DecodeUTF8(msg.data(), (Py_ssize_t) msg.size(), "replace");
            PyErr_SetObject(exc.ptr(), text);
            Py_XDECREF(text);
        } catch (const std::bad_alloc &) {
            py::set_error(exc, "out of memory");
        }
    });
}
