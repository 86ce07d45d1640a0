// Bindings for the issue engine: its settings (with the SUT it drives), the run (queries
// handed out and completed), the native network client a run may drive, and what the run
// recorded. The schedules are bound in bind_schedule.cc, the network client's settings in
// bind_net.cc, the Recorder in bind_histogram.cc.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "affinity.h"
#include "clock.h"
#include "engine.h"
#include "http_client.h"
#include "native_suts.h"
#include "py_counts.h"
#include "py_histogram.h"
#include "request_log.h"
#include "sse.h"

namespace py = pybind11;
using loadgen::Engine;
using loadgen::EngineSettings;
using loadgen::NativeSutSettings;
using loadgen::NetClient;
using loadgen::Recorder;
using loadgen::SutKind;
using loadgen_bindings::PyHistogram;

namespace {

using Int64Array = py::array_t<int64_t, py::array::c_style>;

int64_t seconds_to_ns(const py::object& seconds) {
  if (seconds.is_none()) return -1;
  const double s = seconds.cast<double>();
  return s < 0 ? -1 : static_cast<int64_t>(s * 1e9);
}

// One query without numpy: the fast path of serial Python SUTs. Tries once with the
// GIL held (the common case when the next query is ready), then waits without it.
py::object take_one(Engine& e, const py::object& timeout_s, int64_t spin_ns) {
  if (e.settings().samples_per_query != 1) {
    throw py::value_error("take_one needs samples_per_query == 1; use take_batch");
  }
  int64_t id = 0, sample = 0, scheduled = 0;
  int64_t n = e.take_batch(&id, &sample, &scheduled, 1, 0, 0);
  if (n == 0) {
    const int64_t timeout_ns = seconds_to_ns(timeout_s);
    py::gil_scoped_release release;
    n = e.take_batch(&id, &sample, &scheduled, 1, timeout_ns, spin_ns);
  }
  if (n < 0) return py::none();
  if (n == 0) return py::tuple();
  return py::make_tuple(id, sample);
}

// A str as UTF-8. One that is not valid Unicode (a lone surrogate, as in a message built
// from undecodable bytes) gets '?' in place of what cannot be encoded instead of a
// TypeError: a SUT's error text must never fail the call that records the failure.
std::string utf8_text(const py::str& s) {
  Py_ssize_t size = 0;
  if (const char* p = PyUnicode_AsUTF8AndSize(s.ptr(), &size)) return std::string(p, static_cast<size_t>(size));
  PyErr_Clear();
  py::object b = py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(s.ptr(), "utf-8", "replace"));
  if (!b) throw py::error_already_set();
  return std::string(PyBytes_AS_STRING(b.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(b.ptr())));
}

// The numpy dtype of a RequestRecord, registered on first use: registering it imports
// numpy, which a run that never reads records does not need.
py::object record_dtype() {
  static bool registered = false;
  if (!registered) {
    PYBIND11_NUMPY_DTYPE(loadgen::RequestRecord, query, scheduled_ns, issued_ns, completed_ns, first_token_ns,
                         sample_index, output_tokens, input_tokens, samples, error_kind, status, warmup);
    registered = true;
  }
  return py::dtype::of<loadgen::RequestRecord>();
}

py::dict records_stats(const Engine& e) {
  py::dict d;
  const loadgen::RequestLog* log = e.records();
  if (log == nullptr) return d;
  const loadgen::RequestLogStats st = log->stats();
  d["appended"] = st.appended;
  d["written"] = st.written;
  d["lost"] = st.lost;
  d["events_lost"] = st.events_lost;
  d["peak_buffered"] = st.peak_buffered;
  d["bytes"] = st.bytes;
  d["writer_cpu_ns"] = st.writer_cpu_ns;
  d["error"] = st.error;
  return d;
}

// One interval of the time series as a dict (the keys of Engine.timeseries()).
py::dict interval_dict(const loadgen::IntervalPoint& p) {
  py::dict d;
  d["start_offset_ns"] = p.start_offset_ns;
  d["length_ns"] = p.length_ns;
  d["issued"] = p.issued;
  d["completed"] = p.completed;
  d["latency_p50_ns"] = p.latency_p50_ns;
  d["latency_p90_ns"] = p.latency_p90_ns;
  d["latency_p99_ns"] = p.latency_p99_ns;
  d["latency_max_ns"] = p.latency_max_ns;
  d["latency_hdr"] = py::bytes(reinterpret_cast<const char*>(p.latency_hdr.data()), p.latency_hdr.size());
  d["failed"] = p.failed;
  d["timed_out"] = p.timed_out;
  d["errors"] = p.errors;
  d["outstanding"] = p.outstanding;
  d["issue_delay_p50_ns"] = p.issue_delay_p50_ns;
  d["issue_delay_p99_ns"] = p.issue_delay_p99_ns;
  d["issue_delay_max_ns"] = p.issue_delay_max_ns;
  d["ttft_p50_ns"] = p.ttft_p50_ns;
  d["ttft_p99_ns"] = p.ttft_p99_ns;
  d["tokens"] = p.tokens;
  return d;
}

using EngineClass = py::class_<Engine>;

// Which SUT a run drives, and the native SUTs' parameters.
void bind_sut_settings(py::module_& m) {
  py::enum_<loadgen::SutKind>(m, "SutKind")
      .value("null", loadgen::SutKind::kNull)
      .value("fixed_delay", loadgen::SutKind::kFixedDelay)
      .value("queue", loadgen::SutKind::kQueue)
      .value("demo", loadgen::SutKind::kDemo)
      .value("net_client", loadgen::SutKind::kNetClient);
  py::class_<NativeSutSettings>(m, "NativeSutSettings",
                                "Which SUT a run drives (kind) and the native SUTs' parameters.")
      .def(py::init([](SutKind kind, int64_t delay_ns, int64_t workers, int64_t max_batch,
                       int64_t service_ns, int64_t per_item_ns, double sigma, uint64_t seed) {
             NativeSutSettings n;
             n.kind = kind;
             n.delay_ns = delay_ns;
             n.workers = workers;
             n.max_batch = max_batch;
             n.service_ns = service_ns;
             n.per_item_ns = per_item_ns;
             n.sigma = sigma;
             n.seed = seed;
             return n;
           }),
           py::kw_only(), py::arg("kind") = SutKind::kNull, py::arg("delay_ns") = 0,
           py::arg("workers") = 4, py::arg("max_batch") = 8, py::arg("service_ns") = 2'000'000,
           py::arg("per_item_ns") = 250'000, py::arg("sigma") = 0.25, py::arg("seed") = 0)
      .def_readwrite("kind", &NativeSutSettings::kind)
      .def_readwrite("delay_ns", &NativeSutSettings::delay_ns)
      .def_readwrite("workers", &NativeSutSettings::workers)
      .def_readwrite("max_batch", &NativeSutSettings::max_batch)
      .def_readwrite("service_ns", &NativeSutSettings::service_ns)
      .def_readwrite("per_item_ns", &NativeSutSettings::per_item_ns)
      .def_readwrite("sigma", &NativeSutSettings::sigma)
      .def_readwrite("cpus", &NativeSutSettings::cpus)
      .def_readwrite("seed", &NativeSutSettings::seed)
      .def_readwrite("net", &NativeSutSettings::net);
}

// Where per-request records go, and their layout.
void bind_record_sink(py::module_& m) {
  py::enum_<loadgen::RecordSink>(m, "RecordSink")
      .value("none", loadgen::RecordSink::kNone)
      .value("jsonl", loadgen::RecordSink::kJsonl)
      .value("spool", loadgen::RecordSink::kSpool);
  // The layout of a record in a spool file (numpy.memmap reads it with this dtype). It is
  // made on first use (the module's __getattr__), so loading the module imports no numpy.
  m.def("__getattr__", [](const std::string& name) -> py::object {
    if (name == "record_dtype") {
      return record_dtype();
    }
    throw py::attribute_error("module 'loadgen._core' has no attribute '" + name + "'");
  });
  m.def("__dir__", [m]() {
    py::list names = py::list(m.attr("__dict__").attr("keys")());
    names.append("record_dtype");
    return names;
  });
}

void bind_engine_settings(py::module_& m) {
  py::class_<EngineSettings> settings(m, "EngineSettings");
  // The demo and fixed-delay parameters once sat on EngineSettings itself; these names
  // still read and write them, in `sut`.
  auto alias = [&settings](const char* name, auto member) {
    settings.def_property(
        name, [member](const EngineSettings& s) { return s.sut.*member; },
        [member](EngineSettings& s, decltype(NativeSutSettings{}.*member) v) { s.sut.*member = v; });
  };
  alias("sut_delay_ns", &NativeSutSettings::delay_ns);
  alias("demo_workers", &NativeSutSettings::workers);
  alias("demo_max_batch", &NativeSutSettings::max_batch);
  alias("demo_service_ns", &NativeSutSettings::service_ns);
  alias("demo_per_item_ns", &NativeSutSettings::per_item_ns);
  alias("demo_sigma", &NativeSutSettings::sigma);
  alias("sut_seed", &NativeSutSettings::seed);
  settings
      .def(py::init<>())
      .def_readwrite("load_mode", &EngineSettings::load_mode)
      .def_readwrite("arrival", &EngineSettings::arrival)
      .def_readwrite("target_qps", &EngineSettings::target_qps)
      .def_readwrite("stages", &EngineSettings::stages)
      .def_readwrite("stages_poisson", &EngineSettings::stages_poisson)
      .def_readwrite("burstiness", &EngineSettings::burstiness)
      .def_readwrite("trace_offsets_ns", &EngineSettings::trace_offsets_ns)
      .def_readwrite("concurrency", &EngineSettings::concurrency)
      .def_readwrite("max_in_flight", &EngineSettings::max_in_flight)
      .def_readwrite("min_duration_ns", &EngineSettings::min_duration_ns)
      .def_readwrite("min_query_count", &EngineSettings::min_query_count)
      .def_readwrite("max_duration_ns", &EngineSettings::max_duration_ns)
      .def_readwrite("max_query_count", &EngineSettings::max_query_count)
      .def_readwrite("warmup_ns", &EngineSettings::warmup_ns)
      .def_readwrite("ramp_up_ns", &EngineSettings::ramp_up_ns)
      .def_readwrite("sched_slice_ns", &EngineSettings::sched_slice_ns)
      .def_readwrite("samples_per_query", &EngineSettings::samples_per_query)
      .def_readwrite("sample_count", &EngineSettings::sample_count)
      .def_readwrite("sample_order", &EngineSettings::sample_order)
      .def_readwrite("schedule_seed", &EngineSettings::schedule_seed)
      .def_readwrite("sample_seed", &EngineSettings::sample_seed)
      .def_readwrite("spin_ns", &EngineSettings::spin_ns)
      .def_readwrite("pin_cpus", &EngineSettings::pin_cpus)
      .def_readwrite("timeout_ns", &EngineSettings::timeout_ns)
      .def_readwrite("grace_ns", &EngineSettings::grace_ns)
      .def_readwrite("interval_ns", &EngineSettings::interval_ns)
      .def_readwrite("significant_figures", &EngineSettings::significant_figures)
      .def_readwrite("highest_trackable_ns", &EngineSettings::highest_trackable_ns)
      .def_readwrite("table_capacity", &EngineSettings::table_capacity)
      .def_readwrite("inline_dispatch", &EngineSettings::inline_dispatch)
      .def_readwrite("follow_ups", &EngineSettings::follow_ups)
      .def_property(
          "sut", py::cpp_function([](EngineSettings& s) -> NativeSutSettings& { return s.sut; },
                                  py::return_value_policy::reference_internal),
          [](EngineSettings& s, const py::object& v) {
            // A bare SutKind (the older form) sets only the kind.
            if (py::isinstance<SutKind>(v)) {
              s.sut.kind = v.cast<SutKind>();
            } else {
              s.sut = v.cast<NativeSutSettings>();
            }
          },
          "A NativeSutSettings (assigning a SutKind sets its kind).")
      .def_readwrite("latency_bounds_ns", &EngineSettings::latency_bounds_ns)
      .def_readwrite("ttft_bounds_ns", &EngineSettings::ttft_bounds_ns)
      .def_readwrite("tpot_bounds_ns", &EngineSettings::tpot_bounds_ns)
      .def_readwrite("slo_latency_ns", &EngineSettings::slo_latency_ns)
      .def_readwrite("slo_ttft_ns", &EngineSettings::slo_ttft_ns)
      .def_readwrite("slo_tpot_ns", &EngineSettings::slo_tpot_ns)
      .def_readwrite("max_error_messages", &EngineSettings::max_error_messages)
      .def_property(
          "records_sink", [](const EngineSettings& s) { return s.records.sink; },
          [](EngineSettings& s, loadgen::RecordSink v) { s.records.sink = v; })
      .def_property(
          "records_path", [](const EngineSettings& s) { return s.records.path; },
          [](EngineSettings& s, const std::string& v) { s.records.path = v; })
      .def_property(
          "records_worker_index", [](const EngineSettings& s) { return s.records.worker_index; },
          [](EngineSettings& s, int64_t v) { s.records.worker_index = v; });
}

// The run: start and stop, queries handed out, completed and failed, follow-ups.
void def_run(EngineClass& c) {
  c
      .def(py::init<EngineSettings>(), py::arg("settings"))
      .def("start", &Engine::start, py::call_guard<py::gil_scoped_release>())
      .def("stop", &Engine::stop, py::call_guard<py::gil_scoped_release>())
      .def("abort", &Engine::abort, py::call_guard<py::gil_scoped_release>())
      .def("wait",
           [](Engine& e, const py::object& timeout_s) {
             const int64_t ns = seconds_to_ns(timeout_s);
             py::gil_scoped_release release;
             return e.wait(ns);
           },
           py::arg("timeout_s") = py::none())
      .def_property_readonly("finished", &Engine::finished)
      .def_property_readonly("table_capacity", &Engine::table_capacity)
      .def("take_batch",
           [](Engine& e, int64_t max, const py::object& timeout_s, int64_t spin_ns) -> py::object {
             if (max < 1) throw py::value_error("max must be >= 1");
             const int64_t spq = e.settings().samples_per_query;
             const int64_t timeout_ns = seconds_to_ns(timeout_s);
             std::vector<int64_t> ids(static_cast<size_t>(max));
             std::vector<int64_t> samples(static_cast<size_t>(max * spq));
             std::vector<int64_t> scheduled(static_cast<size_t>(max));
             // First without waiting, with the GIL held: at high rates a batch is ready.
             int64_t n = e.take_batch(ids.data(), samples.data(), scheduled.data(), max, 0, 0);
             if (n == 0) {
               py::gil_scoped_release release;
               n = e.take_batch(ids.data(), samples.data(), scheduled.data(), max, timeout_ns,
                                spin_ns);
             }
             if (n < 0) return py::none();
             Int64Array id_arr(n, ids.data());
             Int64Array sample_arr({n, spq}, samples.data());
             Int64Array scheduled_arr(n, scheduled.data());
             return py::make_tuple(id_arr, sample_arr, scheduled_arr);
           },
           py::arg("max"), py::arg("timeout_s") = py::none(), py::arg("spin_ns") = 0)
      .def("take_one",
           [](Engine& e, const py::object& timeout_s, int64_t spin_ns) -> py::object {
             return take_one(e, timeout_s, spin_ns);
           },
           py::arg("timeout_s") = py::none(), py::arg("spin_ns") = 0,
           "One query as (id, sample index); () on timeout; None when the run hands out no "
           "more. Needs samples_per_query == 1.")
      .def("complete_take_one",
           [](Engine& e, int64_t id, int64_t completed_ns, const py::object& timeout_s,
              int64_t spin_ns) -> py::object {
             e.complete(id, completed_ns);
             return take_one(e, timeout_s, spin_ns);
           },
           py::arg("id"), py::arg("completed_ns") = 0, py::arg("timeout_s") = py::none(),
           py::arg("spin_ns") = 0,
           "complete(id) and take_one() in one call: the per-query path of a serial SUT.")
      .def_property_readonly("inline_issue", &Engine::inline_issue)
      .def("eventfd", &Engine::eventfd)
      .def("arm_eventfd", &Engine::arm_eventfd)
      .def("complete",
           [](Engine& e, int64_t id, int64_t completed_ns, const py::handle& n_tokens, int64_t n_input,
              const py::object& event_ns, const py::object& tokens_per_event) {
             // Any Python int: one past int64 fails the query as the engine fails any count
             // out of range (invalid_token_count), not as a TypeError of the binding.
             int overflow = 0;
             const long long n = PyLong_AsLongLongAndOverflow(n_tokens.ptr(), &overflow);
             if (n == -1 && PyErr_Occurred()) throw py::error_already_set();
             if (overflow != 0) {
               e.fail(id, "invalid_token_count",
                      "n_tokens " + py::str(n_tokens).cast<std::string>() + " is out of range (-1: not known, or 0 to " +
                          std::to_string(loadgen::kMaxTokenCount) + ")");
               return false;
             }
             if (event_ns.is_none()) return e.complete(id, completed_ns, n, n_input);
             // A stream's token events, for its record: converted only when records are kept.
             if (e.records() == nullptr) return e.complete(id, completed_ns, n, n_input);
             const auto times = event_ns.cast<std::vector<int64_t>>();
             const auto tokens = tokens_per_event.cast<std::vector<int64_t>>();
             if (times.size() != tokens.size()) {
               throw py::value_error("event_ns and tokens_per_event must have one value per event");
             }
             const loadgen::TokenEvents events{times.data(), tokens.data(), times.size()};
             return e.complete(id, completed_ns, n, n_input, &events);
           },
           py::arg("id"), py::arg("completed_ns") = 0, py::arg("n_tokens") = -1, py::arg("n_input") = -1,
           py::arg("event_ns") = py::none(), py::arg("tokens_per_event") = py::none(),
           "Completes query id (see Engine::complete); a count of n_tokens outside -1..MAX_TOKEN_COUNT "
           "fails it as invalid_token_count. event_ns and tokens_per_event (one value per event): a "
           "stream's token events for its per-request record.")
      .def("complete_many",
           [](Engine& e, const Int64Array& ids, const py::object& completed_ns) {
             const int64_t n = static_cast<int64_t>(ids.size());
             const int64_t* idp = ids.data();
             if (completed_ns.is_none() || py::isinstance<py::int_>(completed_ns)) {
               const int64_t t = completed_ns.is_none() ? loadgen::now_ns() : completed_ns.cast<int64_t>();
               py::gil_scoped_release release;
               int64_t ok = 0;
               for (int64_t i = 0; i < n; ++i) ok += e.complete(idp[i], t);
               return ok;
             }
             const Int64Array ts = completed_ns.cast<Int64Array>();
             if (ts.size() != ids.size()) {
               throw py::value_error("completed_ns must have one time per id");
             }
             const int64_t* tp = ts.data();
             py::gil_scoped_release release;
             return e.complete_many(idp, tp, n);
           },
           py::arg("ids"), py::arg("completed_ns") = py::none())
      .def("fail",
           [](Engine& e, int64_t id, const py::str& kind, const py::str& message, bool count_unknown) {
             return e.fail(id, utf8_text(kind), utf8_text(message), count_unknown);
           },
           py::arg("id"), py::arg("kind"), py::arg("message"), py::arg("count_unknown") = true,
           "Fails query id; kind and message are cleaned and bounded (see Engine::fail). count_unknown "
           "false: an id not in flight is not counted.")
      .def("first_token", &Engine::first_token, py::arg("id"), py::arg("t_ns") = 0)
      .def("follow_up", &Engine::follow_up, py::arg("tag"), py::arg("at_ns"),
           "Multi-turn: one more query due at at_ns, handed out with sample index tag; call "
           "it before completing the query it follows. False once issuing has ended.")
      .def("follow_ups",
           [](const Engine& e) {
             py::dict d;
             d["pending"] = e.follow_ups_pending();
             d["issued"] = e.follow_ups_issued();
             d["dropped"] = e.follow_ups_dropped();
             return d;
           },
           "Follow-ups pending, issued and dropped (issuing ended first).");
}

// The native network client of a run whose SUT is one (SutKind.net_client): the
// responses waiting for the Python side's verdict, the verdicts, the client's figures.
void def_net_client(EngineClass& c) {
  c
      .def("net_take_unchecked",
           [](Engine& e, int64_t max, double timeout_s) -> py::object {
             NetClient* h = e.net_client();
             if (h == nullptr) throw py::value_error("the run's SUT is not a native network client");
             std::vector<loadgen::UncheckedResponse> got;
             bool more;
             {
               py::gil_scoped_release release;
               more = h->take_unchecked(&got, static_cast<size_t>(std::max<int64_t>(max, 1)),
                                        static_cast<int64_t>(timeout_s * 1e9));
             }
             if (!more) return py::none();
             py::list out;
             for (auto& u : got) {
               out.append(py::make_tuple(u.id, u.t_ns, u.status, py::bytes(u.body), u.problem, u.sample, u.scheduled_ns,
                                         u.input_tokens, u.output_tokens));
             }
             return out;
           },
           py::arg("max") = 256, py::arg("timeout_s") = 0.05,
           "Responses waiting for a verdict: [(id, t_ns, status, body, problem, sample, scheduled_ns, input_tokens, "
           "output_tokens)], waiting up to timeout_s; None once the client is closed and none is left. problem: 0, "
           "or a failed stream's SseProblem; the last four are the query's (settings.sut.net.check_each; -1: not "
           "known).")
      .def("net_resolve",
           [](Engine& e, const py::list& verdicts) {
             NetClient* h = e.net_client();
             if (h == nullptr) throw py::value_error("the run's SUT is not a native network client");
             std::vector<loadgen::ResponseVerdict> vs;
             vs.reserve(verdicts.size());
             for (const py::handle& item : verdicts) {
               const py::tuple t = py::reinterpret_borrow<py::tuple>(item);
               if (t.size() != 6 && t.size() != 8) {
                 throw py::value_error("a verdict is (id, t_ns, status, body, kind or None, message[, output_tokens, "
                                       "input_tokens])");
               }
               loadgen::ResponseVerdict v;
               v.id = t[0].cast<int64_t>();
               v.t_ns = t[1].cast<int64_t>();
               v.status = t[2].cast<int>();
               v.body = t[3].cast<std::string>();
               v.ok = t[4].is_none();
               if (!v.ok) {
                 v.kind = utf8_text(t[4].cast<py::str>());
                 v.message = utf8_text(t[5].cast<py::str>());
               } else if (t.size() == 8) {
                 v.output_tokens = t[6].cast<int64_t>();
                 v.input_tokens = t[7].cast<int64_t>();
               }
               vs.push_back(std::move(v));
             }
             py::gil_scoped_release release;
             h->resolve(vs);
           },
           py::arg("verdicts"),
           "Completes (kind None; with output_tokens and input_tokens when given, -1: not known) or fails each "
           "response's query, and caches the verdict by its bytes.")
      .def("net_add_request",
           [](Engine& e, int64_t sample, const py::bytes& request, int64_t input_tokens, int32_t group) {
             NetClient* h = e.net_client();
             if (h == nullptr) throw py::value_error("the run's SUT is not a native network client");
             std::string bytes = request;
             py::gil_scoped_release release;
             return h->add_request(sample, std::move(bytes), input_tokens, group);
           },
           py::arg("sample"), py::arg("request"), py::arg("input_tokens") = -1, py::arg("group") = -1,
           "A request the next query of sample index `sample` sends once instead of the prepared one (a "
           "multi-turn follow-up: call it before follow_up()), of request group `group` (-1: none); False when "
           "the client takes none (gRPC).")
      .def("net_stats",
           [](Engine& e) {
             py::dict d;
             NetClient* h = e.net_client();
             if (h == nullptr) return d;
             const loadgen::NetClientStats st = h->stats();
             d["connects"] = st.connects;
             d["connect_failures"] = st.connect_failures;
             d["connections_opened_before_run"] = st.connections_opened_before_run;
             d["bytes_sent"] = st.bytes_sent;
             d["responses"] = st.responses;
             d["cache_hits"] = st.cache_hits;
             d["checked_outside"] = st.checked_outside;
             d["closed_by_timeout"] = st.closed_by_timeout;
             d["queued"] = st.queued;
             d["handed_over"] = st.handed_over;
             d["tls_handshakes"] = st.tls_handshakes;
             d["tls_resumed"] = st.tls_resumed;
             return d;
           },
           "The native network client's counters ({} for other SUTs).")
      .def("sse_figures",
           [](Engine& e) {
             py::dict d;
             // OpenAI streams are HTTP/1.1's: the client of another protocol has no figures.
             auto* h = dynamic_cast<loadgen::HttpClient*>(e.net_client());
             if (h == nullptr) return d;
             loadgen::SseFigures f = [h] {
               py::gil_scoped_release release;
               return h->sse_figures();
             }();
             d["itl_ns"] = PyHistogram(std::move(f.itl_ns));
             d["tokens_per_s_milli"] = PyHistogram(std::move(f.tokens_per_s_milli));
             d["input_length_tokens"] = PyHistogram(std::move(f.input_length_tokens));
             d["output_length_tokens"] = PyHistogram(std::move(f.output_length_tokens));
             d["output_lengths"] = f.output_lengths;
             d["tokens_from_usage"] = f.tokens_from_usage;
             d["tokens_from_chunks"] = f.tokens_from_chunks;
             d["output_tokens"] = f.output_tokens;
             d["input_tokens_sent"] = f.input_tokens_sent;
             d["images_sent"] = f.images_sent;
             d["image_bytes_sent"] = f.image_bytes_sent;
             d["checked"] = f.checked;
             d["ttfrt_ns"] = PyHistogram(std::move(f.stream.ttfrt_ns));
             d["ttfat_ns"] = PyHistogram(std::move(f.stream.ttfat_ns));
             d["itl_per_token_ns"] = PyHistogram(std::move(f.stream.itl_per_token_ns));
             d["reasoning_length_tokens"] = PyHistogram(std::move(f.stream.reasoning_length_tokens));
             d["reasoning_tokens"] = f.stream.reasoning_tokens;
             d["reasoning_from_usage"] = f.stream.reasoning_from_usage;
             d["reasoning_from_chunks"] = f.stream.reasoning_from_chunks;
             d["split_by_chunks"] = f.stream.split_by_chunks;
             d["split_by_text"] = f.stream.split_by_text;
             d["cached_tokens"] = f.stream.cached_tokens;
             d["cached_from_usage"] = f.stream.cached_from_usage;
             d["tool_calls"] = f.stream.tool_calls;
             d["tool_call_requests"] = f.stream.tool_call_requests;
             py::list groups;  // by request group (a model mix's models)
             for (loadgen::GroupFigures& g : f.groups) {
               py::dict gd;
               gd["sent"] = g.sent;
               gd["answered"] = g.answered;
               gd["output_tokens"] = g.output_tokens;
               gd["latency_ns"] = PyHistogram(std::move(g.latency_ns));
               gd["ttft_ns"] = PyHistogram(std::move(g.ttft_ns));
               groups.append(gd);
             }
             d["groups"] = groups;
             return d;
           },
           "The native network client's figures of OpenAI streams (HTTP/1.1, settings.sut.net.sse): histograms "
           "and counts ({} for other SUTs). Any time during a run.")
      .def(
          "net_receive_wait",
          [](Engine& e) -> py::object {
            NetClient* net = e.net_client();
            if (net == nullptr) return py::none();
            return py::cast(PyHistogram(net->receive_wait()));
          },
          "The native network client's receive waits (ns): per read, how long the bytes read had "
          "waited in the socket since the kernel received them (SO_TIMESTAMPNS); None without one.");
}

// What the run recorded: counts, the Recorder, intervals, records, errors, its times.
void def_results(EngineClass& c) {
  c
      .def("counts",
           [](const Engine& e) {
             // Atomic loads only: cheap, and safe from any thread during a run.
             const loadgen::EngineCounts c = e.counts();
             py::dict d;
             d["issued"] = c.issued;
             d["completed"] = c.completed;
             d["failed"] = c.failed;
             d["timed_out"] = c.timed_out;
             d["cancelled"] = c.cancelled;
             d["outstanding"] = c.outstanding;
             d["unknown_completions"] = c.unknown_completions;
             d["duplicate_completions"] = c.duplicate_completions;
             d["late_completions"] = c.late_completions;
             d["cap_waits"] = c.room_waits;
             d["warmup_issued"] = c.warmup_issued;
             d["warmup_completed"] = c.warmup_completed;
             d["warmup_failed"] = c.warmup_failed;
             loadgen_bindings::put_recorder_counts(d, c);
             return d;
           })
      .def_property_readonly(
          "recorder", [](const Engine& e) -> const Recorder& { return e.recorder(); },
          py::return_value_policy::reference_internal,
          "The run's Recorder: latency, service time, issue delay, TTFT and TPOT histograms, counts over bounds.")
      .def("timeseries",
           [](const Engine& e) {
             py::list out;
             for (const loadgen::IntervalPoint& p : e.timeseries()) out.append(interval_dict(p));
             return out;
           },
           "The intervals so far, one dict each (safe while running).")
      .def("record_kinds",
           [](const Engine& e) {
             return e.records() ? e.records()->kinds() : std::vector<std::string>{};
           },
           "The error kinds of the records' error_kind field, by index (0: none).")
      .def("records_stats", &records_stats,
           "appended, written, lost, events_lost, peak_buffered, bytes, writer_cpu_ns, error ({} without "
           "records).")
      .def("last_interval",
           [](const Engine& e) -> py::object {
             std::optional<loadgen::IntervalPoint> p;
             {
               py::gil_scoped_release release;
               p = e.last_interval();
             }
             return p ? py::object(interval_dict(*p)) : py::none();
           },
           "The newest interval as timeseries() gives it, or None before the first ended. "
           "Cheap, and safe from any thread during a run.")
      .def("error_counts", &Engine::error_counts,
           "Failures by kind so far. Cheap, and safe from any thread during a run.")
      .def("error_messages", &Engine::error_messages)
      .def_property_readonly("start_ns", &Engine::start_ns)
      .def_property_readonly("measure_start_ns", &Engine::measure_start_ns)
      .def_property_readonly("issue_end_ns", &Engine::issue_end_ns)
      .def_property_readonly("end_ns", &Engine::end_ns)
      .def_property_readonly("run_error", &Engine::run_error)
      .def_property_readonly("sched_slice_applied", &Engine::sched_slice_applied);
}

}  // namespace

void bind_engine(py::module_& m) {
  m.def("now_ns", &loadgen::now_ns, "The engine's monotonic clock in ns (= time.monotonic_ns()).");
  m.def("allowed_cpus", &loadgen::allowed_cpus, "CPUs this process may run on.");
  py::enum_<loadgen::LoadMode>(m, "LoadMode")
      .value("open_loop", loadgen::LoadMode::kOpenLoop)
      .value("closed_loop", loadgen::LoadMode::kClosedLoop);
  bind_sut_settings(m);
  bind_record_sink(m);
  bind_engine_settings(m);
  EngineClass engine(m, "Engine");
  def_run(engine);
  def_net_client(engine);
  def_results(engine);
}
