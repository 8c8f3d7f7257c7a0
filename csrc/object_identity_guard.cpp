// ObjectIdentityGuard: `a is b` for many pairs of container items at once, in
// place of one Python `is` lambda per pair (DUPLICATE_INPUT), e.g. an
// optimizer's params[i] and the i-th key of its state dict. The containers are
// fetched from the frame locals at every check (strong references held while
// comparing), and only items of those live containers are compared: no pointer
// is kept between checks, so address reuse cannot make two different objects
// look identical.
#include "guard_accel_common.h"

#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace dynapatch {
namespace {

struct IdentityStep {
  bool attr; // getattr(obj, name) or obj[key]
  py::object name_or_key;
};

struct IdentityBase {
  py::object
      local_name; // L[local_name], or null: start at the guard's argument
  std::vector<IdentityStep> steps;
  bool keys; // items are dict keys by position (list(dict.keys(d))[i])
};

struct IdentityPair {
  int32_t base_a;
  int32_t base_b;
  Py_ssize_t index_a;
  Py_ssize_t index_b;
};

class ObjectIdentityGuard final : public LeafGuard {
 public:
  explicit ObjectIdentityGuard(py::object verbose_code_parts)
      : LeafGuard(std::move(verbose_code_parts)) {}

  bool check_nopybind(PyObject* locals) override {
    return first_failure(locals) == -1;
  }

  GuardDebugInfo check_verbose_nopybind(PyObject* locals) override {
    Py_ssize_t p = first_failure(locals);
    if (p == -1) {
      return GuardDebugInfo(true, 1);
    }
    if (p == -2) {
      return GuardDebugInfo(
          false,
          "object identity check: a container could not be fetched or changed type",
          0);
    }
    return GuardDebugInfo(
        false,
        descriptions_[p] + " failed: the objects are no longer identical",
        0);
  }

  // -1: all pairs identical; -2: a container could not be fetched or has the
  // wrong type; else the index of the first pair that differs (or is missing).
  Py_ssize_t first_failure(PyObject* locals) {
    std::vector<py::object> objs(bases_.size());
    for (size_t i = 0; i < bases_.size(); i++) {
      const IdentityBase& b = bases_[i];
      py::object obj = b.local_name
          ? py::reinterpret_steal<py::object>(
                PyObject_GetItem(locals, b.local_name.ptr()))
          : py::reinterpret_borrow<py::object>(
                locals); // the steps start at the argument
      for (const IdentityStep& s : b.steps) {
        if (!obj) {
          break;
        }
        obj = py::reinterpret_steal<py::object>(
            s.attr ? PyObject_GetAttr(obj.ptr(), s.name_or_key.ptr())
                   : PyObject_GetItem(obj.ptr(), s.name_or_key.ptr()));
      }
      if (!obj) {
        PyErr_Clear();
        return -2;
      }
      objs[i] = std::move(obj);
    }
    // From here on no Python code runs: borrowed items stay valid.
    items_.assign(bases_.size(), {});
    for (size_t i = 0; i < bases_.size(); i++) {
      PyObject* obj = objs[i].ptr();
      std::vector<PyObject*>& items = items_[i];
      if (bases_[i].keys) {
        if (!PyDict_Check(obj)) {
          return -2;
        }
        Py_ssize_t pos = 0;
        PyObject* key = nullptr;
        PyObject* value = nullptr;
        items.reserve(PyDict_GET_SIZE(obj));
        while (PyDict_Next(obj, &pos, &key, &value)) {
          items.push_back(key);
        }
      } else if (PyList_CheckExact(obj)) {
        items.assign(
            reinterpret_cast<PyListObject*>(obj)->ob_item,
            reinterpret_cast<PyListObject*>(obj)->ob_item +
                PyList_GET_SIZE(obj));
      } else if (PyTuple_CheckExact(obj)) {
        items.assign(
            reinterpret_cast<PyTupleObject*>(obj)->ob_item,
            reinterpret_cast<PyTupleObject*>(obj)->ob_item +
                PyTuple_GET_SIZE(obj));
      } else {
        return -2;
      }
    }
    for (size_t p = 0; p < pairs_.size(); p++) {
      const IdentityPair& pair = pairs_[p];
      const std::vector<PyObject*>& a = items_[pair.base_a];
      const std::vector<PyObject*>& b = items_[pair.base_b];
      if (pair.index_a >= static_cast<Py_ssize_t>(a.size()) ||
          pair.index_b >= static_cast<Py_ssize_t>(b.size()) ||
          a[pair.index_a] != b[pair.index_b]) {
        return static_cast<Py_ssize_t>(p);
      }
    }
    return -1;
  }

  std::vector<IdentityBase> bases_;
  std::vector<IdentityPair> pairs_;
  std::vector<std::string> descriptions_; // per pair: "a is b"
  std::vector<std::vector<PyObject*>> items_; // scratch: borrowed, one check
};

struct IdentityObject {
  PyObject_HEAD vectorcallfunc vectorcall;
  ObjectIdentityGuard* guard;
};

// Static type, zero-initialized here and filled in by ready_type at module
// init.
PyTypeObject IdentityType{};

PyObject* identity_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames) {
  GUARD_ACCEL_TRY
  PyObject* locals = one_arg(args, nargsf, kwnames, "ObjectIdentityGuard");
  if (locals == nullptr) {
    return nullptr;
  }
  return check_result(
      reinterpret_cast<IdentityObject*>(self)->guard->check_nopybind(locals));
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* identity_explain(PyObject* self, PyObject* locals) {
  GUARD_ACCEL_TRY
  return explain_result(
      reinterpret_cast<IdentityObject*>(self)->guard->check_verbose_nopybind(
          locals));
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* identity_summary(PyObject* self, PyObject* /*unused*/) {
  GUARD_ACCEL_TRY
  ObjectIdentityGuard* g = reinterpret_cast<IdentityObject*>(self)->guard;
  std::ostringstream os;
  os << g->pairs_.size() << " same-object check"
     << (g->pairs_.size() == 1 ? "" : "s")
     << " in one native ObjectIdentityGuard";
  if (!g->descriptions_.empty()) {
    os << " (e.g. " << g->descriptions_[0] << ")";
  }
  return string_result(os.str());
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* identity_code_parts(PyObject* self, PyObject* /*unused*/) {
  GUARD_ACCEL_TRY
  return code_parts_result(*reinterpret_cast<IdentityObject*>(self)->guard);
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* identity_len(PyObject* self, PyObject* /*unused*/) {
  return PyLong_FromSize_t(
      reinterpret_cast<IdentityObject*>(self)->guard->pairs_.size());
}

void identity_dealloc(PyObject* self) {
  delete reinterpret_cast<IdentityObject*>(self)->guard;
  Py_TYPE(self)->tp_free(self);
}

PyMethodDef identity_methods[] = {
    {"explain",
     identity_explain,
     METH_O,
     "explain(frame_locals) -> True, or the first pair that is no longer identical"},
    {"num_pairs",
     identity_len,
     METH_NOARGS,
     "number of identity pairs checked"},
    {"summary",
     identity_summary,
     METH_NOARGS,
     "one line saying what the guard checks"},
    {"verbose_code_parts",
     identity_code_parts,
     METH_NOARGS,
     "the guard's verbose code parts (as LeafGuard.verbose_code_parts)"},
    {nullptr, nullptr, 0, nullptr}};

// bases: [(local_name, [(is_attr, name_or_key), ...], keys)], pairs:
// [(base_a, index_a, base_b, index_b, description)].
py::object make_object_identity_guard(
    const py::handle& bases_arg,
    const py::handle& pairs_arg,
    const py::handle& verbose_code_parts) {
  if (!PyList_Check(bases_arg.ptr()) || !PyList_Check(pairs_arg.ptr())) {
    throw py::type_error("bases and pairs must be lists");
  }
  // Copies: the caller's lists cannot change while they are read.
  auto bases =
      py::reinterpret_steal<py::list>(PySequence_List(bases_arg.ptr()));
  auto pairs =
      py::reinterpret_steal<py::list>(PySequence_List(pairs_arg.ptr()));
  if (!bases || !pairs) {
    throw py::error_already_set();
  }
  auto guard = std::make_unique<ObjectIdentityGuard>(
      verbose_code_parts_arg(verbose_code_parts));
  for (py::handle item : bases) {
    py::tuple b = tuple_arg(item, "base");
    if (b.size() != 3 ||
        !(b[0].is_none() || PyUnicode_CheckExact(b[0].ptr()))) {
      throw py::value_error(
          "base must be (local_name: str | None, steps, keys: bool)");
    }
    IdentityBase base{py::object(), {}, bool_arg(b[2], "base keys")};
    if (!b[0].is_none()) {
      base.local_name = py::reinterpret_borrow<py::object>(b[0]);
    }
    for (py::handle st : tuple_or_list(b[1], "base steps")) {
      py::tuple step = tuple_arg(st, "step");
      if (step.size() != 2) {
        throw py::value_error("step must be (is_attr, name_or_key)");
      }
      bool attr = bool_arg(step[0], "step is_attr");
      PyObject* k = step[1].ptr();
      // Constant keys only: their hashing and comparison run no user code.
      if (attr ? !PyUnicode_CheckExact(k)
               : !(PyUnicode_CheckExact(k) || PyLong_CheckExact(k))) {
        throw py::type_error(
            "steps take exact str attribute names and str/int keys");
      }
      base.steps.push_back(
          IdentityStep{attr, py::reinterpret_borrow<py::object>(step[1])});
    }
    guard->bases_.push_back(std::move(base));
  }
  const auto num_bases = static_cast<Py_ssize_t>(guard->bases_.size());
  for (py::handle item : pairs) {
    py::tuple p = tuple_arg(item, "pair");
    if (p.size() != 5) {
      throw py::value_error(
          "pair must be (base_a, index_a, base_b, index_b, description)");
    }
    Py_ssize_t base_a = index_arg(p[0], "pair base_a");
    Py_ssize_t base_b = index_arg(p[2], "pair base_b");
    if (base_a >= num_bases || base_b >= num_bases) {
      throw py::value_error("pair refers to an unknown base");
    }
    IdentityPair pair{
        static_cast<int32_t>(base_a),
        static_cast<int32_t>(base_b),
        index_arg(p[1], "pair index_a"),
        index_arg(p[3], "pair index_b")};
    guard->pairs_.push_back(pair);
    guard->descriptions_.push_back(utf8_arg(p[4], "pair description"));
  }
  IdentityObject* obj = PyObject_New(IdentityObject, &IdentityType);
  if (obj == nullptr) {
    throw py::error_already_set();
  }
  obj->vectorcall = identity_vectorcall;
  obj->guard = guard.release();
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(obj));
}

void init_object_identity_guard(py::module_& m) {
  ready_type(
      IdentityType,
      "torch._dynamo._guard_accel.ObjectIdentityGuard",
      sizeof(IdentityObject),
      offsetof(IdentityObject, vectorcall),
      identity_dealloc,
      identity_methods,
      "ObjectIdentityGuard(frame_locals) -> bool: `a is b` for every recorded pair "
      "of container items");
  m.attr("ObjectIdentityGuard") =
      py::handle(reinterpret_cast<PyObject*>(&IdentityType));
  m.def(
      "make_object_identity_guard",
      &make_object_identity_guard,
      py::arg("bases"),
      py::arg("pairs"),
      py::arg("verbose_code_parts"),
      "Build an ObjectIdentityGuard. bases: (local_name or None for the guard's argument, steps, keys) with steps "
      "(is_attr, name_or_key) from the frame locals to a list/tuple (keys False) or "
      "dict whose keys are indexed by position (keys True); pairs: (base_a, index_a, "
      "base_b, index_b, description); verbose_code_parts: its LeafGuard verbose code parts.");
}

const RegisterModuleInit registered(init_object_identity_guard);

} // namespace
} // namespace dynapatch
