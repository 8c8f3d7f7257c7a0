// TensorContainerGuard: one native leaf guard for a list, tuple or dict of
// tensors (declaration; the checks are in tensor_container_guard.cpp, the
// Python type and its construction from Python in
// tensor_container_guard_bindings.cpp).
//
// In-tree (torch/csrc/dynamo/guards.cpp) this header's DispatchState is
// LocalState, the class derives from LeafGuard, and the bindings file becomes a
// py::class_ plus GuardManager.add_tensor_container_guard.
#pragma once

#include "tensor_aliasing_group.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace dynapatch {

// A size or stride entry that is not checked (a dynamic dimension).
constexpr int64_t kUnchecked = std::numeric_limits<int64_t>::min();

// The attributes DIMENSION_DYNAMIC_MARKING_GUARD looks at, in guards.py's
// order.
constexpr int kNumMarkAttrs = 5;
inline const char* const kMarkAttrNames[kNumMarkAttrs] = {
    "_dynamo_dynamic_indices",
    "_dynamo_weak_dynamic_indices",
    "_dynamo_unbacked_indices",
    "_dynamo_strict_unbacked_indices",
    "_dynamo_static_indices",
};
// Interned at module init (init_tensor_container_guard_state).
extern PyObject* g_mark_attr_names[kNumMarkAttrs];
extern PyObject* g_issubset_name;

// Whether a TorchDispatchMode with ignore_compile_internals=False is active:
// Dynamo's C++ guards read it from a thread local
// (get_is_in_mode_without_ignore_compile_internals() in
// torch/csrc/dynamo/guards.h), which libtorch_python does not export. Its only
// writer, torch.utils._python_dispatch, sets it from a module global that
// is_in_any_mode_without_ignore_compile_internals() returns, so we call that
// public function, and only when a Python dispatch key is involved.
extern PyObject* g_mode_flag_getter;

inline const c10::DispatchKeySet kPythonKeys({
    c10::DispatchKey::Python,
    c10::DispatchKey::PythonTLSSnapshot,
    c10::DispatchKey::PythonDispatcher,
});
bool should_mask_python_keys();

// LocalState::apply of torch/csrc/dynamo/guards.h, the dispatch key
// transformation TENSOR_MATCH checks with. LocalState itself cannot be used
// from outside libtorch_python: its inline constructor calls
// get_is_in_mode_without_ignore_compile_internals(), and neither that function
// nor the thread local behind it is exported (libtorch_python exports only
// TORCH_PYTHON_API symbols; in 2.13 and 2.15 none of torch::dynamo's guard
// code), so a module using it does not load. What is usable is used: the
// include/exclude sets come from c10's exported tls_local_dispatch_key_set(),
// the mode flag from the public Python getter above. Differences: the flag is
// read lazily (only for a tensor with a Python key), and it is the process-wide
// value where LocalState reads the thread's; with modes entered on another
// thread the recorded and checked key sets then differ, which fails the guard
// (a recompile), never passes it. An in-tree port drops this class and the
// getter: it checks with a LocalState constructed per check and, from 2.15 on,
// builds its records with the RootGuardManager's LocalState (the one
// set_local_state restores when guards are rebuilt from a saved package) as
// TENSOR_MATCH does; override_dispatch_key_set (set by guards outside this
// module) is not needed here.
class DispatchState {
 public:
  DispatchState() : tls_(c10::impl::tls_local_dispatch_key_set()) {}

  c10::DispatchKeySet apply(c10::DispatchKeySet ks) {
    c10::DispatchKeySet result = (ks | tls_.included_) - tls_.excluded_;
    if ((result & kPythonKeys).empty()) {
      return result; // masking would not change anything
    }
    if (mask_ < 0) {
      mask_ = should_mask_python_keys() ? 1 : 0;
    }
    return mask_ ? result - kPythonKeys : result;
  }

 private:
  c10::impl::LocalDispatchKeySet tls_;
  int mask_ = -1;
};
// Does the type (or its MRO) define one of the dimension-marking attributes, or
// customize attribute lookup so that hasattr() could find one?
bool type_may_have_mark_attrs(PyTypeObject* type);

inline unsigned int valid_version_tag(PyTypeObject* type) {
  return (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ? type->tp_version_tag
                                                         : 0;
}
// Whether obj is an exact set of exact ints (see tensor_container_guard.cpp).
bool is_set_of_ints(PyObject* obj);

// Interns the mark attribute names and looks up the dispatch-mode getter;
// called once at module init.
void init_tensor_container_guard_state();

enum class Field : uint8_t {
  kNone,
  kContainerType,
  kContainerLength,
  kKey,
  kMissing,
  kType,
  kDispatchKeys,
  kDtype,
  kDevice,
  kRequiresGrad,
  kRank,
  kSize,
  kStride,
  kDimMarking,
  kInnerType, // kDictNested: the dict holding the tensor changed type
  kInnerKeys, // kDictNested: the keys (or their order) of that dict changed
  kGradNone, // .grad is None, a tensor was expected
  kGradPresent, // .grad is a tensor, None was expected
  kIdentity, // an identity record's element is another object
};

// Where a check failed, for the recompile reason.
struct Mismatch {
  Field field = Field::kNone;
  Py_ssize_t record = -1; // index into records, or -1 for the container itself
  Py_ssize_t position = -1; // dict position for kKey
  int dim = -1; // size/stride dimension, or mark attribute index
  PyObject* value = nullptr; // borrowed: the element (or key) that failed
  bool in_grad =
      false; // the field is the element's .grad's (value is the element)
};

// Record::grad when the element's .grad is not checked, must be None, or must
// be a tensor without further checks; >= 0 indexes grad_records_.
constexpr int32_t kGradUnchecked = -1;
constexpr int32_t kGradMustBeNone = -2;
constexpr int32_t kGradMustBePresent = -3;

// Everything TENSOR_MATCH and the dimension-marking guard know about one
// tensor.
struct Record {
  py::object pytype; // the exact Python type
  PyTypeObject* type() const {
    return reinterpret_cast<PyTypeObject*>(pytype.ptr());
  }
  uint64_t dispatch_keys = 0; // LocalState-applied key set at build time
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::DeviceIndex device_index = -1;
  bool requires_grad = false;
  int32_t alias_slot = -1; // index into the aliasing participant, or -1
  int32_t rank = 0;
  uint32_t shape_offset =
      0; // sizes at [off, off+rank), strides at [off+rank, off+2*rank)
  int32_t marks =
      -1; // -1: every mark attribute must be absent; else index into marks_
  Py_ssize_t locator = 0; // list/tuple index or dict position
  py::object key; // the dict key (dict containers; kDictNested: the inner key),
                  // else null
  int32_t grad = kGradUnchecked; // kGrad* or an index into grad_records_
  // Non-zero: an identity record (what ID_MATCH checks): the element must be
  // the object at this address, of the recorded type; no metadata is checked.
  // The address is compared, never dereferenced, and the object is not kept
  // alive (Dynamo's id_ref invalidates the guard when it dies).
  uintptr_t identity = 0;
  // ma_version_tag of the instance __dict__ that last passed the marking check.
  // Dict versions are unique process-wide (a new or modified dict gets a new
  // one), so an equal version means the same, unmodified __dict__.
  mutable uint64_t passed_dict_version = 0;
};

// Per mark attribute: nullptr means the attribute must be absent; otherwise a
// present attribute must be a subset of this object (guards.py's issubset
// check).
struct MarkExpectation {
  py::object subset_of[kNumMarkAttrs];
};

enum class Kind : int { kList, kTuple, kDictLookup, kDictOrdered, kDictNested };

class TensorContainerGuard final : public LeafGuard {
 public:
  explicit TensorContainerGuard(py::object verbose_code_parts)
      : LeafGuard(std::move(verbose_code_parts)) {}

  // Hot path: true iff every record matches.
  bool check_nopybind(PyObject* container) override;
  // Slow path: whether it matches and, if not, the first mismatch named.
  GuardDebugInfo check_verbose_nopybind(PyObject* container) override;
  // The first mismatch (field kNone if none).
  Mismatch find_mismatch(PyObject* container);
  std::string describe(const Mismatch& m);
  std::string describe_fields(const Record& r, const Mismatch& m);

  Kind kind_ = Kind::kList;
  std::string container_name_;
  py::object dict_type_; // kDictOrdered: the exact dict type (a dict subclass)
  Py_ssize_t dict_size_ = 0; // kDictOrdered
  std::vector<py::object> ordered_keys_; // kDictOrdered: every key, in order
  std::vector<Record> records_; // sorted by locator
  // kDictNested: the type of every dict holding a recorded tensor.
  py::object inner_type_;
  PyTypeObject* dict_type() const {
    return reinterpret_cast<PyTypeObject*>(dict_type_.ptr());
  }
  PyTypeObject* inner_type() const {
    return reinterpret_cast<PyTypeObject*>(inner_type_.ptr());
  }
  // kDictNested: the keys, in order, of the inner dicts whose keys are checked
  // (exact str). Per record: inner_keys_of_, an index into inner_keys_ for
  // the first record of such a dict's position, else -1; inner_key_index_, the
  // index of the record's key in those keys. Empty when no keys are checked.
  std::vector<std::vector<py::object>> inner_keys_;
  std::vector<int32_t> inner_keys_of_;
  std::vector<int32_t> inner_key_index_;
  std::vector<PyObject*> inner_values_; // scratch: borrowed, one check
  bool read_inner_dict(PyObject* dict, const std::vector<py::object>& keys);
  // The .grad of elements (Record::grad >= 0); locator and key unused, grad
  // unchecked. Reasons name a grad after its element (names_[i] + ".grad").
  std::vector<Record> grad_records_;
  std::vector<int64_t> shape_;
  std::vector<MarkExpectation> marks_;
  std::vector<std::string> names_; // per record, e.g. L['xs'][3]
  std::vector<PyTypeObject*>
      tensor_types_; // distinct record types (owned by records_)
  std::vector<unsigned int> type_versions_; // version tag at last verification
  py::object group_object_; // the TensorAliasingGroup object owning group_
  TensorAliasingGroup* group_ = nullptr;
  int participant_ = -1;
  std::vector<PyObject*> elements_; // scratch: borrowed, valid during one check

 private:
  template <bool kVerbose>
  bool run(PyObject* container, Mismatch* out);
  template <bool kVerbose>
  bool check_record(
      const Record& r,
      PyObject* obj,
      DispatchState& ds,
      TensorAliasingGroup::Participant* aliasing,
      Mismatch* out);
  template <bool kVerbose>
  bool check_grad(
      const Record& r,
      PyObject* obj,
      DispatchState& ds,
      TensorAliasingGroup::Participant* aliasing,
      Mismatch* out);
  bool check_types(Mismatch* out);
  void prefetch_ahead(PyObject* const* elements, Py_ssize_t i) const;
  template <bool kVerbose>
  bool gather(PyObject* container, Mismatch* out);
  bool marks_match(const Record& r, PyObject* obj, int* attr_out);
  bool mark_matches(const Record& r, int a, PyObject* present);
  bool scan_marks(const Record& r, PyObject* dict, int* attr_out);
};

} // namespace dynapatch
