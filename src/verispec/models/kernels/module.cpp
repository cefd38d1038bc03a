// The Python module over the row-wise kernels (rowwise.h): the one file that includes
// <torch/extension.h>, so the others compile against ATen's lighter headers.
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <string>

#include "rowwise.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("variant", []() { return std::string(vs::kVariant); });
  m.def("rows_mm", &rows_mm, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("attention_rows", &attention_rows, pybind11::arg("q"), pybind11::arg("keys"), pybind11::arg("values"), pybind11::arg("start"),
        pybind11::arg("window"), pybind11::arg("scale"), pybind11::arg("parents") = pybind11::none(),
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("weight_mm", &weight_mm, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("dequantize", &dequantize, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("take_rows", &take_rows, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("tile_weight", &tile_weight, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("rows_argmax", &rows_argmax, pybind11::call_guard<pybind11::gil_scoped_release>());
  // module_local: each variant's library (several can be loaded in one process) registers its own Stack
  pybind11::class_<Stack>(m, "Stack", pybind11::module_local())
      .def(pybind11::init<int64_t, int64_t, int64_t, double, double, bool>(), pybind11::arg("heads"), pybind11::arg("kv_heads"),
           pybind11::arg("head_dim"), pybind11::arg("scale"), pybind11::arg("eps"), pybind11::arg("gelu"))
      .def("add_layer", &Stack::add_layer)
      .def("set_head", &Stack::set_head)
      .def("forward", &Stack::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("set_profile", &Stack::set_profile)
      .def("profile", &Stack::profile)
      .def("__len__", &Stack::size);
}
