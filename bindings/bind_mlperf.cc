// The native side of loadgen.mlperf: MLPerf's query sample types and the issue loop.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <string>
#include <vector>

#include "clock.h"
#include "mlperf_run.h"
#include "py_histogram.h"

namespace py = pybind11;
using loadgen::now_ns;
using loadgen::mlperf::GeneratorSettings;
using loadgen::mlperf::MlperfRun;
using loadgen::mlperf::QueryGenerator;
using loadgen::mlperf::RunSettings;
using loadgen::mlperf::Scenario;
using loadgen_bindings::PyHistogram;

namespace {

struct QuerySample {
  uint64_t id = 0;
  uint64_t index = 0;
};

struct QuerySampleResponse {
  uint64_t id = 0;
  uintptr_t data = 0;
  uint64_t size = 0;
  int64_t n_tokens = 0;
};

// Calls the SUT's issue_query with the GIL, turning a Python exception into a stop
// whose exception the caller re-raises after the loop.
class PySink : public loadgen::mlperf::IssueSink {
 public:
  PySink(py::object issue, bool fast) : issue_(std::move(issue)), fast_(fast) {}

  bool issue(const uint64_t* ids, const int64_t* indices, size_t n) override {
    py::gil_scoped_acquire gil;
    try {
      if (fast_) {
        py::list id_list(n);
        py::list index_list(n);
        for (size_t i = 0; i < n; ++i) {
          PyList_SET_ITEM(id_list.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromUnsignedLongLong(ids[i]));
          PyList_SET_ITEM(index_list.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(indices[i]));
        }
        issue_(id_list, index_list);
      } else {
        py::list samples(n);
        for (size_t i = 0; i < n; ++i) {
          py::object s = py::cast(QuerySample{ids[i], static_cast<uint64_t>(indices[i])});
          PyList_SET_ITEM(samples.ptr(), static_cast<Py_ssize_t>(i), s.release().ptr());
        }
        issue_(samples);
      }
      return true;
    } catch (py::error_already_set& e) {
      error_ = std::make_unique<py::error_already_set>(std::move(e));
      return false;
    }
  }

  bool keep_waiting() override {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      error_ = std::make_unique<py::error_already_set>();
      return false;
    }
    return true;
  }

  void rethrow() {
    if (error_) {
      auto e = std::move(error_);
      throw std::move(*e);
    }
  }

 private:
  py::object issue_;
  bool fast_;
  std::unique_ptr<py::error_already_set> error_;
};

// ids (and tokens) from a sequence of QuerySampleResponse, under the GIL.
void read_responses(const py::handle& responses, std::vector<uint64_t>* ids, std::vector<int64_t>* tokens,
                    bool* any_tokens) {
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(responses);
  const size_t n = static_cast<size_t>(py::len(seq));
  ids->resize(n);
  tokens->resize(n);
  *any_tokens = false;
  for (size_t i = 0; i < n; ++i) {
    py::handle item = seq[i];
    const QuerySampleResponse* r = nullptr;
    try {
      r = &item.cast<const QuerySampleResponse&>();
    } catch (py::cast_error&) {
      throw py::type_error("QuerySamplesComplete expects QuerySampleResponse objects, got " +
                           std::string(py::str(py::type::handle_of(item).attr("__name__"))));
    }
    (*ids)[i] = r->id;
    (*tokens)[i] = r->n_tokens;
    if (r->n_tokens != 0) *any_tokens = true;
  }
}

Scenario to_scenario(int v) {
  if (v < 0 || v > 3) throw std::invalid_argument("scenario must be 0..3, got " + std::to_string(v));
  return static_cast<Scenario>(v);
}

GeneratorSettings generator_settings(int scenario, bool accuracy, std::vector<int64_t> loaded_samples,
                                     int64_t sample_distribution_end, int64_t samples_per_query,
                                     int64_t target_duration_ns, int64_t min_query_count, double target_qps,
                                     uint64_t sample_index_rng_seed, uint64_t schedule_rng_seed) {
  GeneratorSettings g;
  g.scenario = to_scenario(scenario);
  g.accuracy = accuracy;
  g.loaded_samples = std::move(loaded_samples);
  g.sample_distribution_end = sample_distribution_end;
  g.samples_per_query = samples_per_query;
  g.target_duration_ns = target_duration_ns;
  g.min_query_count = min_query_count;
  g.target_qps = target_qps;
  g.sample_index_rng_seed = sample_index_rng_seed;
  g.schedule_rng_seed = schedule_rng_seed;
  return g;
}

}  // namespace

void bind_mlperf(py::module_& m) {
  py::class_<QuerySample>(m, "QuerySample", "One sample of a query: its id (for the response) and QSL index.")
      .def(py::init<>())
      .def(py::init([](uint64_t id, uint64_t index) { return QuerySample{id, index}; }), py::arg("id"),
           py::arg("index"))
      .def_readwrite("id", &QuerySample::id)
      .def_readwrite("index", &QuerySample::index)
      .def("__repr__", [](const QuerySample& s) {
        return "QuerySample(id=" + std::to_string(s.id) + ", index=" + std::to_string(s.index) + ")";
      })
      .def(py::pickle([](const QuerySample& s) { return py::make_tuple(s.id, s.index); },
                      [](py::tuple t) { return QuerySample{t[0].cast<uint64_t>(), t[1].cast<uint64_t>()}; }));

  py::class_<QuerySampleResponse>(m, "QuerySampleResponse",
                                  "A finished sample: its id, and the address and size of its output.")
      .def(py::init<>())
      .def(py::init([](uint64_t id, uintptr_t data, uint64_t size) { return QuerySampleResponse{id, data, size, 0}; }),
           py::arg("id"), py::arg("data"), py::arg("size"))
      .def(py::init([](uint64_t id, uintptr_t data, uint64_t size, int64_t n_tokens) {
             return QuerySampleResponse{id, data, size, n_tokens};
           }),
           py::arg("id"), py::arg("data"), py::arg("size"), py::arg("n_tokens"))
      .def_readwrite("id", &QuerySampleResponse::id)
      .def_readwrite("data", &QuerySampleResponse::data)
      .def_readwrite("size", &QuerySampleResponse::size)
      .def_readwrite("n_tokens", &QuerySampleResponse::n_tokens)
      .def("__repr__", [](const QuerySampleResponse& r) {
        return "QuerySampleResponse(id=" + std::to_string(r.id) + ", data=" + std::to_string(r.data) +
               ", size=" + std::to_string(r.size) + ", n_tokens=" + std::to_string(r.n_tokens) + ")";
      });

  py::class_<MlperfRun>(m, "MlperfRun", "One MLPerf-style issue loop (see loadgen.mlperf).")
      .def(py::init([](int scenario, bool accuracy, std::vector<int64_t> loaded_samples,
                       int64_t sample_distribution_end, int64_t samples_per_query, int64_t target_duration_ns,
                       int64_t min_query_count, int64_t max_query_count, int64_t max_duration_ns,
                       int64_t max_async_queries, double target_qps, bool performance_issue_unique,
                       bool performance_issue_same, int64_t performance_issue_same_index,
                       bool sample_concatenate_permutation, uint64_t sample_index_rng_seed,
                       uint64_t schedule_rng_seed, bool coalesce, int64_t spin_ns, int64_t table_capacity,
                       int significant_figures) {
             GeneratorSettings g = generator_settings(scenario, accuracy, std::move(loaded_samples),
                                                      sample_distribution_end, samples_per_query,
                                                      target_duration_ns, min_query_count, target_qps,
                                                      sample_index_rng_seed, schedule_rng_seed);
             g.performance_issue_unique = performance_issue_unique;
             g.performance_issue_same = performance_issue_same;
             g.performance_issue_same_index = performance_issue_same_index;
             g.sample_concatenate_permutation = sample_concatenate_permutation;
             RunSettings r;
             r.scenario = g.scenario;
             r.accuracy = accuracy;
             r.target_duration_ns = target_duration_ns;
             r.min_query_count = min_query_count;
             r.max_query_count = max_query_count;
             r.max_duration_ns = max_duration_ns;
             r.max_async_queries = max_async_queries;
             r.coalesce = coalesce;
             r.spin_ns = spin_ns;
             r.table_capacity = table_capacity;
             r.significant_figures = significant_figures;
             return new MlperfRun(r, std::move(g));
           }),
           py::kw_only(), py::arg("scenario"), py::arg("accuracy"), py::arg("loaded_samples"),
           py::arg("sample_distribution_end"), py::arg("samples_per_query"), py::arg("target_duration_ns"),
           py::arg("min_query_count"), py::arg("max_query_count"), py::arg("max_duration_ns"),
           py::arg("max_async_queries"), py::arg("target_qps"), py::arg("performance_issue_unique") = false,
           py::arg("performance_issue_same") = false, py::arg("performance_issue_same_index") = 0,
           py::arg("sample_concatenate_permutation") = false, py::arg("sample_index_rng_seed") = 0,
           py::arg("schedule_rng_seed") = 0, py::arg("coalesce") = false, py::arg("spin_ns") = 0,
           py::arg("table_capacity") = 1 << 17, py::arg("significant_figures") = 3)
      .def(
          "issue_all",
          [](MlperfRun& run, py::object issue, bool fast) {
            PySink sink(std::move(issue), fast);
            {
              py::gil_scoped_release release;
              run.issue_all(sink);
            }
            sink.rethrow();
          },
          py::arg("issue"), py::arg("fast") = false,
          "Walks the queries on this thread, calling issue(list[QuerySample]) (fast: issue(ids, indices)).")
      .def(
          "wait_all",
          [](MlperfRun& run, double timeout_s) {
            const int64_t deadline = timeout_s < 0 ? INT64_MAX : now_ns() + static_cast<int64_t>(timeout_s * 1e9);
            for (;;) {
              bool done;
              {
                py::gil_scoped_release release;
                const int64_t left = deadline - now_ns();
                done = run.wait_all(std::min<int64_t>(std::max<int64_t>(left, 0), 100'000'000));
              }
              if (done) return true;
              if (PyErr_CheckSignals() != 0) throw py::error_already_set();
              if (now_ns() >= deadline) return false;
            }
          },
          py::arg("timeout_s") = -1.0, "Waits for every issued sample; False on timeout.")
      .def(
          "complete",
          [](MlperfRun& run, py::handle responses) {
            const int64_t t = now_ns();
            std::vector<uint64_t> ids;
            std::vector<int64_t> tokens;
            bool any_tokens = false;
            read_responses(responses, &ids, &tokens, &any_tokens);
            return run.complete(ids.data(), ids.size(), t, any_tokens ? tokens.data() : nullptr);
          },
          py::arg("responses"), "Completes samples now; returns how many ids were not in flight.")
      .def(
          "complete_ids",
          [](MlperfRun& run, const std::vector<uint64_t>& ids) {
            return run.complete(ids.data(), ids.size(), now_ns(), nullptr);
          },
          py::arg("ids"))
      .def(
          "first_token",
          [](MlperfRun& run, py::handle responses) {
            const int64_t t = now_ns();
            std::vector<uint64_t> ids;
            std::vector<int64_t> tokens;
            bool any_tokens = false;
            read_responses(responses, &ids, &tokens, &any_tokens);
            return run.first_token(ids.data(), ids.size(), t);
          },
          py::arg("responses"))
      .def("stop", &MlperfRun::stop)
      .def("drain_generator", &MlperfRun::drain_generator, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("generated_query_count", [](const MlperfRun& r) { return r.generator().generated(); })
      .def_property_readonly("generated_samples_per_query",
                             [](const MlperfRun& r) { return r.generator().samples_per_query(); })
      .def_property_readonly("generated_query_duration_ns",
                             [](const MlperfRun& r) { return r.generator().end_timestamp_ns(); })
      .def_property_readonly("sample_bits", &MlperfRun::sample_bits)
      .def("counts",
           [](const MlperfRun& run) {
             const auto c = run.counts();
             py::dict d;
             d["queries_issued"] = c.queries_issued;
             d["samples_issued"] = c.samples_issued;
             d["issue_calls"] = c.issue_calls;
             d["queries_completed"] = c.queries_completed;
             d["samples_completed"] = c.samples_completed;
             d["unknown_completions"] = c.unknown_completions;
             d["table_waits"] = c.table_waits;
             d["latency_sum_ns"] = c.latency_sum_ns;
             d["query_latency_sum_ns"] = c.query_latency_sum_ns;
             d["max_latency_ns"] = c.max_latency_ns;
             d["tokens"] = c.tokens;
             d["start_ns"] = c.start_ns;
             d["max_completion_ns"] = c.max_completion_ns;
             d["final_scheduled_offset_ns"] = c.final_scheduled_offset_ns;
             d["final_issued_ns"] = c.final_issued_ns;
             d["final_done_ns"] = c.final_done_ns;
             d["ran_out_of_generated_queries"] = c.ran_out_of_generated_queries;
             d["too_many_outstanding"] = c.too_many_outstanding;
             d["max_query_count_reached"] = c.max_query_count_reached;
             d["max_duration_reached"] = c.max_duration_reached;
             d["ended_naturally"] = c.ended_naturally;
             d["interrupted"] = c.interrupted;
             return d;
           })
      .def("sample_latency", [](const MlperfRun& r) { return PyHistogram(r.sample_latency()); })
      .def("query_latency", [](const MlperfRun& r) { return PyHistogram(r.query_latency()); })
      .def("issue_delay", [](const MlperfRun& r) { return PyHistogram(r.issue_delay()); })
      .def("first_token_latency", [](const MlperfRun& r) { return PyHistogram(r.first_token_latency()); })
      .def("time_per_output_token", [](const MlperfRun& r) { return PyHistogram(r.time_per_output_token()); });

  m.def("mlperf_loadable_sets", &loadgen::mlperf::loadable_sets, py::kw_only(), py::arg("total_sample_count"),
        py::arg("qsl_total_count"), py::arg("set_size"), py::arg("padding"), py::arg("qsl_rng_seed"),
        "MLPerf's loadable QSL sets for the given seed.");
  m.def(
      "mlperf_generate",
      [](int scenario, bool accuracy, std::vector<int64_t> loaded_samples, int64_t sample_distribution_end,
         int64_t samples_per_query, int64_t target_duration_ns, int64_t min_query_count, double target_qps,
         uint64_t sample_index_rng_seed, uint64_t schedule_rng_seed, int64_t limit) {
        QueryGenerator gen(generator_settings(scenario, accuracy, std::move(loaded_samples), sample_distribution_end,
                                              samples_per_query, target_duration_ns, min_query_count, target_qps,
                                              sample_index_rng_seed, schedule_rng_seed));
        std::vector<std::pair<int64_t, std::vector<int64_t>>> out;
        std::vector<int64_t> samples;
        int64_t t = 0;
        while ((limit < 0 || static_cast<int64_t>(out.size()) < limit) && gen.next(&samples, &t)) {
          out.emplace_back(t, samples);
        }
        return out;
      },
      py::kw_only(), py::arg("scenario"), py::arg("accuracy"), py::arg("loaded_samples"),
      py::arg("sample_distribution_end"), py::arg("samples_per_query"), py::arg("target_duration_ns"),
      py::arg("min_query_count"), py::arg("target_qps"), py::arg("sample_index_rng_seed"),
      py::arg("schedule_rng_seed"), py::arg("limit") = -1,
      "The (scheduled offset ns, sample indices) of MLPerf's queries for these settings.");
}
