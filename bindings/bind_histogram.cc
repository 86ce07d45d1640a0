// Bindings for the HDR histogram, its codecs, the recording microbenchmark, and the
// Recorder: a run's histograms, read the same way from the Engine and the MlperfRun.
//
// Python-facing writes take a per-histogram mutex and then use the single-writer record
// path: record_array() runs with the GIL released, possibly on several Python threads at
// once and alongside record(), and must not lose a count. One uncontended lock per call
// costs far less than an atomic add per value (bench/RESULTS.md: ~2 ns vs ~10 ns a value
// uncontended, ~35 ns contended). Readers need no lock: counts are relaxed atomics.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "hdr_codec.h"
#include "hdr_histogram.h"
#include "microbench.h"
#include "py_histogram.h"
#include "recorder.h"

namespace py = pybind11;
using loadgen::HdrHistogram;
using loadgen_bindings::PyHistogram;

namespace {

using WriteLock = std::lock_guard<std::mutex>;

using Int64Array = py::array_t<int64_t, py::array::c_style>;

py::bytes to_bytes(const std::vector<uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

std::string_view view_of(const py::bytes& b) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &data, &size) != 0) throw py::error_already_set();
  return {data, static_cast<size_t>(size)};
}

template <class Decode>
PyHistogram decode_bytes(const py::bytes& data, Decode decode) {
  const std::string_view v = view_of(data);
  py::gil_scoped_release release;
  return PyHistogram(decode(reinterpret_cast<const uint8_t*>(v.data()), v.size()));
}

// A run's Recorder, read while it records (merged snapshots, atomic counts). Python gets
// it by reference from the run that owns it (Engine.recorder, MlperfRun.recorder), which
// it keeps alive; it is never made or copied from Python.
void bind_recorder(py::module_& m) {
  using loadgen::Recorder;
  py::class_<Recorder>(m, "Recorder",
                       "A run's recorded figures: its histograms (merged snapshots) and exact counts over bounds. "
                       "Safe to read while the run records.")
      .def("latency", [](const Recorder& r) { return PyHistogram(r.latency()); },
           "Latency, ns: completed - scheduled, once per sample.")
      .def("service_time", [](const Recorder& r) { return PyHistogram(r.service_time()); },
           "Service time, ns: completed - issued, once per sample.")
      .def("issue_delay", [](const Recorder& r) { return PyHistogram(r.issue_delay()); },
           "Issue delay, ns: issued - scheduled, once per query.")
      .def("ttft", [](const Recorder& r) { return PyHistogram(r.ttft()); },
           "Time to first token, ns: first token - scheduled.")
      .def("tpot", [](const Recorder& r) { return PyHistogram(r.tpot()); },
           "Time per output token, ns: (completed - first token) / (tokens - 1).")
      .def("query_latency", [](const Recorder& r) { return PyHistogram(r.query_latency()); },
           "Latency per query, ns (empty unless the run keeps it: MLPerf's multi-sample queries).")
      .def("over_bound", &Recorder::over_bound, "Latencies strictly over each latency bound (exact counts).")
      .def("over_ttft_bound", &Recorder::over_ttft_bound,
           "Times to first token strictly over each TTFT bound (exact counts).")
      .def("over_tpot_bound", &Recorder::over_tpot_bound,
           "Times per output token strictly over each TPOT bound (exact counts).");
}

}  // namespace

void bind_histogram(py::module_& m) {
  py::register_exception<loadgen::HdrDecodeError>(m, "HdrDecodeError", PyExc_ValueError);

  py::class_<PyHistogram>(m, "HdrHistogram")
      .def(py::init<int64_t, int64_t, int>(), py::arg("lowest_discernible_value"),
           py::arg("highest_trackable_value"), py::arg("significant_figures"))
      .def("record",
           [](PyHistogram& h, int64_t v) {
             WriteLock lock(h.writer);
             return h.record(v);
           },
           py::arg("value"))
      .def("record_n",
           [](PyHistogram& h, int64_t v, int64_t n) {
             WriteLock lock(h.writer);
             return h.record_n(v, n);
           },
           py::arg("value"), py::arg("count"))
      .def("record_corrected",
           [](PyHistogram& h, int64_t v, int64_t interval, int64_t n) {
             WriteLock lock(h.writer);
             return h.record_corrected(v, interval, n);
           },
           py::arg("value"), py::arg("expected_interval"), py::arg("count") = 1,
           py::call_guard<py::gil_scoped_release>())
      .def("record_array",
           [](PyHistogram& h, const Int64Array& values, const py::object& counts) -> size_t {
             const int64_t* c = nullptr;
             Int64Array counts_arr;
             if (!counts.is_none()) {
               counts_arr = counts.cast<Int64Array>();
               if (counts_arr.size() != values.size()) {
                 throw py::value_error("counts must have the same length as values (" +
                                       std::to_string(values.size()) + "), got " +
                                       std::to_string(counts_arr.size()));
               }
               c = counts_arr.data();
             }
             const int64_t* v = values.data();
             const auto n = static_cast<size_t>(values.size());
             py::gil_scoped_release release;
             WriteLock lock(h.writer);
             return h.record_values(v, c, n, /*atomic=*/false);
           },
           py::arg("values"), py::arg("counts") = py::none())
      .def("add",
           [](PyHistogram& h, const PyHistogram& other) {
             if (&h == &other) {  // h += h: add a snapshot, not a moving target
               const HdrHistogram copy(other);
               WriteLock lock(h.writer);
               return h.add(copy);
             }
             WriteLock lock(h.writer);
             return h.add(other);
           },
           py::arg("other"), py::call_guard<py::gil_scoped_release>())
      .def("can_hold",
           [](const PyHistogram& h, const PyHistogram& other) { return h.can_hold(other); },
           py::arg("other"))
      .def("same_layout",
           [](const PyHistogram& h, const PyHistogram& other) { return h.same_layout(other); },
           py::arg("other"))
      .def("add_rejected", &HdrHistogram::add_rejected, py::arg("count"))
      .def("restore_raw_min_max",
           [](PyHistogram& h, int64_t raw_min, int64_t raw_max) {
             WriteLock lock(h.writer);
             h.restore_raw_min_max(raw_min, raw_max);
           },
           py::arg("raw_min"), py::arg("raw_max"))
      .def("reset",
           [](PyHistogram& h) {
             WriteLock lock(h.writer);
             h.reset();
           })
      .def("copy", [](const PyHistogram& h) { return PyHistogram(h); })
      .def_property_readonly("total_count", &HdrHistogram::total_count)
      .def_property_readonly("rejected_count", &HdrHistogram::rejected_count)
      .def_property_readonly("min", &HdrHistogram::min)
      .def_property_readonly("max", &HdrHistogram::max)
      .def_property_readonly("raw_min", &HdrHistogram::raw_min)
      .def_property_readonly("raw_max", &HdrHistogram::raw_max)
      .def_property_readonly("mean", &HdrHistogram::mean)
      .def_property_readonly("stddev", &HdrHistogram::stddev)
      .def("value_at_percentile", &HdrHistogram::value_at_percentile, py::arg("percentile"))
      .def("values_at_percentiles",
           [](const PyHistogram& h, const py::array_t<double, py::array::c_style>& ps) {
             Int64Array out(ps.size());
             const double* p = ps.data();
             int64_t* o = out.mutable_data();
             const auto n = static_cast<size_t>(ps.size());
             {
               py::gil_scoped_release release;
               h.values_at_percentiles(p, o, n);
             }
             return out;
           },
           py::arg("percentiles"))
      .def("percentile_of_value", &HdrHistogram::percentile_of_value, py::arg("value"))
      .def("count_between", &HdrHistogram::count_between, py::arg("low"), py::arg("high"))
      .def("count_at_value", &HdrHistogram::count_at_value, py::arg("value"))
      .def_property_readonly("lowest_discernible_value", &HdrHistogram::lowest_discernible_value)
      .def_property_readonly("highest_trackable_value", &HdrHistogram::highest_trackable_value)
      .def_property_readonly("significant_figures", &HdrHistogram::significant_figures)
      .def_property_readonly("counts_len", &HdrHistogram::counts_len)
      .def_property_readonly("bucket_count", &HdrHistogram::bucket_count)
      .def_property_readonly("sub_bucket_count", &HdrHistogram::sub_bucket_count)
      .def_property_readonly("unit_magnitude", &HdrHistogram::unit_magnitude)
      .def("lowest_equivalent_value", &HdrHistogram::lowest_equivalent_value, py::arg("value"))
      .def("highest_equivalent_value", &HdrHistogram::highest_equivalent_value, py::arg("value"))
      .def("median_equivalent_value", &HdrHistogram::median_equivalent_value, py::arg("value"))
      .def("equivalent_value_range", &HdrHistogram::equivalent_value_range, py::arg("value"))
      .def("counts",
           [](const PyHistogram& h) {
             Int64Array out(h.counts_len());
             int64_t* o = out.mutable_data();
             for (int32_t i = 0; i < h.counts_len(); ++i) o[i] = h.count_at_index(i);
             return out;
           })
      .def("recorded_buckets",
           [](const PyHistogram& h) {
             std::vector<int32_t> used;
             const int32_t len = h.used_counts_len();
             for (int32_t i = 0; i < len; ++i) {
               if (h.count_at_index(i)) used.push_back(i);
             }
             Int64Array lowest(used.size()), highest(used.size()), counts(used.size());
             int64_t* lo = lowest.mutable_data();
             int64_t* hi = highest.mutable_data();
             int64_t* c = counts.mutable_data();
             for (size_t k = 0; k < used.size(); ++k) {
               lo[k] = h.value_from_index(used[k]);
               hi[k] = h.highest_equivalent_value(lo[k]);
               c[k] = h.count_at_index(used[k]);
             }
             return py::make_tuple(lowest, highest, counts);
           })
      .def("encode_uncompressed",
           [](const PyHistogram& h) {
             std::vector<uint8_t> out;
             {
               py::gil_scoped_release release;
               out = loadgen::encode_uncompressed(h);
             }
             return to_bytes(out);
           })
      .def("encode_compressed",
           [](const PyHistogram& h, int level) {
             std::vector<uint8_t> out;
             {
               py::gil_scoped_release release;
               out = loadgen::encode_compressed(h, level);
             }
             return to_bytes(out);
           },
           py::arg("level") = -1)
      .def("encode_base64",
           [](const PyHistogram& h, int level) { return loadgen::encode_base64(h, level); },
           py::arg("level") = -1, py::call_guard<py::gil_scoped_release>())
      .def_static("decode_uncompressed",
                  [](const py::bytes& b) { return decode_bytes(b, loadgen::decode_uncompressed); },
                  py::arg("data"))
      .def_static("decode_compressed",
                  [](const py::bytes& b) { return decode_bytes(b, loadgen::decode_compressed); },
                  py::arg("data"))
      .def_static("decode_base64",
                  [](const std::string& text) {
                    py::gil_scoped_release release;
                    return PyHistogram(loadgen::decode_base64(text));
                  },
                  py::arg("text"));

  py::enum_<loadgen::RecordMode>(m, "RecordMode")
      .value("single_writer", loadgen::RecordMode::kSingleWriter)
      .value("atomic_shared", loadgen::RecordMode::kAtomicShared)
      .value("sharded", loadgen::RecordMode::kSharded);

  m.def("time_record_ns",
        [](const Int64Array& values, int threads, loadgen::RecordMode mode) {
          const int64_t* v = values.data();
          const auto n = static_cast<size_t>(values.size());
          py::gil_scoped_release release;
          return loadgen::time_record_ns(v, n, threads, mode);
        },
        py::arg("values"), py::arg("threads"), py::arg("mode"),
        "Nanoseconds per record per thread for a recording loop that runs entirely in C++.");
  m.def("time_mlperf_loop", &loadgen::time_mlperf_loop, py::call_guard<py::gil_scoped_release>(),
        py::arg("queries"), py::arg("samples_per_query") = 1,
        "Nanoseconds per query of the MLPerf issue loop with an instant C++ SUT (no Python per query).");
  m.def("time_request_log",
        [](size_t n, const std::string& path, size_t events_per_record) {
          double append_ns = 0, total_ns = 0;
          {
            py::gil_scoped_release release;
            loadgen::time_request_log(n, path.c_str(), &append_ns, &total_ns, events_per_record);
          }
          return py::make_tuple(append_ns, total_ns);
        },
        py::arg("n"), py::arg("path"), py::arg("events_per_record") = 0,
        "(ns per append, ns until written) for n per-request records appended on one thread and "
        "written as JSON lines to path; each with a stream of events_per_record token events.");
  bind_recorder(m);
}
