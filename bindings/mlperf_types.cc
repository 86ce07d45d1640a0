#include "mlperf_types.h"

namespace loadgen_bindings {
namespace {

// An unsigned 64-bit value from any integer-like object (int, numpy integers, ...).
bool to_u64(PyObject* v, const char* name, unsigned long long* out) {
  if (PyLong_CheckExact(v)) {
    const unsigned long long value = PyLong_AsUnsignedLongLong(v);
    if (!(value == static_cast<unsigned long long>(-1) && PyErr_Occurred())) {
      *out = value;
      return true;
    }
    PyErr_Clear();
  }
  PyObject* index = PyNumber_Index(v);
  if (index == nullptr) {
    PyErr_Format(PyExc_TypeError, "%s must be an integer, got %s", name, Py_TYPE(v)->tp_name);
    return false;
  }
  const unsigned long long value = PyLong_AsUnsignedLongLong(index);
  Py_DECREF(index);
  if (value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Format(PyExc_OverflowError, "%s must be in 0..2**64-1", name);
    return false;
  }
  *out = value;
  return true;
}

bool to_i64(PyObject* v, const char* name, long long* out) {
  PyObject* index = PyNumber_Index(v);
  if (index == nullptr) {
    PyErr_Format(PyExc_TypeError, "%s must be an integer, got %s", name, Py_TYPE(v)->tp_name);
    return false;
  }
  const long long value = PyLong_AsLongLong(index);
  Py_DECREF(index);
  if (value == -1 && PyErr_Occurred()) {
    PyErr_Format(PyExc_OverflowError, "%s must fit in a signed 64-bit integer", name);
    return false;
  }
  *out = value;
  return true;
}

int sample_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"id", "index", nullptr};
  PyObject* id = nullptr;
  PyObject* index = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:QuerySample", const_cast<char**>(kw), &id, &index)) {
    return -1;
  }
  auto* s = reinterpret_cast<QuerySampleObject*>(self);
  if (id != nullptr && !to_u64(id, "id", &s->id)) return -1;
  if (index != nullptr && !to_u64(index, "index", &s->index)) return -1;
  return 0;
}

PyObject* sample_repr(PyObject* self) {
  auto* s = reinterpret_cast<QuerySampleObject*>(self);
  return PyUnicode_FromFormat("QuerySample(id=%llu, index=%llu)", s->id, s->index);
}

PyObject* sample_reduce(PyObject* self, PyObject*) {
  auto* s = reinterpret_cast<QuerySampleObject*>(self);
  return Py_BuildValue("(O(KK))", reinterpret_cast<PyObject*>(Py_TYPE(self)), s->id, s->index);
}

int response_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"id", "data", "size", "n_tokens", nullptr};
  PyObject* v[4] = {nullptr, nullptr, nullptr, nullptr};
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  if (kwargs == nullptr && nargs <= 4) {
    // The common positional call, without the general argument parser.
    for (Py_ssize_t i = 0; i < nargs; ++i) v[i] = PyTuple_GET_ITEM(args, i);
  } else if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OOOO:QuerySampleResponse", const_cast<char**>(kw), &v[0],
                                   &v[1], &v[2], &v[3])) {
    return -1;
  }
  auto* r = reinterpret_cast<QuerySampleResponseObject*>(self);
  if (v[0] != nullptr && !to_u64(v[0], "id", &r->id)) return -1;
  if (v[1] != nullptr && !to_u64(v[1], "data", &r->data)) return -1;
  if (v[2] != nullptr && !to_u64(v[2], "size", &r->size)) return -1;
  if (v[3] != nullptr && !to_i64(v[3], "n_tokens", &r->n_tokens)) return -1;
  return 0;
}

PyObject* response_repr(PyObject* self) {
  auto* r = reinterpret_cast<QuerySampleResponseObject*>(self);
  return PyUnicode_FromFormat("QuerySampleResponse(id=%llu, data=%llu, size=%llu, n_tokens=%lld)", r->id, r->data,
                              r->size, r->n_tokens);
}

PyObject* response_reduce(PyObject* self, PyObject*) {
  auto* r = reinterpret_cast<QuerySampleResponseObject*>(self);
  return Py_BuildValue("(O(KKKL))", reinterpret_cast<PyObject*>(Py_TYPE(self)), r->id, r->data, r->size,
                       r->n_tokens);
}

PyMemberDef sample_members[] = {
    {"id", T_ULONGLONG, offsetof(QuerySampleObject, id), 0, "Identifies the sample in its response."},
    {"index", T_ULONGLONG, offsetof(QuerySampleObject, index), 0, "The sample's index in the QSL."},
    {nullptr, 0, 0, 0, nullptr}};

PyMemberDef response_members[] = {
    {"id", T_ULONGLONG, offsetof(QuerySampleResponseObject, id), 0, "The QuerySample's id."},
    {"data", T_ULONGLONG, offsetof(QuerySampleResponseObject, data), 0, "Address of the output bytes."},
    {"size", T_ULONGLONG, offsetof(QuerySampleResponseObject, size), 0, "Number of output bytes."},
    {"n_tokens", T_LONGLONG, offsetof(QuerySampleResponseObject, n_tokens), 0, "Output tokens (token runs)."},
    {nullptr, 0, 0, 0, nullptr}};

PyMethodDef sample_methods[] = {{"__reduce__", sample_reduce, METH_NOARGS, nullptr},
                                {nullptr, nullptr, 0, nullptr}};
PyMethodDef response_methods[] = {{"__reduce__", response_reduce, METH_NOARGS, nullptr},
                                  {nullptr, nullptr, 0, nullptr}};

}  // namespace

// The type objects are filled in field by field in ready_query_sample_types(), which
// reads better than a positional initializer of ~50 members; the rest stay zero.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
PyTypeObject QuerySampleType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject QuerySampleResponseType = {PyVarObject_HEAD_INIT(nullptr, 0)};
#pragma GCC diagnostic pop

bool ready_query_sample_types() {
  static bool ready = false;
  if (ready) return true;
  PyTypeObject& s = QuerySampleType;
  s.tp_name = "loadgen._core.QuerySample";
  s.tp_basicsize = sizeof(QuerySampleObject);
  s.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
  s.tp_doc = "QuerySample(id=0, index=0): one sample of a query: its id (for the response) and QSL index.";
  s.tp_new = PyType_GenericNew;
  s.tp_init = sample_init;
  s.tp_repr = sample_repr;
  s.tp_members = sample_members;
  s.tp_methods = sample_methods;
  PyTypeObject& r = QuerySampleResponseType;
  r.tp_name = "loadgen._core.QuerySampleResponse";
  r.tp_basicsize = sizeof(QuerySampleResponseObject);
  r.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
  r.tp_doc =
      "QuerySampleResponse(id=0, data=0, size=0, n_tokens=0): a finished sample: its id, and the address and "
      "size of its output.";
  r.tp_new = PyType_GenericNew;
  r.tp_init = response_init;
  r.tp_repr = response_repr;
  r.tp_members = response_members;
  r.tp_methods = response_methods;
  if (PyType_Ready(&s) < 0 || PyType_Ready(&r) < 0) return false;
  ready = true;
  return true;
}

}  // namespace loadgen_bindings
