// The native side of loadgen.mlperf: MLPerf's query sample types and the issue loop.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "clock.h"
#include "mlperf/query_generator.h"
#include "mlperf/run.h"
#include "mlperf_types.h"
#include "py_counts.h"

namespace py = pybind11;
using loadgen::now_ns;
using loadgen::mlperf::GeneratorSettings;
using loadgen::mlperf::MlperfRun;
using loadgen::mlperf::QueryGenerator;
using loadgen::mlperf::RunSettings;
using loadgen::mlperf::Scenario;

namespace {

// Calls the SUT's issue_query with the GIL, turning a Python exception into a stop
// whose exception the caller re-raises after the loop.
class PySink : public loadgen::mlperf::IssueSink {
 public:
  PySink(py::object issue, bool fast) : issue_(std::move(issue)), fast_(fast) {}

  ~PySink() override { hold(); }

  // The GIL: held while the loop runs behind schedule, let go while it waits.
  void hold() {
    if (saved_ != nullptr) {
      PyEval_RestoreThread(saved_);
      saved_ = nullptr;
    }
  }
  void before_wait() override {
    if (saved_ == nullptr) saved_ = PyEval_SaveThread();
  }

  bool issue(const uint64_t* ids, const int64_t* indices, size_t n) override {
    hold();
    try {
      if (fast_) {
        py::list id_list(n);
        py::list index_list(n);
        for (size_t i = 0; i < n; ++i) {
          PyObject* id = PyLong_FromUnsignedLongLong(ids[i]);
          PyObject* index = PyLong_FromLongLong(indices[i]);
          if (id == nullptr || index == nullptr) {
            Py_XDECREF(id);
            Py_XDECREF(index);
            throw py::error_already_set();
          }
          PyList_SET_ITEM(id_list.ptr(), static_cast<Py_ssize_t>(i), id);
          PyList_SET_ITEM(index_list.ptr(), static_cast<Py_ssize_t>(i), index);
        }
        issue_(id_list, index_list);
      } else {
        py::list samples(n);
        for (size_t i = 0; i < n; ++i) {
          PyObject* s = loadgen_bindings::new_query_sample(ids[i], static_cast<unsigned long long>(indices[i]));
          if (s == nullptr) throw py::error_already_set();
          PyList_SET_ITEM(samples.ptr(), static_cast<Py_ssize_t>(i), s);
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
    const bool was_waiting = saved_ != nullptr;
    hold();
    bool ok = true;
    if (PyErr_CheckSignals() != 0) {
      error_ = std::make_unique<py::error_already_set>();
      ok = false;
    }
    if (was_waiting) before_wait();
    return ok;
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
  PyThreadState* saved_ = nullptr;
  std::unique_ptr<py::error_already_set> error_;
};

void read_items(PyObject** items, Py_ssize_t n, std::vector<uint64_t>* ids, std::vector<int64_t>* tokens,
                bool* any_tokens);

// ids (and tokens) from a sequence of QuerySampleResponse, under the GIL.
void read_responses(const py::handle& responses, std::vector<uint64_t>* ids, std::vector<int64_t>* tokens,
                    bool* any_tokens) {
  if (PyList_CheckExact(responses.ptr()) || PyTuple_CheckExact(responses.ptr())) {
    // Lists and tuples are read in place (no new reference to a "fast sequence").
    PyObject* seq = responses.ptr();
    const bool list = PyList_CheckExact(seq);
    const Py_ssize_t n = list ? PyList_GET_SIZE(seq) : PyTuple_GET_SIZE(seq);
    PyObject** items = list ? reinterpret_cast<PyListObject*>(seq)->ob_item : &PyTuple_GET_ITEM(seq, 0);
    read_items(items, n, ids, tokens, any_tokens);
    return;
  }
  py::object fast = py::reinterpret_steal<py::object>(
      PySequence_Fast(responses.ptr(), "QuerySamplesComplete expects a sequence of QuerySampleResponse"));
  if (!fast) throw py::error_already_set();
  read_items(PySequence_Fast_ITEMS(fast.ptr()), PySequence_Fast_GET_SIZE(fast.ptr()), ids, tokens, any_tokens);
}

void read_items(PyObject** items, Py_ssize_t n, std::vector<uint64_t>* ids, std::vector<int64_t>* tokens,
                bool* any_tokens) {
  ids->resize(static_cast<size_t>(n));
  tokens->resize(static_cast<size_t>(n));
  *any_tokens = false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = items[i];
    if (!loadgen_bindings::is_query_sample_response(item)) {
      throw py::type_error(std::string("QuerySamplesComplete expects QuerySampleResponse objects, got ") +
                           Py_TYPE(item)->tp_name);
    }
    const auto* r = reinterpret_cast<const loadgen_bindings::QuerySampleResponseObject*>(item);
    (*ids)[static_cast<size_t>(i)] = r->id;
    (*tokens)[static_cast<size_t>(i)] = r->n_tokens;
    if (r->n_tokens != 0) *any_tokens = true;
  }
}

// The run that QuerySamplesComplete and FirstTokenComplete feed. MLPerf's API names no
// run in those calls, so one is active per process; it is only read and written with
// the GIL held, which orders it against the calls.
struct ActiveRun {
  std::shared_ptr<MlperfRun> run;
  py::object complete_hook;     // accuracy runs: hook(responses, response_cb) after completing
  py::object first_token_hook;  // likewise for first tokens
  int64_t late = 0;             // completions with no run active
};
ActiveRun& active() {
  static ActiveRun* a = new ActiveRun();  // never destroyed: outlives interpreter teardown
  return *a;
}

// QuerySamplesComplete (kFirstToken false) and FirstTokenComplete, as plain vectorcall
// functions: they run once per completion batch of every harness, and pybind11's
// general dispatcher would cost more than the work itself.
template <bool kFirstToken>
PyObject* complete_call(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const int64_t t = now_ns();
  PyObject* responses = nargs > 0 ? args[0] : nullptr;
  PyObject* response_cb = nargs > 1 ? args[1] : Py_None;
  const char* name = kFirstToken ? "FirstTokenComplete" : "QuerySamplesComplete";
  if (nargs > 2) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most 2 arguments (%zd given)", name, nargs);
    return nullptr;
  }
  if (kwnames != nullptr) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      PyObject* value = args[nargs + k];
      if (PyUnicode_CompareWithASCIIString(key, "responses") == 0 && responses == nullptr) {
        responses = value;
      } else if (PyUnicode_CompareWithASCIIString(key, "response_cb") == 0 && nargs < 2) {
        response_cb = value;
      } else {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", name, key);
        return nullptr;
      }
    }
  }
  if (responses == nullptr) {
    PyErr_Format(PyExc_TypeError, "%s() missing required argument 'responses'", name);
    return nullptr;
  }
  try {
    thread_local std::vector<uint64_t> ids;
    thread_local std::vector<int64_t> tokens;
    bool any_tokens = false;
    read_responses(py::handle(responses), &ids, &tokens, &any_tokens);
    ActiveRun& a = active();
    if (!a.run) {
      a.late += static_cast<int64_t>(ids.size());
      Py_RETURN_NONE;
    }
    const py::object hook = kFirstToken ? a.first_token_hook : a.complete_hook;
    const bool hooked = hook && !hook.is_none();
    // The hook runs Python, which may call this function again on this thread: the
    // thread's buffers are then copied first.
    std::vector<uint64_t> own_ids;
    std::vector<int64_t> own_tokens;
    if (hooked) {
      own_ids = ids;
      own_tokens = tokens;
    }
    const std::vector<uint64_t>& use_ids = hooked ? own_ids : ids;
    const std::vector<int64_t>& use_tokens = hooked ? own_tokens : tokens;
    auto finish = [&, run = a.run] {
      if (kFirstToken) {
        run->first_token(use_ids.data(), use_ids.size(), t);
      } else {
        run->complete(use_ids.data(), use_ids.size(), t, any_tokens ? use_tokens.data() : nullptr);
      }
    };
    // Accuracy runs log the response bytes before the samples count as done, so the end
    // of the run (which waits for every sample) also waits for the last log entry.
    if (hooked) {
      try {
        hook(py::handle(responses), py::handle(response_cb));
      } catch (...) {
        finish();
        throw;
      }
    }
    finish();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (py::builtin_exception& e) {
    e.set_error();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef kCompleteDefs[] = {
    {"mlperf_samples_complete", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(complete_call<false>)),
     METH_FASTCALL | METH_KEYWORDS,
     "mlperf_samples_complete(responses, response_cb=None)\n\nReports finished samples. Callable from any "
     "thread, inside issue_query or later.\n\nArgs:\n    responses: QuerySampleResponse objects (id from the "
     "QuerySample; data and size\n        address the output bytes, read at once in accuracy runs; n_tokens for "
     "token runs).\n    response_cb: accuracy runs: called with each response before its bytes are read."},
    {"mlperf_first_token_complete",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(complete_call<true>)), METH_FASTCALL | METH_KEYWORDS,
     "mlperf_first_token_complete(responses, response_cb=None)\n\nReports the first output token of samples "
     "(token-latency runs). Any thread.\n\nArgs:\n    responses: QuerySampleResponse objects for the samples "
     "whose first token is out.\n    response_cb: accuracy runs: called with each response before its bytes are "
     "read."},
    {nullptr, nullptr, 0, nullptr}};

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
  if (!loadgen_bindings::ready_query_sample_types()) throw py::error_already_set();
  m.add_object("QuerySample", py::reinterpret_borrow<py::object>(
                                  reinterpret_cast<PyObject*>(&loadgen_bindings::QuerySampleType)));
  m.add_object("QuerySampleResponse", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
                                          &loadgen_bindings::QuerySampleResponseType)));

  py::class_<MlperfRun, std::shared_ptr<MlperfRun>>(m, "MlperfRun", "One MLPerf-style issue loop (see loadgen.mlperf).")
      .def(py::init([](int scenario, bool accuracy, std::vector<int64_t> loaded_samples,
                       int64_t sample_distribution_end, int64_t samples_per_query, int64_t target_duration_ns,
                       int64_t min_query_count, int64_t max_query_count, int64_t max_duration_ns,
                       int64_t max_async_queries, double target_qps, bool performance_issue_unique,
                       bool performance_issue_same, int64_t performance_issue_same_index,
                       bool sample_concatenate_permutation, uint64_t sample_index_rng_seed,
                       uint64_t schedule_rng_seed, bool coalesce, int64_t spin_ns, int64_t table_capacity,
                       int significant_figures, std::vector<int64_t> latency_bounds_ns,
                       std::vector<int64_t> ttft_bounds_ns, std::vector<int64_t> tpot_bounds_ns) {
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
             r.latency_bounds_ns = std::move(latency_bounds_ns);
             r.ttft_bounds_ns = std::move(ttft_bounds_ns);
             r.tpot_bounds_ns = std::move(tpot_bounds_ns);
             return std::make_shared<MlperfRun>(r, std::move(g));
           }),
           py::kw_only(), py::arg("scenario"), py::arg("accuracy"), py::arg("loaded_samples"),
           py::arg("sample_distribution_end"), py::arg("samples_per_query"), py::arg("target_duration_ns"),
           py::arg("min_query_count"), py::arg("max_query_count"), py::arg("max_duration_ns"),
           py::arg("max_async_queries"), py::arg("target_qps"), py::arg("performance_issue_unique") = false,
           py::arg("performance_issue_same") = false, py::arg("performance_issue_same_index") = 0,
           py::arg("sample_concatenate_permutation") = false, py::arg("sample_index_rng_seed") = 0,
           py::arg("schedule_rng_seed") = 0, py::arg("coalesce") = false, py::arg("spin_ns") = 0,
           py::arg("table_capacity") = 1 << 17, py::arg("significant_figures") = 3,
           py::arg("latency_bounds_ns") = std::vector<int64_t>{},
           py::arg("ttft_bounds_ns") = std::vector<int64_t>{}, py::arg("tpot_bounds_ns") = std::vector<int64_t>{})
      .def(
          "issue_all",
          [](MlperfRun& run, py::object issue, bool fast) {
            PySink sink(std::move(issue), fast);
            try {
              run.issue_all(sink);
            } catch (...) {
              sink.hold();
              throw;
            }
            sink.hold();
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
          "complete_ids",
          [](MlperfRun& run, const std::vector<uint64_t>& ids, int64_t completed_ns) {
            return run.complete(ids.data(), ids.size(), completed_ns != 0 ? completed_ns : now_ns(), nullptr);
          },
          py::arg("ids"), py::arg("completed_ns") = 0,
          "Completes samples by id at completed_ns (0: now); returns how many were not in flight.")
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
             d["queries_issued"] = c.issued;
             d["samples_issued"] = c.samples_issued;
             d["issue_calls"] = c.issue_calls;
             d["queries_completed"] = c.completed;
             d["samples_completed"] = c.samples_completed;
             d["unknown_completions"] = c.unknown_completions;
             d["table_waits"] = c.room_waits;
             d["latency_sum_ns"] = c.latency_sum_ns;
             d["query_latency_sum_ns"] = c.query_latency_sum_ns;
             d["max_latency_ns"] = c.max_latency_ns;
             loadgen_bindings::put_recorder_counts(d, c);
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
      .def_property_readonly(
          "recorder", [](const MlperfRun& r) -> const loadgen::Recorder& { return r.recorder(); },
          py::return_value_policy::reference_internal,
          "The run's Recorder: sample and query latencies, issue delays, TTFT, TPOT, counts over bounds.");

  m.def(
      "mlperf_set_active",
      [](std::shared_ptr<MlperfRun> run, py::object complete_hook, py::object first_token_hook) {
        ActiveRun& a = active();
        a.run = std::move(run);
        a.complete_hook = std::move(complete_hook);
        a.first_token_hook = std::move(first_token_hook);
      },
      py::arg("run").none(true), py::arg("complete_hook") = py::none(), py::arg("first_token_hook") = py::none(),
      "Makes `run` the one QuerySamplesComplete feeds (None: no run).");
  m.def("mlperf_late_completions", [] { return active().late; },
        "Completions that arrived while no run was active.");
  for (PyMethodDef* def = kCompleteDefs; def->ml_name != nullptr; ++def) {
    py::object fn = py::reinterpret_steal<py::object>(PyCFunction_NewEx(def, nullptr, m.attr("__name__").ptr()));
    if (!fn) throw py::error_already_set();
    m.add_object(def->ml_name, fn);
  }
  py::class_<loadgen::mlperf::Mt19937>(m, "MlperfMt19937",
                                       "std::mt19937 with MLPerf's uniform real draws (accuracy log sampling).")
      .def(py::init([](uint64_t seed) { return loadgen::mlperf::Mt19937(static_cast<uint_fast32_t>(seed)); }),
           py::arg("seed") = 5489)
      .def(
          "uniform_reals",
          [](loadgen::mlperf::Mt19937& g, int64_t n) {
            if (n < 0) throw py::value_error("n must be >= 0");
            std::vector<double> out(static_cast<size_t>(n));
            for (auto& x : out) x = loadgen::mlperf::uniform_real(g, 0.0, 1.0);
            return out;
          },
          py::arg("n"), "The next n draws of uniform_real_distribution<double>(0, 1).")
      .def(
          "skip_reals",
          [](loadgen::mlperf::Mt19937& g, int64_t n) {
            if (n < 0) throw py::value_error("n must be >= 0");
            g.discard(static_cast<unsigned long long>(n) * 2);  // two engine draws per real
          },
          py::arg("n"), "Advances past n uniform real draws.");
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
