// Bindings for the native network client: its settings (one client, HTTP/1.1 or gRPC by
// protocol), which protocols this build has, and its parts that tests and fuzzing drive on
// their own: the HTTP/1.1 response parser and the SSE scanner (against the Python client's
// TokenStream), with their microbenchmarks. A run's client is the engine's SUT: the
// Engine's net_* methods (bind_engine.cc) reach it. The parser is driven with the GIL
// held: its body callback calls back into Python, and one feed of a typical response
// costs less than releasing and taking the GIL again.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grpc_client.h"
#include "http_parser.h"
#include "net_client.h"
#include "sse.h"
#include "tls.h"

namespace py = pybind11;
using loadgen::HttpParserLimits;
using loadgen::HttpResponseParser;
using loadgen::NetClientSettings;
using loadgen::NetProtocol;
using loadgen::SseScanner;

namespace {

std::string_view view_of(const py::bytes& b) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(b.ptr(), &data, &size) != 0) throw py::error_already_set();
  return {data, static_cast<size_t>(size)};
}

const char* result_name(HttpResponseParser::Result r) {
  switch (r) {
    case HttpResponseParser::Result::kNeedMore:
      return "need_more";
    case HttpResponseParser::Result::kComplete:
      return "complete";
    case HttpResponseParser::Result::kError:
      break;
  }
  return "error";
}

void bind_net_client_settings(py::module_& m) {
  py::enum_<NetProtocol>(m, "NetProtocol", "The native network client's wire protocol.")
      .value("http1", NetProtocol::kHttp1)
      .value("grpc", NetProtocol::kGrpc);
  py::class_<NetClientSettings>(m, "NetClientSettings",
                                "The native network client's settings (SutKind.net_client): HTTP/1.1 or gRPC "
                                "by protocol.")
      .def(py::init<>())
      .def_readwrite("protocol", &NetClientSettings::protocol)
      .def_readwrite("host", &NetClientSettings::host)
      .def_readwrite("port", &NetClientSettings::port)
      .def_readwrite("connections", &NetClientSettings::connections)
      .def_readwrite("warm_connections", &NetClientSettings::warm_connections)
      .def_readwrite("io_threads", &NetClientSettings::io_threads)
      .def_property(
          "requests",
          [](const NetClientSettings& s) {
            py::list out;
            for (const std::string& r : s.requests) out.append(py::bytes(r));
            return out;
          },
          [](NetClientSettings& s, const std::vector<py::bytes>& reqs) {
            s.requests.clear();
            for (const py::bytes& r : reqs) s.requests.emplace_back(r);
          },
          "The prepared requests (bytes), by sample index.")
      .def_readwrite("head_only", &NetClientSettings::head_only)
      .def_readwrite("max_response_bytes", &NetClientSettings::max_response_bytes)
      .def_readwrite("connect_timeout_ns", &NetClientSettings::connect_timeout_ns)
      .def_readwrite("timeout_ns", &NetClientSettings::timeout_ns)
      .def_readwrite("cache_entries", &NetClientSettings::cache_entries)
      .def_readwrite("cache_body_bytes", &NetClientSettings::cache_body_bytes)
      .def_readwrite("cpus", &NetClientSettings::cpus)
      .def_readwrite("sse", &NetClientSettings::sse)
      .def_readwrite("sse_check", &NetClientSettings::sse_check)
      .def_readwrite("sse_responses", &NetClientSettings::sse_responses)
      .def_readwrite("input_tokens", &NetClientSettings::input_tokens)
      .def_readwrite("image_bytes", &NetClientSettings::image_bytes)
      .def_readwrite("images_per_request", &NetClientSettings::images_per_request)
      .def_readwrite("request_groups", &NetClientSettings::request_groups)
      .def_readwrite("group_count", &NetClientSettings::group_count)
      .def_readwrite("significant_figures", &NetClientSettings::significant_figures)
      .def_readwrite("check_each", &NetClientSettings::check_each)
      .def_readwrite("whole_answers", &NetClientSettings::whole_answers)
      .def_readwrite("grpc_method", &NetClientSettings::grpc_method)
      .def_readwrite("authority", &NetClientSettings::authority)
      .def_readwrite("metadata", &NetClientSettings::metadata)
      .def_readwrite("max_in_flight", &NetClientSettings::max_in_flight)
      .def_readwrite("tls", &NetClientSettings::tls)
      .def_readwrite("server_name", &NetClientSettings::server_name)
      .def_readwrite("ca_file", &NetClientSettings::ca_file)
      .def_readwrite("insecure", &NetClientSettings::insecure);
  m.def("tls_available", &loadgen::tls_available,
        "Whether this build's network client speaks TLS (it was built with OpenSSL).");
  m.def("tls_library_version", &loadgen::tls_library_version,
        "The OpenSSL version the network client's TLS runs on (\"\" without it).");
  m.def("tls_check", &loadgen::tls_check, py::call_guard<py::gil_scoped_release>(),
        "One TLS handshake with host:port (numeric), as the network client's connections make it: \"\" when it "
        "succeeds, else why not (a certificate that does not verify, the server's refusal, ALPN not chosen).",
        py::arg("host"), py::arg("port"), py::arg("server_name"), py::arg("ca_file"), py::arg("insecure"),
        py::arg("alpn"), py::arg("timeout_ns"));
  m.def("grpc_client_available", &loadgen::grpc_client_available,
        "Whether this build's network client has its gRPC protocol (it was built with nghttp2).");
  m.def("grpc_client_nghttp2_version", &loadgen::grpc_client_nghttp2_version,
        "The nghttp2 version the network client's gRPC protocol runs on (\"\" without it).");
  m.def(
      "grpc_unary_call",
      [](const NetClientSettings& settings, const std::string& method, const py::bytes& request, int64_t timeout_ns) {
        std::string req = request;
        loadgen::GrpcUnaryResult r;
        {
          py::gil_scoped_release release;
          r = loadgen::grpc_unary_call(settings, method, req, timeout_ns);
        }
        return py::make_tuple(r.code, py::bytes(r.text));
      },
      "One unary gRPC call of `method` with the serialized `request`, on a connection of its own with the "
      "settings' server, TLS and metadata, waited for: (status code, response message or status message).",
      py::arg("settings"), py::arg("method"), py::arg("request"), py::arg("timeout_ns"));
}

void bind_http_parser(py::module_& m) {
  py::class_<HttpResponseParser>(m, "HttpResponseParser")
      .def(py::init([](int64_t max_head_bytes, int64_t max_body_bytes) {
             HttpParserLimits limits;
             limits.max_head_bytes = max_head_bytes;
             limits.max_body_bytes = max_body_bytes;
             return HttpResponseParser(limits);
           }),
           py::arg("max_head_bytes") = 64 * 1024, py::arg("max_body_bytes") = int64_t{64} << 20)
      .def("start", &HttpResponseParser::start, py::arg("head_only") = false)
      .def(
          "feed",
          [](HttpResponseParser& p, const py::bytes& data) {
            const std::string_view v = view_of(data);
            size_t consumed = 0;
            const auto r = p.feed(v.data(), v.size(), &consumed);
            return py::make_tuple(result_name(r), consumed);
          },
          py::arg("data"))
      .def("eof_completes", &HttpResponseParser::eof_completes)
      .def(
          "set_body_callback",
          [](HttpResponseParser& p, py::object cb) {
            if (cb.is_none()) {
              p.set_body_callback(nullptr);
              return;
            }
            if (!PyCallable_Check(cb.ptr())) throw py::type_error("the body callback must be callable or None");
            p.set_body_callback([cb = std::move(cb)](const char* data, size_t n) {
              cb(py::bytes(data, n));
            });
          },
          py::arg("callback"))
      .def_property_readonly("status", &HttpResponseParser::status)
      .def_property_readonly("keep_alive", &HttpResponseParser::keep_alive)
      .def_property_readonly("got_bytes", &HttpResponseParser::got_bytes)
      .def_property_readonly("body",
                             [](const HttpResponseParser& p) {
                               const std::string& b = p.body();
                               return py::bytes(b.data(), b.size());
                             })
      .def_property_readonly("error_kind", &HttpResponseParser::error_kind)
      .def_property_readonly("error_message", &HttpResponseParser::error_message);
  m.def(
      "time_http_parse_ns",
      [](const py::bytes& response, int pieces, int64_t iterations) {
        const std::string_view v = view_of(response);
        py::gil_scoped_release release;
        return loadgen::time_http_parse_ns(v.data(), v.size(), pieces, iterations);
      },
      py::arg("response"), py::arg("pieces") = 1, py::arg("iterations") = 1000000);
}

void bind_sse_scanner(py::module_& m) {
  m.attr("MAX_TOKEN_COUNT") = loadgen::kMaxTokenCount;
  py::class_<SseScanner>(m, "SseScanner")
      .def(py::init<int64_t, bool>(), py::arg("max_event_bytes") = int64_t{64} << 20, py::arg("responses") = false)
      .def("start", &SseScanner::start)
      .def(
          "feed",
          [](SseScanner& s, const py::bytes& data, int64_t t_ns) {
            const std::string_view v = view_of(data);
            return s.feed(v.data(), v.size(), t_ns);
          },
          py::arg("data"), py::arg("t_ns"))
      .def("finish", &SseScanner::finish, py::arg("t_ns"))
      .def_property_readonly("chunks", &SseScanner::chunks)
      .def_property_readonly("usage_tokens", &SseScanner::usage_tokens)
      .def_property_readonly("done", &SseScanner::done)
      .def_property_readonly("finished", &SseScanner::finished)
      .def_property_readonly("first_ns", &SseScanner::first_ns)
      .def_property_readonly("last_ns", &SseScanner::last_ns)
      .def_property_readonly("gaps", [](const SseScanner& s) { return py::cast(s.gaps()); })
      .def_property_readonly("problem", [](const SseScanner& s) { return static_cast<int>(s.problem()); })
      .def_property_readonly("problem_data",
                             [](const SseScanner& s) {
                               const std::string& b = s.problem_data();
                               return py::bytes(b.data(), b.size());
                             })
      .def_property_readonly("held",
                             [](const SseScanner& s) {
                               const std::string& b = s.held();
                               return py::bytes(b.data(), b.size());
                             })
      .def_property_readonly("held_over", &SseScanner::held_over)
      .def_property_readonly("reasoning_chunks", &SseScanner::reasoning_chunks)
      .def_property_readonly("tool_calls", &SseScanner::tool_calls)
      .def_property_readonly("usage_reasoning_tokens", &SseScanner::usage_reasoning_tokens)
      .def_property_readonly("usage_cached_tokens", &SseScanner::usage_cached_tokens)
      .def_property_readonly("first_reasoning_ns", &SseScanner::first_reasoning_ns)
      .def_property_readonly("first_answer_ns", &SseScanner::first_answer_ns)
      .def_property_readonly("events",
                             [](const SseScanner& s) {
                               py::list out;
                               for (size_t j = 0; j < s.event_ns().size(); ++j) {
                                 out.append(py::make_tuple(s.event_ns()[j], s.event_tokens()[j],
                                                           s.event_weights()[j]));
                               }
                               return out;
                             })
      .def(
          "token_itl",
          [](const SseScanner& s, int64_t total_tokens) {
            py::list out;
            s.token_itl(total_tokens, [&](int64_t value, int64_t k) { out.append(py::make_tuple(value, k)); });
            return out;
          },
          py::arg("total_tokens"),
          "The per-token inter-token latency as (value_ns, count) pairs (total_tokens < 0: none given).");

  m.def(
      "time_sse_scan_ns",
      [](const py::bytes& stream, int pieces, int64_t iterations) {
        const std::string_view v = view_of(stream);
        py::gil_scoped_release release;
        return loadgen::time_sse_scan_ns(v.data(), v.size(), pieces, iterations);
      },
      py::arg("stream"), py::arg("pieces") = 1, py::arg("iterations") = 100000);
  m.def(
      "read_whole_answer",
      [](const py::bytes& body) -> py::object {
        const std::string_view v = view_of(body);
        loadgen::WholeAnswer a;
        if (!loadgen::read_whole_answer(v.data(), v.size(), &a)) return py::none();
        return py::make_tuple(a.tokens, a.reasoning_tokens);
      },
      py::arg("body"),
      "A non-streamed OpenAI answer the native client counts itself: (usage.completion_tokens, reasoning "
      "tokens or -1), or None when the Python check judges it (csrc/sse.h).");
}

}  // namespace

void bind_net(py::module_& m) {
  bind_net_client_settings(m);
  bind_http_parser(m);
  bind_sse_scanner(m);
}
