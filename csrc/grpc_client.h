#pragma once
// The native network client over gRPC (NetProtocol::kGrpc): unary calls of one method,
// with prepared request messages, multiplexed over HTTP/2 connections opened before the
// run (framing by nghttp2). The issuing thread submits each call and writes its frames itself at the
// query's scheduled time; I/O threads (epoll) read the responses, and a call's end (its
// trailers, a reset, the connection's loss) completes or fails its query natively. In a
// closed loop the I/O thread that read a response issues the next call; in an open loop
// the engine's issue thread, which only times arrivals, submits each call. It never waits
// for a connection's lock an I/O thread holds: the call goes to that connection's inbox,
// and whoever releases the lock next sends it.
//
// A call's outcome is judged as the HTTP/1.1 client's responses are (net_client.h): status
// 0 with its response message, or a non-zero status with its message, keyed into the
// verdict cache and otherwise handed to the Python side's check (which names failures
// as the grpcio clients do: grpc_<CODE>). What the gRPC library would decide itself is
// decided here with grpcio's codes: a non-200 HTTP status as the gRPC spec maps it, a
// stream reset by its HTTP/2 error code, a lost connection or failed connect as
// UNAVAILABLE, a response over max_response_bytes as RESOURCE_EXHAUSTED. A per-query
// timeout resets the call's stream (CANCEL) and leaves the count to the engine; no
// grpc-timeout is sent, so the server never ends a call for its deadline.
//
// The build has this client where nghttp2's header was found (setup.py); else
// make_grpc_client() throws and grpc_client_available() is false.

#include <cstdint>
#include <memory>
#include <string>

#include "net_client.h"

namespace loadgen {

/// Whether this build has the native gRPC client (built with nghttp2).
bool grpc_client_available() noexcept;

/// The version of nghttp2 the client runs on ("" without it).
const char* grpc_client_nghttp2_version() noexcept;

/// The gRPC part of validate(const NetClientSettings&): the method's path, the calls in
/// flight, the metadata; no HTTP/1.1-only field set. Throws std::invalid_argument naming
/// the bad field (net.grpc_method, net.metadata, ...).
void validate_grpc(const NetClientSettings& s);

/// The client (`settings.protocol` is NetProtocol::kGrpc), not started; make_net_client()
/// calls it. Throws std::invalid_argument on bad settings, std::runtime_error when the
/// build has no nghttp2.
std::unique_ptr<NetClient> make_grpc_client(const NetClientSettings& settings);

/// A unary call's end: its gRPC status `code` (0: OK) and `text`, the response message
/// (code 0) or the status message.
struct GrpcUnaryResult {
  int code = 0;
  std::string text;
};

/// One unary call of `method` (/package.Service/Method) with the serialized `request`,
/// made on a connection of its own and waited for (at most `timeout_ns` in all): for
/// prepare time (readiness, metadata), with the run's connection settings (`settings`:
/// host, port, TLS, authority, metadata, max_response_bytes; the rest is ignored). A
/// failed connect or handshake is UNAVAILABLE, the timeout DEADLINE_EXCEEDED; otherwise
/// judged as the client judges a run's calls. Throws std::invalid_argument on bad
/// settings, std::runtime_error for a CA file that does not load or a build without
/// nghttp2. Blocking; any thread.
GrpcUnaryResult grpc_unary_call(const NetClientSettings& settings, const std::string& method,
                                const std::string& request, int64_t timeout_ns);

}  // namespace loadgen
