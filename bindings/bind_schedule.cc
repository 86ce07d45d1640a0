// Bindings for what decides when queries are due and which samples they carry: the
// arrival schedules (and their stages) and the sample selector with its orders.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <vector>

#include "sample_selector.h"
#include "schedule.h"

namespace py = pybind11;

namespace {

using Int64Array = py::array_t<int64_t, py::array::c_style>;

Int64Array take_offsets(loadgen::ArrivalSchedule& s, int64_t n) {
  if (n < 0) throw py::value_error("n must be >= 0");
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n));
  {
    py::gil_scoped_release release;
    int64_t v;
    while (static_cast<int64_t>(out.size()) < n && s.next(&v)) out.push_back(v);
  }
  return Int64Array(static_cast<py::ssize_t>(out.size()), out.data());
}

}  // namespace

void bind_schedule(py::module_& m) {
  py::enum_<loadgen::ArrivalKind>(m, "ArrivalKind")
      .value("constant", loadgen::ArrivalKind::kConstant)
      .value("poisson", loadgen::ArrivalKind::kPoisson)
      .value("stages", loadgen::ArrivalKind::kStages)
      .value("trace", loadgen::ArrivalKind::kTrace)
      .value("offline", loadgen::ArrivalKind::kOffline);
  py::enum_<loadgen::SampleOrder>(m, "SampleOrder")
      .value("sequential", loadgen::SampleOrder::kSequential)
      .value("shuffled", loadgen::SampleOrder::kShuffled)
      .value("random", loadgen::SampleOrder::kRandom);

  py::class_<loadgen::Stage>(m, "Stage")
      .def(py::init([](int64_t duration_ns, double start_qps, double end_qps) {
             return loadgen::Stage{duration_ns, start_qps, end_qps};
           }),
           py::arg("duration_ns"), py::arg("start_qps"), py::arg("end_qps"))
      .def_readwrite("duration_ns", &loadgen::Stage::duration_ns)
      .def_readwrite("start_qps", &loadgen::Stage::start_qps)
      .def_readwrite("end_qps", &loadgen::Stage::end_qps);

  py::class_<loadgen::ArrivalSchedule>(m, "ArrivalSchedule")
      .def_static("constant", &loadgen::ArrivalSchedule::constant, py::arg("qps"))
      .def_static("poisson", &loadgen::ArrivalSchedule::poisson, py::arg("qps"), py::arg("seed"),
                  py::arg("burstiness") = 1.0)
      .def_static("stages", &loadgen::ArrivalSchedule::stages, py::arg("stages"),
                  py::arg("poisson"), py::arg("seed"), py::arg("burstiness") = 1.0)
      .def_static("trace",
                  [](const Int64Array& offsets) {
                    return loadgen::ArrivalSchedule::trace(
                        std::vector<int64_t>(offsets.data(), offsets.data() + offsets.size()));
                  },
                  py::arg("offsets_ns"))
      .def_static("offline", &loadgen::ArrivalSchedule::offline)
      .def("take", &take_offsets, py::arg("n"),
           "The next n arrival offsets in ns (fewer when the schedule ends).");

  py::class_<loadgen::SampleSelector>(m, "SampleSelector")
      .def(py::init<int64_t, loadgen::SampleOrder, uint64_t>(), py::arg("sample_count"),
           py::arg("order"), py::arg("seed"))
      .def("take",
           [](loadgen::SampleSelector& s, int64_t n) {
             if (n < 0) throw py::value_error("n must be >= 0");
             Int64Array out(n);
             int64_t* o = out.mutable_data();
             for (int64_t i = 0; i < n; ++i) o[i] = s.next();
             return out;
           },
           py::arg("n"));
}
