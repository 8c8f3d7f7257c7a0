// What every guard class of torch._dynamo._guard_accel shares: the
// GuardDebugInfo / LeafGuard shape of torch/csrc/dynamo/guards.cpp, the
// C-API entry point wrappers (GUARD_ACCEL_TRY/CATCH, as HANDLE_TH_ERRORS
// in-tree), the helpers that build a vectorcall Python type per guard class,
// argument parsing, and the registry through which each guard class's source
// file adds its bindings to the module (guard_accel.cpp), so a source file
// added by a later patch needs no edit of an earlier one.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace dynapatch {

namespace py = pybind11;

// Sets the Python error for the C++ exception being handled. Called from a
// catch block only; never throws.
inline void set_python_error_from_current_exception() noexcept {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (...) {
    try {
      // c10::Error and std exceptions, as HANDLE_TH_ERRORS translates them.
      torch::translate_exception_to_python(std::current_exception());
    } catch (...) {
      PyErr_SetString(
          PyExc_RuntimeError,
          "torch._dynamo._guard_accel: unknown C++ exception");
    }
  }
}

// The body of every C-API entry point (tp_call/vectorcall, methods, tp_new):
// a C++ exception becomes a Python error and the function returns `retval`.
#define GUARD_ACCEL_TRY try {
#define GUARD_ACCEL_CATCH(retval)              \
  }                                            \
  catch (...) {                                \
    set_python_error_from_current_exception(); \
    return retval;                             \
  }

// torch/csrc/dynamo/guards.cpp's GuardDebugInfo: the result, the verbose code
// parts of the failed guard (or the one failure reason), and how many guards
// ran. Same members and constructors, so the guard classes port as they are.
struct GuardDebugInfo {
  GuardDebugInfo(
      bool result,
      py::list verbose_code_parts,
      int num_guards_executed)
      : result(result),
        verbose_code_parts(std::move(verbose_code_parts)),
        num_guards_executed(num_guards_executed) {}

  // This constructor is used when guard succeeds.
  GuardDebugInfo(bool result, int num_guards_executed)
      : result(result), num_guards_executed(num_guards_executed) {}

  GuardDebugInfo(
      bool result,
      const std::string& failed_reason,
      int num_guards_executed)
      : GuardDebugInfo(result, num_guards_executed) {
    // Reasons embed repr()s: decoded with "replace", never failing on bytes
    // that are not UTF-8 (in-tree: verbose_code_parts.append(failed_reason)).
    PyObject* reason = PyUnicode_DecodeUTF8(
        failed_reason.data(),
        static_cast<Py_ssize_t>(failed_reason.size()),
        "replace");
    if (reason == nullptr) {
      throw py::error_already_set();
    }
    verbose_code_parts.append(py::reinterpret_steal<py::object>(reason));
  }

  bool result;
  py::list verbose_code_parts;
  int num_guards_executed;
};

// torch/csrc/dynamo/guards.cpp's LeafGuard, without the RootGuardManager
// pointer (no guard here reads the root's local state) and without the
// FrameLocalsMapping overload. A guard owns its verbose code parts, which
// Python passes unchanged to GuardManager.add_lambda_guard: the LAMBDA_GUARD
// leaf holding the guard returns the same list. In-tree, each subclass derives
// from LeafGuard itself and is added by a GuardManager.add_*_guard binding;
// that is impossible from an extension, because libtorch_python exports none
// of torch::dynamo's guard classes.
class LeafGuard {
 public:
  explicit LeafGuard(py::object verbose_code_parts)
      : _verbose_code_parts(std::move(verbose_code_parts)) {}
  virtual ~LeafGuard() = default;

  bool check(py::handle value) {
    return check_nopybind(value.ptr());
  }

  GuardDebugInfo check_verbose(py::handle value) {
    return check_verbose_nopybind(value.ptr());
  }

  virtual GuardDebugInfo check_verbose_nopybind(PyObject* value) {
    bool result = check_nopybind(value);
    if (!result) {
      return GuardDebugInfo(result, _verbose_code_parts, 0);
    }
    return GuardDebugInfo(true, 0);
  }

  py::list verbose_code_parts() {
    return _verbose_code_parts;
  }

  // This is on the hot path and avoids any refcounting code from pybind. This
  // is not exposed to Python and can only be called from C++.
  virtual bool check_nopybind(PyObject* value) = 0;

 private:
  py::list _verbose_code_parts;
};

// A verbose_code_parts argument: a list, held as it is (not copied).
inline py::object verbose_code_parts_arg(py::handle v) {
  if (!PyList_Check(v.ptr())) {
    throw py::type_error("verbose_code_parts must be a list of str");
  }
  return py::reinterpret_borrow<py::object>(v);
}

// Interned at module init and never released: the module lives as long as the
// interpreter.
inline PyObject* intern(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (o == nullptr) {
    throw py::error_already_set();
  }
  return o;
}

// ---------------------------------------------------------------------------
// Python objects: each guard class is a static vectorcall type whose instances
// own one guard.

inline PyObject* one_arg(
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames,
    const char* what) {
  if (PyVectorcall_NARGS(nargsf) != 1 ||
      (kwnames != nullptr && PyTuple_GET_SIZE(kwnames))) {
    PyErr_Format(
        PyExc_TypeError, "%s takes exactly one positional argument", what);
    return nullptr;
  }
  return args[0];
}

// The Python results of a leaf guard: a bool for a check, True or the reason
// for explain().
inline PyObject* check_result(bool ok) {
  if (ok) {
    Py_RETURN_TRUE;
  }
  Py_RETURN_FALSE;
}

inline PyObject* explain_result(const GuardDebugInfo& info) {
  if (info.result) {
    Py_RETURN_TRUE;
  }
  // The first part is the reason (or the failed guard's first code part).
  if (info.verbose_code_parts.empty()) {
    return PyUnicode_FromString("check failed");
  }
  return py::object(info.verbose_code_parts[0]).release().ptr();
}

// The verbose_code_parts() method of a guard's Python object.
inline PyObject* code_parts_result(LeafGuard& guard) {
  return guard.verbose_code_parts().release().ptr();
}

inline PyObject* string_result(const std::string& s) {
  return PyUnicode_DecodeUTF8(
      s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
}

inline void ready_type(
    PyTypeObject& type,
    const char* name,
    size_t size,
    size_t vectorcall_offset,
    destructor dealloc,
    PyMethodDef* methods,
    const char* doc,
    newfunc tp_new = nullptr) {
  // What PyVarObject_HEAD_INIT(nullptr, 0) sets: one reference (the static
  // object itself, never released), no type yet (PyType_Ready sets it).
  Py_SET_REFCNT(reinterpret_cast<PyObject*>(&type), 1);
  type.tp_name = name;
  type.tp_new = tp_new;
  type.tp_basicsize = static_cast<Py_ssize_t>(size);
  type.tp_dealloc = dealloc;
  type.tp_vectorcall_offset = static_cast<Py_ssize_t>(vectorcall_offset);
  type.tp_call = PyVectorcall_Call;
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  type.tp_methods = methods;
  type.tp_doc = doc;
  if (PyType_Ready(&type) < 0) {
    throw py::error_already_set();
  }
}

// ---------------------------------------------------------------------------
// Construction (slow path, pybind11 for argument handling).

inline py::handle tuple_or_list(py::handle v, const char* what) {
  if (!PyList_Check(v.ptr()) && !PyTuple_Check(v.ptr())) {
    throw py::type_error(std::string(what) + " must be a list or tuple");
  }
  return v;
}

// An index or position: a non-negative int that fits in Py_ssize_t.
inline Py_ssize_t index_arg(py::handle v, const char* what) {
  if (!PyLong_Check(v.ptr())) {
    throw py::type_error(std::string(what) + " must be an int");
  }
  Py_ssize_t value = PyLong_AsSsize_t(v.ptr());
  if (value == -1 && PyErr_Occurred()) {
    throw py::error_already_set();
  }
  if (value < 0) {
    throw py::value_error(std::string(what) + " must not be negative");
  }
  return value;
}

// A str argument as UTF-8; a Python error (never an abort) if it cannot be
// encoded.
inline std::string utf8_arg(py::handle v, const char* what) {
  if (!PyUnicode_Check(v.ptr())) {
    throw py::type_error(std::string(what) + " must be a str");
  }
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(v.ptr(), &size);
  if (utf8 == nullptr) {
    throw py::error_already_set();
  }
  return std::string(utf8, static_cast<size_t>(size));
}

inline py::tuple tuple_arg(py::handle v, const char* what) {
  if (!PyTuple_Check(v.ptr())) {
    throw py::type_error(std::string(what) + " must be a tuple");
  }
  return py::reinterpret_borrow<py::tuple>(v);
}

inline bool bool_arg(py::handle v, const char* what) {
  if (!PyBool_Check(v.ptr())) {
    throw py::type_error(std::string(what) + " must be a bool");
  }
  return v.ptr() == Py_True;
}

// ---------------------------------------------------------------------------
// The module's parts: each guard class's source file registers the function
// that readies its types and adds its bindings (a static RegisterModuleInit).

using ModuleInit = void (*)(py::module_&);

std::vector<ModuleInit>& module_inits(); // guard_accel.cpp

struct RegisterModuleInit {
  explicit RegisterModuleInit(ModuleInit init) {
    module_inits().push_back(init);
  }
};

} // namespace dynapatch
