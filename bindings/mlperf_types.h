#pragma once
// QuerySample and QuerySampleResponse as plain CPython types.
//
// A harness creates one QuerySampleResponse per sample and the issue loop creates one
// QuerySample per sample, so these two types sit on the per-query path of every
// loadgen.mlperf run. pybind11 classes cost several hundred instructions to construct
// (overload dispatch, holder set-up) and to read; a fixed-layout CPython type with
// member descriptors costs a fraction of that, and the completion path reads its fields
// straight from the struct.
#include <Python.h>
#include <structmember.h>

#include <cstdint>
#include <string>

namespace loadgen_bindings {

struct QuerySampleObject {
  PyObject_HEAD
  unsigned long long id;
  unsigned long long index;
};

struct QuerySampleResponseObject {
  PyObject_HEAD
  unsigned long long id;
  unsigned long long data;
  unsigned long long size;
  long long n_tokens;
};

extern PyTypeObject QuerySampleType;
extern PyTypeObject QuerySampleResponseType;

/// Readies both types (once); false with a Python error set on failure.
bool ready_query_sample_types();

/// A new QuerySample (a new reference), or null with a Python error set.
inline PyObject* new_query_sample(unsigned long long id, unsigned long long index) {
  auto* o = PyObject_New(QuerySampleObject, &QuerySampleType);
  if (o != nullptr) {
    o->id = id;
    o->index = index;
  }
  return reinterpret_cast<PyObject*>(o);
}

inline bool is_query_sample_response(PyObject* o) {
  return Py_TYPE(o) == &QuerySampleResponseType || PyObject_TypeCheck(o, &QuerySampleResponseType);
}

}  // namespace loadgen_bindings
