// The extension module loadgen._core. Each area binds itself in its own translation unit.
#include <pybind11/pybind11.h>

#include "affinity.h"

namespace py = pybind11;

void bind_engine(py::module_& m);
void bind_histogram(py::module_& m);
void bind_mlperf(py::module_& m);
void bind_net(py::module_& m);
void bind_schedule(py::module_& m);

PYBIND11_MODULE(_core, m) {
  m.doc() = "loadgen's native core. Import loadgen, not this module.";
  bind_histogram(m);
  bind_schedule(m);
  bind_net(m);
  bind_engine(m);
  bind_mlperf(m);
  // name -> role of every native thread, from the table the threads take their names from.
  py::dict roles;
  for (const auto& r : loadgen::kThreadRoles) roles[py::str(r.name)] = py::str(r.role);
  m.attr("THREAD_ROLES") = py::module_::import("types").attr("MappingProxyType")(roles);
}
