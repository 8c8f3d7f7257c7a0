// TensorContainerGuard: one native leaf guard for a list, tuple or dict of tensors.
//
// Stock Dynamo checks every tensor of a container through its own guard node: an
// accessor, TENSOR_MATCH, DIMENSION_DYNAMIC_MARKING_GUARD and a share of the
// relational NO_TENSOR_ALIASING guard. This guard keeps the same per-tensor facts
// as flat records and checks a whole container in one loop with early exit. It is
// a plain Python callable (vectorcall), installed with GuardManager.add_lambda_guard
// on the container's node by torch/_dynamo/guard_accel.py.
//
// What a record checks is what TENSOR_MATCH checks (torch/csrc/dynamo/guards.cpp,
// TensorCheck): exact Python type, the dispatch key set after the thread-local
// include/exclude sets (and Python-key masking) are applied, dtype, device index,
// requires_grad, rank, and every size and stride that is not dynamic. It also
// checks the dimension-marking attributes (_dynamo_dynamic_indices & co) the way
// DIMENSION_DYNAMIC_MARKING_GUARD does. Aliasing is collected into a
// TensorAliasingGroup and decided once per check by its epilogue guard.
#include "tensor_container_guard.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/flat_hash_map.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace py = pybind11;

namespace dynapatch {
namespace {

// A size or stride entry that is not checked (a dynamic dimension).
constexpr int64_t kUnchecked = std::numeric_limits<int64_t>::min();

// The attributes DIMENSION_DYNAMIC_MARKING_GUARD looks at, in guards.py's order.
constexpr int kNumMarkAttrs = 5;
const char* const kMarkAttrNames[kNumMarkAttrs] = {
    "_dynamo_dynamic_indices",
    "_dynamo_weak_dynamic_indices",
    "_dynamo_unbacked_indices",
    "_dynamo_strict_unbacked_indices",
    "_dynamo_static_indices",
};
PyObject* g_mark_attr_names[kNumMarkAttrs] = {};
PyObject* g_issubset_name = nullptr;

// torch.utils._python_dispatch keeps, in a module global, the flag that Dynamo's
// C++ guards keep in a thread local (set_is_in_mode_without_ignore_compile_internals
// is called with that global). The thread local is not exported, so we read the
// global, and only when a Python dispatch key is involved.
PyObject* g_python_dispatch_dict = nullptr;
PyObject* g_mode_flag_name = nullptr;

const c10::DispatchKeySet kPythonKeys({
    c10::DispatchKey::Python,
    c10::DispatchKey::PythonTLSSnapshot,
    c10::DispatchKey::PythonDispatcher,
});

bool should_mask_python_keys() {
  if (g_python_dispatch_dict == nullptr) {
    return true;
  }
  PyObject* flag = PyDict_GetItemWithError(g_python_dispatch_dict, g_mode_flag_name);
  if (flag == nullptr) {
    PyErr_Clear();
    return true;
  }
  return flag != Py_True;
}

// The dispatch key transformation of Dynamo's LocalState, from the current TLS.
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
bool type_may_have_mark_attrs(PyTypeObject* type) {
  if (type->tp_getattro != PyObject_GenericGetAttr) {
    return true;
  }
  for (PyObject* name : g_mark_attr_names) {
    if (_PyType_Lookup(type, name) != nullptr) {
      return true;
    }
  }
  return false;
}

unsigned int valid_version_tag(PyTypeObject* type) {
  return (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ? type->tp_version_tag : 0;
}

// A concrete size or stride equal to `expected`. Symbolic values (only seen under
// fake/functional modes, never for real inputs) do not match; this stays in line
// (SymInt::maybe_as_int is not inlined and dominated the loop).
C10_ALWAYS_INLINE bool symint_equals(const c10::SymInt& v, int64_t expected) {
  return !v.is_heap_allocated() && v.as_int_unchecked() == expected;
}

// 0 when the interpreter has no dict versions to offer (3.12 deprecates them).
uint64_t dict_version(PyObject* dict) {
#if PY_VERSION_HEX < 0x030C0000
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#else
  return 0;
#endif
}

// The instance __dict__ of a tensor, or nullptr when it has no instance attributes.
PyObject* instance_dict(PyObject* obj) {
  PyObject** dict_ptr = _PyObject_GetDictPtr(obj);
  if (dict_ptr == nullptr || *dict_ptr == nullptr || PyDict_GET_SIZE(*dict_ptr) == 0) {
    return nullptr;
  }
  return *dict_ptr;
}

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
};

// Where a check failed, for the recompile reason.
struct Mismatch {
  Field field = Field::kNone;
  Py_ssize_t record = -1; // index into records, or -1 for the container itself
  Py_ssize_t position = -1; // dict position for kKey
  int dim = -1; // size/stride dimension, or mark attribute index
  PyObject* value = nullptr; // borrowed: the element (or key) that failed
  bool in_grad = false; // the field is the element's .grad's (value is the element)
};

// Record::grad when the element's .grad is not checked, must be None, or must be
// a tensor without further checks; >= 0 indexes grad_records_.
constexpr int32_t kGradUnchecked = -1;
constexpr int32_t kGradMustBeNone = -2;
constexpr int32_t kGradMustBePresent = -3;

// Everything TENSOR_MATCH and the dimension-marking guard know about one tensor.
struct Record {
  PyTypeObject* pytype; // strong
  uint64_t dispatch_keys; // LocalState-applied key set at build time
  c10::ScalarType dtype;
  c10::DeviceIndex device_index;
  bool requires_grad;
  int32_t alias_slot; // index into the aliasing participant, or -1
  int32_t rank;
  uint32_t shape_offset; // sizes at [off, off+rank), strides at [off+rank, off+2*rank)
  int32_t marks; // -1: every mark attribute must be absent; else index into marks_
  Py_ssize_t locator; // list/tuple index or dict position
  PyObject* key; // strong; the dict key (dict containers; kDictNested: the inner key)
  int32_t grad; // kGrad* or an index into grad_records_
  // ma_version_tag of the instance __dict__ that last passed the marking check.
  // Dict versions are unique process-wide (a new or modified dict gets a new
  // one), so an equal version means the same, unmodified __dict__.
  mutable uint64_t passed_dict_version;
};

// Per mark attribute: nullptr means the attribute must be absent; otherwise a
// present attribute must be a subset of this object (guards.py's issubset check).
struct MarkExpectation {
  PyObject* subset_of[kNumMarkAttrs];
};

enum class Kind : int { kList, kTuple, kDictLookup, kDictOrdered, kDictNested };

// ---------------------------------------------------------------------------
// TensorAliasingGroup: the no-aliasing guard for every tensor of a frame.
//
// Participants (container guards and single tensors) record the identities of
// the tensors they checked; the group's epilogue guard, which Dynamo runs after
// every other guard passed, decides. A participant that records an identity
// different from the one it holds marks itself dirty. Invariant: a participant
// that is not dirty holds exactly the identities of the last check that found
// all of them pairwise distinct. So when no participant is dirty the epilogue
// passes without looking at a single pointer; otherwise all identities go
// through a hash set, and on success the dirty marks are cleared. Identities are
// compared as raw pointers only, never dereferenced: no tensor is kept alive.
class TensorAliasingGroup {
 public:
  struct Participant {
    std::vector<PyObject*> current;
    std::vector<std::string> names;
    bool dirty = true;
  };

  int add_participant(std::vector<std::string> names) {
    Participant p;
    p.current.assign(names.size(), nullptr);
    p.names = std::move(names);
    participants_.push_back(std::move(p));
    return static_cast<int>(participants_.size()) - 1;
  }

  Participant& participant(int index) {
    return participants_[index];
  }

  bool check() {
    bool dirty = false;
    for (const auto& p : participants_) {
      dirty |= p.dirty;
    }
    if (!dirty) {
      return true;
    }
    seen_.clear();
    for (const auto& p : participants_) {
      for (PyObject* obj : p.current) {
        if (!seen_.insert(obj).second) {
          return false;
        }
      }
    }
    for (auto& p : participants_) {
      p.dirty = false;
    }
    return true;
  }

  // The names of two entries recorded by the last check that are the same
  // tensor, or an empty string.
  std::string describe_duplicate() const {
    ska::flat_hash_map<PyObject*, const std::string*> first;
    for (const auto& p : participants_) {
      for (size_t i = 0; i < p.current.size(); i++) {
        auto inserted = first.insert({p.current[i], &p.names[i]});
        if (!inserted.second) {
          return *inserted.first->second + " and " + p.names[i] +
              " are the same tensor, but the graph was compiled for distinct tensors";
        }
      }
    }
    return "";
  }

  size_t num_tensors() const {
    size_t n = 0;
    for (const auto& p : participants_) {
      n += p.current.size();
    }
    return n;
  }

 private:
  std::vector<Participant> participants_;
  ska::flat_hash_set<PyObject*> seen_;
};

// Records one identity for a participant (see TensorAliasingGroup).
C10_ALWAYS_INLINE void record_identity(
    TensorAliasingGroup::Participant& p,
    int32_t slot,
    PyObject* obj) {
  PyObject*& held = p.current[slot];
  if (held != obj) {
    held = obj;
    p.dirty = true;
  }
}

class TensorContainerGuard {
 public:
  ~TensorContainerGuard();

  // Hot path: true iff every record matches.
  bool check(PyObject* container);
  // Slow path: the first mismatch (field kNone if none).
  Mismatch find_mismatch(PyObject* container);
  std::string describe(const Mismatch& m);
  std::string describe_fields(const Record& r, const Mismatch& m);

  Kind kind_ = Kind::kList;
  std::string container_name_;
  PyTypeObject* dict_type_ = nullptr; // strong; kDictOrdered
  Py_ssize_t dict_size_ = 0; // kDictOrdered
  std::vector<PyObject*> ordered_keys_; // strong; kDictOrdered: every key, in order
  std::vector<Record> records_; // sorted by locator
  // kDictNested: the type of every dict holding a recorded tensor (strong).
  PyTypeObject* inner_type_ = nullptr;
  // kDictNested: the keys, in order, of the inner dicts whose keys are checked
  // (exact str, strong). Per record: inner_keys_of_, an index into inner_keys_ for
  // the first record of such a dict's position, else -1; inner_key_index_, the
  // index of the record's key in those keys. Empty when no keys are checked.
  std::vector<std::vector<PyObject*>> inner_keys_;
  std::vector<int32_t> inner_keys_of_;
  std::vector<int32_t> inner_key_index_;
  std::vector<PyObject*> inner_values_; // scratch: borrowed, one check
  bool read_inner_dict(PyObject* dict, const std::vector<PyObject*>& keys);
  // The .grad of elements (Record::grad >= 0); locator and key unused, grad unchecked.
  std::vector<Record> grad_records_;
  std::vector<std::string> grad_names_;
  std::vector<int64_t> shape_;
  std::vector<MarkExpectation> marks_; // strong refs inside
  std::vector<std::string> names_; // per record, e.g. L['xs'][3]
  std::vector<PyTypeObject*> tensor_types_; // distinct record types (borrowed)
  std::vector<unsigned int> type_versions_; // version tag at last verification
  PyObject* group_object_ = nullptr; // strong; TensorAliasingGroup object
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

TensorContainerGuard::~TensorContainerGuard() {
  for (Record& r : records_) {
    Py_XDECREF(r.pytype);
    Py_XDECREF(r.key);
  }
  for (Record& r : grad_records_) {
    Py_XDECREF(r.pytype);
  }
  Py_XDECREF(inner_type_);
  for (std::vector<PyObject*>& keys : inner_keys_) {
    for (PyObject* k : keys) {
      Py_XDECREF(k);
    }
  }
  for (MarkExpectation& m : marks_) {
    for (PyObject* o : m.subset_of) {
      Py_XDECREF(o);
    }
  }
  for (PyObject* k : ordered_keys_) {
    Py_XDECREF(k);
  }
  Py_XDECREF(dict_type_);
  Py_XDECREF(group_object_);
}

// The dimension-marking attributes can only come from the instance __dict__ as
// long as the tensor types do not define them; verify that once per type
// version, not per tensor.
bool TensorContainerGuard::check_types(Mismatch* out) {
  for (size_t i = 0; i < tensor_types_.size(); i++) {
    PyTypeObject* type = tensor_types_[i];
    unsigned int version = valid_version_tag(type);
    if (version != 0 && version == type_versions_[i]) {
      continue;
    }
    if (type_may_have_mark_attrs(type)) {
      if (out != nullptr) {
        out->field = Field::kDimMarking;
        out->value = reinterpret_cast<PyObject*>(type);
      }
      return false;
    }
    type_versions_[i] = valid_version_tag(type);
  }
  return true;
}

// Which dimension-marking attribute a key of an instance __dict__ is: an index,
// -1 for none, -2 when only a real dict lookup can tell (not an exact str).
int mark_attr_index(PyObject* key) {
  for (int a = 0; a < kNumMarkAttrs; a++) {
    if (key == g_mark_attr_names[a]) {
      return a;
    }
  }
  if (!PyUnicode_CheckExact(key)) {
    return -2;
  }
  if (PyUnicode_CHECK_INTERNED(key)) {
    return -1; // the names are interned: an equal interned string is the same object
  }
  for (int a = 0; a < kNumMarkAttrs; a++) {
    if (PyUnicode_Compare(key, g_mark_attr_names[a]) == 0) {
      return a;
    }
  }
  PyErr_Clear();
  return -1;
}

// Dynamo's marking APIs store sets of ints. For those, issubset runs no Python
// code; for anything else it could, in the middle of a check over borrowed
// references, so such a value does not match (a recompile, never a wrong accept).
bool is_set_of_ints(PyObject* obj) {
  if (!PyAnySet_CheckExact(obj)) {
    return false;
  }
  PyObject* it = PyObject_GetIter(obj);
  if (it == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool ints = true;
  while (PyObject* item = PyIter_Next(it)) {
    ints &= PyLong_CheckExact(item);
    Py_DECREF(item);
  }
  Py_DECREF(it);
  PyErr_Clear();
  return ints;
}

bool TensorContainerGuard::mark_matches(const Record& r, int a, PyObject* present) {
  PyObject* expected = r.marks < 0 ? nullptr : marks_[r.marks].subset_of[a];
  if (expected == nullptr) {
    return false; // compiled without the attribute: a new marking recompiles
  }
  if (!is_set_of_ints(present)) {
    return false;
  }
  PyObject* ok = PyObject_CallMethodOneArg(present, g_issubset_name, expected);
  if (ok == nullptr) {
    PyErr_Clear();
    return false;
  }
  int truth = PyObject_IsTrue(ok);
  Py_DECREF(ok);
  PyErr_Clear();
  return truth == 1;
}

// DIMENSION_DYNAMIC_MARKING_GUARD: an attribute that was absent at compile time
// must still be absent; one that was present must be absent or a subset of the
// compiled one. Tensors usually have no instance attributes at all; Dynamo gives
// parameters one (_dynamo_static_input_type), so the __dict__ is scanned once
// instead of being probed for each of the five names.
bool TensorContainerGuard::marks_match(const Record& r, PyObject* obj, int* attr_out) {
  PyObject* dict = instance_dict(obj);
  if (dict == nullptr) {
    return true; // absent is always accepted
  }
  const uint64_t version = dict_version(dict);
  if (version != 0 && version == r.passed_dict_version) {
    return true;
  }
  if (!scan_marks(r, dict, attr_out)) {
    return false;
  }
  r.passed_dict_version = version;
  return true;
}

bool TensorContainerGuard::scan_marks(const Record& r, PyObject* dict, int* attr_out) {
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  bool needs_lookups = false;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    int a = mark_attr_index(key);
    if (a == -2) {
      needs_lookups = true;
    } else if (a >= 0 && !mark_matches(r, a, value)) {
      *attr_out = a;
      return false;
    }
  }
  if (!needs_lookups) {
    return true;
  }
  for (int a = 0; a < kNumMarkAttrs; a++) {
    PyObject* present = PyDict_GetItemWithError(dict, g_mark_attr_names[a]);
    if (present == nullptr && PyErr_Occurred()) {
      PyErr_Clear();
      *attr_out = a;
      return false;
    }
    if (present != nullptr && !mark_matches(r, a, present)) {
      *attr_out = a;
      return false;
    }
  }
  return true;
}

template <bool kVerbose>
__attribute__((flatten)) bool TensorContainerGuard::check_record(
    const Record& r,
    PyObject* obj,
    DispatchState& ds,
    TensorAliasingGroup::Participant* aliasing,
    Mismatch* out) {
  auto fail = [&](Field f, int dim = -1) {
    if constexpr (kVerbose) {
      out->field = f;
      out->dim = dim;
      out->value = obj;
    }
    return false;
  };
  if (Py_TYPE(obj) != r.pytype) {
    return fail(Field::kType);
  }
  c10::TensorImpl* impl = THPVariable_Unpack(obj).unsafeGetTensorImpl();
  if (ds.apply(impl->key_set()).raw_repr() != r.dispatch_keys) {
    return fail(Field::kDispatchKeys);
  }
  if (impl->dtype().toScalarType() != r.dtype) {
    return fail(Field::kDtype);
  }
  if (impl->device().index() != r.device_index) {
    return fail(Field::kDevice);
  }
  if (impl->requires_grad() != r.requires_grad) {
    return fail(Field::kRequiresGrad);
  }
  // The dispatch keys matched a dense strided tensor's, so sizes and strides
  // exist; guard against surprises (a throwing custom sizes policy) anyway.
  try {
    c10::SymIntArrayRef sizes = impl->sym_sizes();
    if (static_cast<int64_t>(sizes.size()) != r.rank) {
      return fail(Field::kRank);
    }
    const int64_t* expected = shape_.data() + r.shape_offset;
    for (int32_t d = 0; d < r.rank; d++) {
      if (expected[d] != kUnchecked && !symint_equals(sizes[d], expected[d])) {
        return fail(Field::kSize, d);
      }
    }
    c10::SymIntArrayRef strides = impl->sym_strides();
    expected += r.rank;
    for (int32_t d = 0; d < r.rank; d++) {
      if (expected[d] != kUnchecked && !symint_equals(strides[d], expected[d])) {
        return fail(Field::kStride, d);
      }
    }
  } catch (const std::exception&) {
    return fail(Field::kRank);
  }
  int attr = -1;
  if (!marks_match(r, obj, &attr)) {
    return fail(Field::kDimMarking, attr);
  }
  if (r.alias_slot >= 0) {
    record_identity(*aliasing, r.alias_slot, obj);
  }
  if (r.grad != kGradUnchecked) {
    return check_grad<kVerbose>(r, obj, ds, aliasing, out);
  }
  return true;
}

// What GradGuardAccessor + NONE_MATCH / NOT_NONE_MATCH + TENSOR_MATCH check about
// an element's .grad. The grad's Python object is the one `tensor.grad` returns
// (THPVariable_Wrap of the C++ grad; PyObject preservation keeps it while the
// grad lives), so the aliasing identity matches the stock guard's.
template <bool kVerbose>
bool TensorContainerGuard::check_grad(
    const Record& r,
    PyObject* obj,
    DispatchState& ds,
    TensorAliasingGroup::Participant* aliasing,
    Mismatch* out) {
  auto fail = [&](Field f) {
    if constexpr (kVerbose) {
      out->field = f;
      out->dim = -1;
      out->value = obj;
      out->in_grad = true;
    }
    return false;
  };
  const at::Tensor& grad = THPVariable_Unpack(obj).unsafeGetTensorImpl()->grad();
  if (!grad.defined()) {
    return r.grad == kGradMustBeNone || fail(Field::kGradNone);
  }
  if (r.grad == kGradMustBeNone) {
    return fail(Field::kGradPresent);
  }
  if (r.grad == kGradMustBePresent) {
    return true;
  }
  // The grad's Python object, as `tensor.grad` returns it: the one its
  // TensorImpl already has (alive while the grad is), else a new one.
  PyObject* grad_obj = grad.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
  if (grad_obj != nullptr) {
    Py_INCREF(grad_obj);
  } else {
    grad_obj = THPVariable_Wrap(grad);
    if (grad_obj == nullptr) {
      PyErr_Clear();
      return fail(Field::kGradNone);
    }
  }
  const Record& g = grad_records_[r.grad];
  bool ok = check_record<kVerbose>(g, grad_obj, ds, aliasing, out);
  Py_DECREF(grad_obj); // the grad keeps its Python object alive (preservation)
  if (!ok) {
    if constexpr (kVerbose) {
      out->in_grad = true;
      out->value = obj;
    }
  }
  return ok;
}

// The loop is bound by loads from objects scattered over the heap: the Python
// object, its TensorImpl, the instance __dict__ if it has one (parameters do:
// Dynamo marks them) and, for tensors that require grad, the AutogradMeta.
// Prefetch them in three stages, each from pointers an earlier stage brought in.
// elements[i] is the object to check against records_[i].
void TensorContainerGuard::prefetch_ahead(PyObject* const* elements, Py_ssize_t i)
    const {
  constexpr Py_ssize_t kObjectAhead = 16;
  constexpr Py_ssize_t kImplAhead = 8;
  constexpr Py_ssize_t kIndirectAhead = 4;
  constexpr Py_ssize_t kIndirectMinRecords = 2048;
  const Py_ssize_t n = static_cast<Py_ssize_t>(records_.size());
  if (i + kObjectAhead < n) {
    const char* obj = reinterpret_cast<const char*>(elements[i + kObjectAhead]);
    __builtin_prefetch(obj);
    __builtin_prefetch(obj - 32); // GC header and the managed __dict__ pointer
  }
  if (i + kImplAhead < n) {
    PyObject* obj = elements[i + kImplAhead];
    if (Py_TYPE(obj) == records_[i + kImplAhead].pytype) {
      const char* impl =
          reinterpret_cast<const char*>(THPVariable_Unpack(obj).unsafeGetTensorImpl());
      for (int line = 0; line < 4; line++) {
        __builtin_prefetch(impl + 64 * line);
      }
    }
  }
  // Two calls per element: worth it only once the container's data no longer
  // stays in the core's cache between checks.
  if (n >= kIndirectMinRecords && i + kIndirectAhead < n) {
    PyObject* obj = elements[i + kIndirectAhead];
    const Record& r = records_[i + kIndirectAhead];
    if (Py_TYPE(obj) == r.pytype) {
      PyObject** dict_ptr = _PyObject_GetDictPtr(obj);
      if (dict_ptr != nullptr && *dict_ptr != nullptr) {
        __builtin_prefetch(*dict_ptr);
      }
      if (r.requires_grad) {
        const char* meta = reinterpret_cast<const char*>(
            THPVariable_Unpack(obj).unsafeGetTensorImpl()->autograd_meta());
        if (meta != nullptr) {
          __builtin_prefetch(meta);
          __builtin_prefetch(meta + 64);
        }
      }
    }
  }
}

// Collects into elements_ the object each record is checked against. Reads only
// the container (and dict keys), never an element, so it is cheap and lets the
// check loop prefetch. No Python code runs during a check, so these borrowed
// references stay valid.
// True iff the keys of the exact dict are `keys`, in order; its values go to
// inner_values_ (one walk, no lookups). Both sides are exact str, so comparing
// them runs no Python code.
bool TensorContainerGuard::read_inner_dict(PyObject* dict, const std::vector<PyObject*>& keys) {
  if (PyDict_GET_SIZE(dict) != static_cast<Py_ssize_t>(keys.size())) {
    return false;
  }
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  for (size_t k = 0; PyDict_Next(dict, &pos, &key, &value); k++) {
    if (key != keys[k] &&
        !(PyUnicode_CheckExact(key) && PyUnicode_Compare(key, keys[k]) == 0)) {
      return false;
    }
    inner_values_[k] = value;
  }
  return true;
}

template <bool kVerbose>
bool TensorContainerGuard::gather(PyObject* container, Mismatch* out) {
  auto fail = [&](Field f, Py_ssize_t record = -1) {
    if constexpr (kVerbose) {
      out->field = f;
      out->record = record;
      out->value = container;
    }
    return false;
  };
  const Py_ssize_t n = static_cast<Py_ssize_t>(records_.size());
  elements_.resize(n);
  switch (kind_) {
    case Kind::kList:
    case Kind::kTuple: {
      PyObject** items = nullptr;
      Py_ssize_t size = 0;
      if (kind_ == Kind::kList) {
        if (!PyList_Check(container)) {
          return fail(Field::kContainerType);
        }
        items = reinterpret_cast<PyListObject*>(container)->ob_item;
        size = PyList_GET_SIZE(container);
      } else {
        if (!PyTuple_Check(container)) {
          return fail(Field::kContainerType);
        }
        items = reinterpret_cast<PyTupleObject*>(container)->ob_item;
        size = PyTuple_GET_SIZE(container);
      }
      for (Py_ssize_t i = 0; i < n; i++) {
        if (records_[i].locator >= size) {
          return fail(Field::kMissing, i);
        }
        elements_[i] = items[records_[i].locator];
      }
      return true;
    }
    case Kind::kDictLookup: {
      // Same answer as one PyDict lookup per key (DictGetItemGuardAccessor);
      // walking the entries in order and comparing key pointers is the fast path.
      if (!PyDict_Check(container)) {
        return fail(Field::kContainerType);
      }
      Py_ssize_t pos = 0;
      Py_ssize_t position = 0;
      Py_ssize_t i = 0;
      PyObject* key = nullptr;
      PyObject* value = nullptr;
      while (i < n && PyDict_Next(container, &pos, &key, &value)) {
        const Record& r = records_[i];
        if (r.locator == position) {
          elements_[i] = key == r.key ? value : PyDict_GetItemWithError(container, r.key);
          if (elements_[i] == nullptr) {
            PyErr_Clear();
            return fail(Field::kMissing, i);
          }
          i++;
        }
        position++;
      }
      for (; i < n; i++) { // the dict got shorter: plain lookups
        elements_[i] = PyDict_GetItemWithError(container, records_[i].key);
        if (elements_[i] == nullptr) {
          PyErr_Clear();
          return fail(Field::kMissing, i);
        }
      }
      return true;
    }
    case Kind::kDictOrdered: {
      // What DictGuardManager + a key manager per key check: exact type, size,
      // and the key at every position (EQUALS_MATCH).
      if (Py_TYPE(container) != dict_type_) {
        return fail(Field::kContainerType);
      }
      if (PyDict_GET_SIZE(container) != dict_size_) {
        return fail(Field::kContainerLength);
      }
      Py_ssize_t pos = 0;
      Py_ssize_t position = 0;
      Py_ssize_t i = 0;
      PyObject* key = nullptr;
      PyObject* value = nullptr;
      while (PyDict_Next(container, &pos, &key, &value)) {
        PyObject* expected_key = ordered_keys_[position];
        if (key != expected_key) {
          // Keys are exact int or str, so no Python code runs.
          bool equal = Py_TYPE(key) == Py_TYPE(expected_key) &&
              PyObject_RichCompareBool(key, expected_key, Py_EQ) == 1;
          if (!equal) {
            PyErr_Clear();
            if constexpr (kVerbose) {
              out->field = Field::kKey;
              out->position = position;
              out->value = key;
            }
            return false;
          }
        }
        if (i < n && records_[i].locator == position) {
          elements_[i++] = value;
        }
        position++;
      }
      return true;
    }
    case Kind::kDictNested: {
      // The outer dict is walked in order (its DictGuardManager guards the key
      // order, its length and, through other guards, the keys); each recorded
      // tensor is looked up by its exact str key in the dict at its position,
      // as DictGetItemGuardAccessor does. No Python code runs.
      if (!PyDict_Check(container)) {
        return fail(Field::kContainerType);
      }
      // Two passes: the inner dicts in order (a sequential walk of the outer
      // dict's entries), then the lookups, prefetching the inner dicts and
      // their key tables a few records ahead (they are scattered over the heap).
      Py_ssize_t pos = 0;
      Py_ssize_t position = 0;
      Py_ssize_t i = 0;
      PyObject* key = nullptr;
      PyObject* inner = nullptr;
      while (i < n && PyDict_Next(container, &pos, &key, &inner)) {
        for (; i < n && records_[i].locator == position; i++) {
          elements_[i] = inner; // replaced by the tensor below
        }
        position++;
      }
      if (i < n) {
        return fail(Field::kMissing, i);
      }
      constexpr Py_ssize_t kDictAhead = 8;
      constexpr Py_ssize_t kKeysAhead = 4;
      for (i = 0; i < n; i++) {
        if (i + kDictAhead < n) {
          __builtin_prefetch(elements_[i + kDictAhead]);
        }
        if (i + kKeysAhead < n && Py_TYPE(elements_[i + kKeysAhead]) == inner_type_) {
          __builtin_prefetch(
              reinterpret_cast<PyDictObject*>(elements_[i + kKeysAhead])->ma_keys);
        }
        inner = elements_[i];
        if (Py_TYPE(inner) != inner_type_) {
          if constexpr (kVerbose) {
            out->field = Field::kInnerType;
            out->record = i;
            out->value = inner;
          }
          return false;
        }
        if (!inner_keys_of_.empty() && inner_keys_of_[i] >= 0) {
          // The first record of a dict whose keys are checked: take the tensors
          // of all its records from that walk.
          if (!read_inner_dict(inner, inner_keys_[inner_keys_of_[i]])) {
            if constexpr (kVerbose) {
              out->field = Field::kInnerKeys;
              out->record = i;
              out->value = inner;
            }
            return false;
          }
          const Py_ssize_t locator = records_[i].locator;
          for (; i < n && records_[i].locator == locator; i++) {
            elements_[i] = inner_values_[inner_key_index_[i]];
          }
          i--; // the loop's increment
          continue;
        }
        elements_[i] = PyDict_GetItemWithError(inner, records_[i].key);
        if (elements_[i] == nullptr) {
          PyErr_Clear();
          return fail(Field::kMissing, i);
        }
      }
      return true;
    }
  }
  return false;
}

template <bool kVerbose>
bool TensorContainerGuard::run(PyObject* container, Mismatch* out) {
  if (!check_types(kVerbose ? out : nullptr)) {
    return false;
  }
  if (!gather<kVerbose>(container, out)) {
    return false;
  }
  DispatchState ds;
  TensorAliasingGroup::Participant* alias =
      group_ != nullptr ? &group_->participant(participant_) : nullptr;
  PyObject* const* elements = elements_.data();
  const Py_ssize_t n = static_cast<Py_ssize_t>(records_.size());
  // Checking a grad's metadata may create its Python object (THPVariable_Wrap),
  // and an allocation may run the garbage collector and so finalizers, which
  // could mutate the container. Then the elements are held, in a vector of
  // this call's own (a nested check of this guard may reuse elements_).
  struct Held {
    std::vector<PyObject*> objs;
    ~Held() {
      for (PyObject* o : objs) {
        Py_DECREF(o);
      }
    }
  } held;
  if (!grad_records_.empty()) {
    held.objs.assign(elements_.begin(), elements_.begin() + n);
    for (PyObject* o : held.objs) {
      Py_INCREF(o);
    }
    elements = held.objs.data();
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    prefetch_ahead(elements, i);
    if (!check_record<kVerbose>(records_[i], elements[i], ds, alias, out)) {
      if constexpr (kVerbose) {
        out->record = i;
      }
      return false;
    }
  }
  return true;
}

bool TensorContainerGuard::check(PyObject* container) {
  return run<false>(container, nullptr);
}

Mismatch TensorContainerGuard::find_mismatch(PyObject* container) {
  Mismatch m;
  if (run<true>(container, &m)) {
    m.field = Field::kNone;
  }
  return m;
}

std::string py_repr(PyObject* obj) {
  if (obj == nullptr) {
    return "<null>";
  }
  PyObject* r = PyObject_Repr(obj);
  if (r == nullptr) {
    PyErr_Clear();
    return "<unprintable>";
  }
  const char* s = PyUnicode_AsUTF8(r);
  std::string out = s != nullptr ? s : "<unprintable>";
  Py_DECREF(r);
  PyErr_Clear();
  return out;
}

// repr() of exact str and int keys only: other keys could run user code.
std::string key_repr(PyObject* key) {
  if (PyUnicode_CheckExact(key) || PyLong_CheckExact(key)) {
    return py_repr(key);
  }
  return std::string("<") + Py_TYPE(key)->tp_name + " object>";
}

std::string keys_repr(const std::vector<PyObject*>& keys) {
  std::string out = "[";
  for (size_t k = 0; k < keys.size(); k++) {
    out += (k ? ", " : "") + key_repr(keys[k]);
  }
  return out + "]";
}

std::string dict_keys_repr(PyObject* dict) {
  // Held: repr() allocates, and a collection could run finalizers that change the dict.
  std::vector<PyObject*> keys;
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    Py_INCREF(key);
    keys.push_back(key);
  }
  std::string out = keys_repr(keys);
  for (PyObject* k : keys) {
    Py_DECREF(k);
  }
  return out;
}

std::string dtype_name(c10::ScalarType t) {
  THPDtype* d = torch::getTHPDtype(t);
  return d != nullptr ? std::string(d->name) : std::string(c10::toString(t));
}

std::string key_set_repr(c10::DispatchKeySet ks) {
  std::ostringstream os;
  os << ks;
  return os.str();
}

std::string TensorContainerGuard::describe(const Mismatch& m) {
  std::ostringstream os;
  if (m.record < 0) {
    os << container_name_ << ": ";
    switch (m.field) {
      case Field::kContainerType:
        os << "type changed to " << Py_TYPE(m.value)->tp_name;
        break;
      case Field::kContainerLength:
        os << "length changed " << dict_size_ << " -> " << PyDict_GET_SIZE(m.value);
        break;
      case Field::kKey:
        os << "key at position " << m.position << " changed "
           << py_repr(ordered_keys_[m.position]) << " -> " << py_repr(m.value);
        break;
      case Field::kDimMarking:
        os << "type " << reinterpret_cast<PyTypeObject*>(m.value)->tp_name
           << " now defines a dimension-marking attribute or __getattr__";
        break;
      default:
        os << "check failed";
    }
    return os.str();
  }
  if (m.field == Field::kInnerKeys) {
    os << names_[m.record] << ": the dict holding it changed keys "
       << keys_repr(inner_keys_[inner_keys_of_[m.record]]) << " -> "
       << dict_keys_repr(m.value);
    return os.str();
  }
  if (m.field == Field::kInnerType) {
    os << names_[m.record] << ": the dict holding it changed type "
       << inner_type_->tp_name << " -> " << Py_TYPE(m.value)->tp_name;
    return os.str();
  }
  if (m.field == Field::kMissing) {
    os << names_[m.record] << ": missing from the container";
    return os.str();
  }
  if (m.in_grad) {
    const Record& owner = records_[m.record];
    os << names_[m.record] << ".grad: ";
    if (m.field == Field::kGradNone) {
      os << "is None, expected a tensor";
      return os.str();
    }
    if (m.field == Field::kGradPresent) {
      os << "is a tensor, expected None";
      return os.str();
    }
    // Describe the grad's own mismatch; hold the grad while doing so.
    const at::TensorBase& grad = THPVariable_Unpack(m.value).grad();
    if (!grad.defined() || owner.grad < 0) {
      os << "check failed";
      return os.str();
    }
    PyObject* grad_obj = THPVariable_Wrap(grad);
    if (grad_obj == nullptr) {
      PyErr_Clear();
      os << "check failed";
      return os.str();
    }
    Mismatch inner = m;
    inner.in_grad = false;
    inner.value = grad_obj;
    std::string field = describe_fields(grad_records_[owner.grad], inner);
    Py_DECREF(grad_obj);
    os << field;
    return os.str();
  }
  os << names_[m.record] << ": " << describe_fields(records_[m.record], m);
  return os.str();
}

std::string TensorContainerGuard::describe_fields(const Record& r, const Mismatch& m) {
  std::ostringstream os;
  if (m.field == Field::kType) {
    os << "type changed " << _PyType_Name(r.pytype) << " -> "
       << _PyType_Name(Py_TYPE(m.value));
    return os.str();
  }
  c10::TensorImpl* impl = THPVariable_Unpack(m.value).unsafeGetTensorImpl();
  switch (m.field) {
    case Field::kDispatchKeys: {
      DispatchState ds;
      os << "dispatch key set changed "
         << key_set_repr(c10::DispatchKeySet(c10::DispatchKeySet::RAW, r.dispatch_keys))
         << " -> " << key_set_repr(ds.apply(impl->key_set()));
      break;
    }
    case Field::kDtype:
      os << "dtype changed " << dtype_name(r.dtype) << " -> "
         << dtype_name(impl->dtype().toScalarType());
      break;
    case Field::kDevice:
      os << "device index changed " << static_cast<int>(r.device_index) << " -> "
         << static_cast<int>(impl->device().index());
      break;
    case Field::kRequiresGrad:
      os << "requires_grad changed " << (r.requires_grad ? "True" : "False") << " -> "
         << (impl->requires_grad() ? "True" : "False");
      break;
    case Field::kRank:
      os << "rank changed " << r.rank << " -> " << impl->dim();
      break;
    case Field::kSize:
      os << "size[" << m.dim << "] changed " << shape_[r.shape_offset + m.dim] << " -> "
         << impl->sym_sizes()[m.dim];
      break;
    case Field::kStride:
      os << "stride[" << m.dim << "] changed "
         << shape_[r.shape_offset + r.rank + m.dim] << " -> "
         << impl->sym_strides()[m.dim];
      break;
    case Field::kDimMarking: {
      const char* attr = m.dim >= 0 ? kMarkAttrNames[m.dim] : "dimension marking";
      bool expected = r.marks >= 0 && m.dim >= 0 && marks_[r.marks].subset_of[m.dim];
      if (expected) {
        os << attr << " is not a subset of "
           << py_repr(marks_[r.marks].subset_of[m.dim]);
      } else {
        os << attr << " was set after compilation";
      }
      break;
    }
    default:
      os << "check failed";
  }
  if (std::strcmp(_PyType_Name(r.pytype), "Parameter") == 0 &&
      (m.field == Field::kSize || m.field == Field::kStride)) {
    os << " (a parameter; torch._dynamo.config.force_parameter_static_shapes = False "
          "allows dynamic shapes on parameters)";
  }
  return os.str();
}

// ---------------------------------------------------------------------------
// Python objects.

struct GuardObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  TensorContainerGuard* guard;
};

struct GroupObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  TensorAliasingGroup* group;
};

struct SlotObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* group_object; // strong
  TensorAliasingGroup* group;
  int participant; // with one entry
};

PyTypeObject GuardType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject GroupType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject SlotType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* one_arg(PyObject* const* args, size_t nargsf, PyObject* kwnames, const char* what) {
  if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames))) {
    PyErr_Format(PyExc_TypeError, "%s takes exactly one positional argument", what);
    return nullptr;
  }
  return args[0];
}

PyObject* guard_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames) {
  PyObject* container = one_arg(args, nargsf, kwnames, "TensorContainerGuard");
  if (container == nullptr) {
    return nullptr;
  }
  if (reinterpret_cast<GuardObject*>(self)->guard->check(container)) {
    Py_RETURN_TRUE;
  }
  Py_RETURN_FALSE;
}

PyObject* guard_explain(PyObject* self, PyObject* container) {
  TensorContainerGuard* g = reinterpret_cast<GuardObject*>(self)->guard;
  Mismatch m = g->find_mismatch(container);
  if (m.field == Field::kNone) {
    Py_RETURN_TRUE;
  }
  return PyUnicode_FromString(g->describe(m).c_str());
}

PyObject* guard_len(PyObject* self, PyObject*) {
  return PyLong_FromSsize_t(
      static_cast<Py_ssize_t>(reinterpret_cast<GuardObject*>(self)->guard->records_.size()));
}

PyObject* guard_summary(PyObject* self, PyObject*) {
  TensorContainerGuard* g = reinterpret_cast<GuardObject*>(self)->guard;
  std::ostringstream os;
  os << "tensor metadata of " << g->records_.size()
     << " tensors in one native TensorContainerGuard (type, dispatch keys, dtype, device, "
        "shape, stride, requires_grad, identity)";
  size_t none = 0, present = 0, metadata = 0;
  for (const Record& r : g->records_) {
    none += r.grad == kGradMustBeNone;
    present += r.grad == kGradMustBePresent;
    metadata += r.grad >= 0;
  }
  if (none + present + metadata > 0) {
    os << ", with the .grad of " << none + present + metadata << " of them (";
    const char* sep = "";
    if (metadata) {
      os << metadata << " tensor metadata";
      sep = ", ";
    }
    if (present) {
      os << sep << present << " presence only";
      sep = ", ";
    }
    if (none) {
      os << sep << none << " None";
    }
    os << ")";
  }
  if (!g->inner_keys_.empty()) {
    os << ", and the keys in order of the " << g->inner_keys_.size() << " dicts holding them";
  }
  return PyUnicode_FromString(os.str().c_str());
}

void guard_dealloc(PyObject* self) {
  delete reinterpret_cast<GuardObject*>(self)->guard;
  Py_TYPE(self)->tp_free(self);
}

PyMethodDef guard_methods[] = {
    {"explain",
     guard_explain,
     METH_O,
     "explain(container) -> True, or why the container no longer matches"},
    {"num_tensors", guard_len, METH_NOARGS, "number of tensors checked"},
    {"summary", guard_summary, METH_NOARGS, "one line saying what the guard checks"},
    {nullptr, nullptr, 0, nullptr}};

PyObject* group_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames) {
  // Installed as an epilogue guard: the argument (the frame locals) is unused.
  if (reinterpret_cast<GroupObject*>(self)->group->check()) {
    Py_RETURN_TRUE;
  }
  Py_RETURN_FALSE;
}

PyObject* group_explain(PyObject* self, PyObject* const*, Py_ssize_t) {
  std::string d = reinterpret_cast<GroupObject*>(self)->group->describe_duplicate();
  if (d.empty()) {
    Py_RETURN_TRUE;
  }
  return PyUnicode_FromString(d.c_str());
}

PyObject* group_num_tensors(PyObject* self, PyObject*) {
  return PyLong_FromSize_t(reinterpret_cast<GroupObject*>(self)->group->num_tensors());
}

PyObject* slot_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames);

PyObject* group_add_tensor(PyObject* self, PyObject* name) {
  if (!PyUnicode_Check(name)) {
    PyErr_SetString(PyExc_TypeError, "add_tensor(name: str)");
    return nullptr;
  }
  TensorAliasingGroup* group = reinterpret_cast<GroupObject*>(self)->group;
  int p = group->add_participant({PyUnicode_AsUTF8(name)});
  SlotObject* slot = PyObject_New(SlotObject, &SlotType);
  if (slot == nullptr) {
    return nullptr;
  }
  slot->vectorcall = slot_vectorcall;
  Py_INCREF(self);
  slot->group_object = self;
  slot->group = group;
  slot->participant = p;
  return reinterpret_cast<PyObject*>(slot);
}

void group_dealloc(PyObject* self) {
  delete reinterpret_cast<GroupObject*>(self)->group;
  Py_TYPE(self)->tp_free(self);
}

PyObject* group_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) != 0 || (kwargs != nullptr && PyDict_GET_SIZE(kwargs))) {
    PyErr_SetString(PyExc_TypeError, "TensorAliasingGroup() takes no arguments");
    return nullptr;
  }
  GroupObject* self = reinterpret_cast<GroupObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->vectorcall = group_vectorcall;
  self->group = new TensorAliasingGroup();
  return reinterpret_cast<PyObject*>(self);
}

PyMethodDef group_methods[] = {
    {"explain",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(group_explain)),
     METH_FASTCALL,
     "explain(*args) -> True, or which two entries were the same tensor in the last check"},
    {"add_tensor",
     group_add_tensor,
     METH_O,
     "add_tensor(name) -> a guard that records one tensor's identity for this group"},
    {"num_tensors", group_num_tensors, METH_NOARGS, "number of tensors in the group"},
    {nullptr, nullptr, 0, nullptr}};

PyObject* slot_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames) {
  PyObject* tensor = one_arg(args, nargsf, kwnames, "TensorAliasingGroup slot");
  if (tensor == nullptr) {
    return nullptr;
  }
  SlotObject* slot = reinterpret_cast<SlotObject*>(self);
  record_identity(slot->group->participant(slot->participant), 0, tensor);
  Py_RETURN_TRUE;
}

void slot_dealloc(PyObject* self) {
  Py_XDECREF(reinterpret_cast<SlotObject*>(self)->group_object);
  Py_TYPE(self)->tp_free(self);
}

void ready_type(
    PyTypeObject& type,
    const char* name,
    size_t size,
    size_t vectorcall_offset,
    destructor dealloc,
    PyMethodDef* methods,
    const char* doc,
    newfunc tp_new = nullptr) {
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

PyObject* new_ref(py::handle h) {
  Py_INCREF(h.ptr());
  return h.ptr();
}

std::vector<int64_t> shape_entries(const py::sequence& values) {
  std::vector<int64_t> out;
  out.reserve(values.size());
  for (py::handle v : values) {
    out.push_back(v.is_none() ? kUnchecked : v.cast<int64_t>());
  }
  return out;
}

Kind parse_kind(const std::string& kind) {
  if (kind == "list") {
    return Kind::kList;
  }
  if (kind == "tuple") {
    return Kind::kTuple;
  }
  if (kind == "dict_lookup") {
    return Kind::kDictLookup;
  }
  if (kind == "dict_ordered") {
    return Kind::kDictOrdered;
  }
  if (kind == "dict_nested") {
    return Kind::kDictNested;
  }
  throw py::value_error("unknown container kind: " + kind);
}

py::object make_tensor_container_guard(
    const std::string& kind,
    const std::string& container_name,
    const py::object& dict_type,
    const py::object& ordered_keys,
    const py::list& elements,
    const py::object& aliasing_group) {
  auto guard = std::make_unique<TensorContainerGuard>();
  guard->kind_ = parse_kind(kind);
  guard->container_name_ = container_name;

  if (guard->kind_ == Kind::kDictOrdered) {
    if (!PyType_Check(dict_type.ptr())) {
      throw py::type_error("dict_ordered needs the dict type");
    }
    guard->dict_type_ = reinterpret_cast<PyTypeObject*>(dict_type.inc_ref().ptr());
    for (py::handle key : py::cast<py::sequence>(ordered_keys)) {
      if (!PyLong_CheckExact(key.ptr()) && !PyUnicode_CheckExact(key.ptr())) {
        throw py::type_error("dict_ordered keys must be exact int or str");
      }
      guard->ordered_keys_.push_back(new_ref(key));
    }
    guard->dict_size_ = static_cast<Py_ssize_t>(guard->ordered_keys_.size());
  }
  if (guard->kind_ == Kind::kDictNested) {
    if (!PyType_Check(dict_type.ptr()) ||
        !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(dict_type.ptr()), &PyDict_Type)) {
      throw py::type_error("dict_nested needs the type of the inner dicts");
    }
    guard->inner_type_ = reinterpret_cast<PyTypeObject*>(dict_type.inc_ref().ptr());
  }
  const bool nested = guard->kind_ == Kind::kDictNested;

  // elements: (locator, key, tensor, sizes, strides, marks, aliasing, name[, grad])
  DispatchState build_state;
  std::vector<std::string> alias_names;
  Py_ssize_t previous_locator = -1;
  // Fills the tensor metadata of r from e = (.., .., tensor, sizes, strides, marks,
  // aliasing, name); returns the name.
  auto fill = [&](Record& r, const py::tuple& e) -> std::string {
    PyObject* tensor = e[2].ptr();
    if (!THPVariable_Check(tensor)) {
      throw py::type_error("element tensor must be a torch.Tensor");
    }
    const at::Tensor& t = THPVariable_Unpack(tensor);
    Py_INCREF(Py_TYPE(tensor));
    r.pytype = Py_TYPE(tensor);
    r.dispatch_keys = build_state.apply(t.key_set()).raw_repr();
    r.dtype = t.scalar_type();
    r.device_index = t.device().index();
    r.requires_grad = t.requires_grad();
    std::vector<int64_t> sizes = shape_entries(py::cast<py::sequence>(e[3]));
    std::vector<int64_t> strides = shape_entries(py::cast<py::sequence>(e[4]));
    if (sizes.size() != static_cast<size_t>(t.dim()) || strides.size() != sizes.size()) {
      throw py::value_error("sizes/strides do not match the tensor's rank");
    }
    r.rank = static_cast<int32_t>(sizes.size());
    r.shape_offset = static_cast<uint32_t>(guard->shape_.size());
    guard->shape_.insert(guard->shape_.end(), sizes.begin(), sizes.end());
    guard->shape_.insert(guard->shape_.end(), strides.begin(), strides.end());
    r.marks = -1;
    if (!e[5].is_none()) {
      auto marks = py::cast<py::tuple>(e[5]);
      if (marks.size() != kNumMarkAttrs) {
        throw py::value_error("marks must have one entry per dimension-marking attribute");
      }
      MarkExpectation m{};
      for (int a = 0; a < kNumMarkAttrs; a++) {
        if (!marks[a].is_none() && !is_set_of_ints(marks[a].ptr())) {
          throw py::value_error("dimension markings must be sets of ints");
        }
      }
      for (int a = 0; a < kNumMarkAttrs; a++) {
        m.subset_of[a] = marks[a].is_none() ? nullptr : new_ref(marks[a]);
      }
      r.marks = static_cast<int32_t>(guard->marks_.size());
      guard->marks_.push_back(m);
    }
    std::string name = e[7].cast<std::string>();
    r.grad = kGradUnchecked;
    if (e[6].cast<bool>()) {
      r.alias_slot = static_cast<int32_t>(alias_names.size());
      alias_names.push_back(name);
    } else {
      r.alias_slot = -1;
    }
    bool known_type = false;
    for (PyTypeObject* seen : guard->tensor_types_) {
      known_type |= seen == r.pytype;
    }
    if (!known_type) {
      if (type_may_have_mark_attrs(r.pytype)) {
        throw py::value_error("tensor type defines dimension-marking attributes");
      }
      guard->tensor_types_.push_back(r.pytype);
      guard->type_versions_.push_back(valid_version_tag(r.pytype));
    }
    return name;
  };
  for (py::handle item : elements) {
    auto e = py::cast<py::tuple>(item);
    if (e.size() != 8 && e.size() != 9) {
      throw py::value_error("element must be an 8- or 9-tuple");
    }
    Py_ssize_t locator = e[0].cast<Py_ssize_t>();
    // kDictNested: several tensors (inner keys) per outer position.
    if (locator < previous_locator || (!nested && locator == previous_locator)) {
      throw py::value_error("elements must be sorted by locator, without duplicates");
    }
    if (nested && !PyUnicode_CheckExact(e[1].ptr())) {
      throw py::type_error("dict_nested inner keys must be exact str");
    }
    previous_locator = locator;
    // The guard owns the record's references from here on, also on errors.
    guard->records_.push_back(Record{});
    {
      Record& r = guard->records_.back();
      r.locator = locator;
      r.key = e[1].is_none() ? nullptr : new_ref(e[1]);
      r.pytype = nullptr;
    }
    std::string name = fill(guard->records_.back(), e);
    guard->names_.push_back(std::move(name));
    // grad: None (unchecked), "none", "present" or a tuple like an element's.
    if (e.size() == 9 && !e[8].is_none()) {
      int32_t grad = kGradUnchecked;
      if (py::isinstance<py::str>(e[8])) {
        std::string spec = e[8].cast<std::string>();
        if (spec == "none") {
          grad = kGradMustBeNone;
        } else if (spec == "present") {
          grad = kGradMustBePresent;
        } else {
          throw py::value_error("grad must be None, 'none', 'present' or a record");
        }
      } else {
        auto ge = py::cast<py::tuple>(e[8]);
        if (ge.size() != 8) {
          throw py::value_error("grad record must be an 8-tuple");
        }
        guard->grad_records_.push_back(Record{});
        guard->grad_records_.back().pytype = nullptr;
        guard->grad_records_.back().key = nullptr;
        std::string grad_name = fill(guard->grad_records_.back(), ge);
        guard->grad_names_.push_back(std::move(grad_name));
        grad = static_cast<int32_t>(guard->grad_records_.size()) - 1;
      }
      guard->records_.back().grad = grad;
    }
  }

  if (nested && !ordered_keys.is_none()) {
    // {outer position: the inner dict's keys in order}, for positions with records.
    guard->inner_keys_of_.assign(guard->records_.size(), -1);
    guard->inner_key_index_.assign(guard->records_.size(), -1);
    for (auto item : py::cast<py::dict>(ordered_keys)) {
      Py_ssize_t position = item.first.cast<Py_ssize_t>();
      size_t first = 0;
      while (first < guard->records_.size() && guard->records_[first].locator != position) {
        first++;
      }
      if (first == guard->records_.size()) {
        throw py::value_error("dict_nested inner keys given for a position without records");
      }
      std::vector<PyObject*> keys;
      for (py::handle key : py::cast<py::sequence>(item.second)) {
        if (!PyUnicode_CheckExact(key.ptr())) {
          for (PyObject* k : keys) {
            Py_DECREF(k);
          }
          throw py::type_error("dict_nested inner keys must be exact str");
        }
        keys.push_back(new_ref(key));
      }
      guard->inner_keys_of_[first] = static_cast<int32_t>(guard->inner_keys_.size());
      guard->inner_keys_.push_back(std::move(keys)); // owned by the guard from here on
      const std::vector<PyObject*>& listed = guard->inner_keys_.back();
      if (guard->inner_values_.size() < listed.size()) {
        guard->inner_values_.resize(listed.size());
      }
      for (size_t i = first; i < guard->records_.size() && guard->records_[i].locator == position; i++) {
        for (size_t k = 0; k < listed.size(); k++) {
          if (PyUnicode_Compare(listed[k], guard->records_[i].key) == 0) {
            guard->inner_key_index_[i] = static_cast<int32_t>(k);
          }
        }
        if (guard->inner_key_index_[i] < 0) {
          throw py::value_error("a recorded inner key is missing from the inner keys");
        }
      }
    }
  }

  if (!alias_names.empty()) {
    if (aliasing_group.is_none() || Py_TYPE(aliasing_group.ptr()) != &GroupType) {
      throw py::type_error("tensors that take part in no-aliasing need a TensorAliasingGroup");
    }
    guard->group_object_ = aliasing_group.inc_ref().ptr();
    guard->group_ = reinterpret_cast<GroupObject*>(aliasing_group.ptr())->group;
    guard->participant_ = guard->group_->add_participant(std::move(alias_names));
  }

  GuardObject* obj = PyObject_New(GuardObject, &GuardType);
  if (obj == nullptr) {
    throw py::error_already_set();
  }
  obj->vectorcall = guard_vectorcall;
  obj->guard = guard.release();
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(obj));
}

// ---------------------------------------------------------------------------
// ObjectIdentityGuard: `a is b` for many pairs of container items at once, in
// place of one Python `is` lambda per pair (DUPLICATE_INPUT), e.g. an optimizer's
// params[i] and the i-th key of its state dict. The containers are fetched from
// the frame locals at every check (strong references held while comparing), and
// only items of those live containers are compared: no pointer is kept between
// checks, so address reuse cannot make two different objects look identical.

struct IdentityStep {
  bool attr; // getattr(obj, name) or obj[key]
  PyObject* name_or_key; // strong
};

struct IdentityBase {
  PyObject* local_name; // strong; L[local_name]
  std::vector<IdentityStep> steps;
  bool keys; // items are dict keys by position (list(dict.keys(d))[i])
};

struct IdentityPair {
  int32_t base_a;
  int32_t base_b;
  Py_ssize_t index_a;
  Py_ssize_t index_b;
};

class ObjectIdentityGuard {
 public:
  ~ObjectIdentityGuard() {
    for (IdentityBase& b : bases_) {
      Py_XDECREF(b.local_name);
      for (IdentityStep& s : b.steps) {
        Py_XDECREF(s.name_or_key);
      }
    }
  }

  // -1: all pairs identical; -2: a container could not be fetched or has the
  // wrong type; else the index of the first pair that differs (or is missing).
  Py_ssize_t first_failure(PyObject* locals) {
    std::vector<PyObject*> objs(bases_.size(), nullptr); // strong
    auto release = [&]() {
      for (PyObject* o : objs) {
        Py_XDECREF(o);
      }
    };
    for (size_t i = 0; i < bases_.size(); i++) {
      const IdentityBase& b = bases_[i];
      PyObject* obj = nullptr;
      if (b.local_name != nullptr) {
        obj = PyObject_GetItem(locals, b.local_name);
      } else {
        Py_INCREF(locals);
        obj = locals; // the steps start at the guard's argument
      }
      for (const IdentityStep& s : b.steps) {
        if (obj == nullptr) {
          break;
        }
        PyObject* next = s.attr ? PyObject_GetAttr(obj, s.name_or_key)
                                : PyObject_GetItem(obj, s.name_or_key);
        Py_DECREF(obj);
        obj = next;
      }
      if (obj == nullptr) {
        PyErr_Clear();
        release();
        return -2;
      }
      objs[i] = obj;
    }
    // From here on no Python code runs: borrowed items stay valid.
    items_.assign(bases_.size(), {});
    for (size_t i = 0; i < bases_.size(); i++) {
      PyObject* obj = objs[i];
      std::vector<PyObject*>& items = items_[i];
      if (bases_[i].keys) {
        if (!PyDict_Check(obj)) {
          release();
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
            reinterpret_cast<PyListObject*>(obj)->ob_item + PyList_GET_SIZE(obj));
      } else if (PyTuple_CheckExact(obj)) {
        items.assign(
            reinterpret_cast<PyTupleObject*>(obj)->ob_item,
            reinterpret_cast<PyTupleObject*>(obj)->ob_item + PyTuple_GET_SIZE(obj));
      } else {
        release();
        return -2;
      }
    }
    Py_ssize_t result = -1;
    for (size_t p = 0; p < pairs_.size(); p++) {
      const IdentityPair& pair = pairs_[p];
      const std::vector<PyObject*>& a = items_[pair.base_a];
      const std::vector<PyObject*>& b = items_[pair.base_b];
      if (pair.index_a >= static_cast<Py_ssize_t>(a.size()) ||
          pair.index_b >= static_cast<Py_ssize_t>(b.size()) ||
          a[pair.index_a] != b[pair.index_b]) {
        result = static_cast<Py_ssize_t>(p);
        break;
      }
    }
    release();
    return result;
  }

  std::vector<IdentityBase> bases_;
  std::vector<IdentityPair> pairs_;
  std::vector<std::string> descriptions_; // per pair: "a is b"
  std::vector<std::vector<PyObject*>> items_; // scratch

};

struct IdentityObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  ObjectIdentityGuard* guard;
};

PyTypeObject IdentityType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* identity_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames) {
  PyObject* locals = one_arg(args, nargsf, kwnames, "ObjectIdentityGuard");
  if (locals == nullptr) {
    return nullptr;
  }
  if (reinterpret_cast<IdentityObject*>(self)->guard->first_failure(locals) == -1) {
    Py_RETURN_TRUE;
  }
  Py_RETURN_FALSE;
}

PyObject* identity_explain(PyObject* self, PyObject* locals) {
  ObjectIdentityGuard* g = reinterpret_cast<IdentityObject*>(self)->guard;
  Py_ssize_t p = g->first_failure(locals);
  if (p == -1) {
    Py_RETURN_TRUE;
  }
  if (p == -2) {
    return PyUnicode_FromString(
        "object identity check: a container could not be fetched or changed type");
  }
  std::string d = g->descriptions_[p] + " failed: the objects are no longer identical";
  return PyUnicode_FromString(d.c_str());
}

PyObject* identity_summary(PyObject* self, PyObject*) {
  ObjectIdentityGuard* g = reinterpret_cast<IdentityObject*>(self)->guard;
  std::ostringstream os;
  os << g->pairs_.size() << " same-object check" << (g->pairs_.size() == 1 ? "" : "s")
     << " in one native ObjectIdentityGuard";
  if (!g->descriptions_.empty()) {
    os << " (e.g. " << g->descriptions_[0] << ")";
  }
  return PyUnicode_FromString(os.str().c_str());
}

PyObject* identity_len(PyObject* self, PyObject*) {
  return PyLong_FromSize_t(reinterpret_cast<IdentityObject*>(self)->guard->pairs_.size());
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
    {"num_pairs", identity_len, METH_NOARGS, "number of identity pairs checked"},
    {"summary", identity_summary, METH_NOARGS, "one line saying what the guard checks"},
    {nullptr, nullptr, 0, nullptr}};

// bases: [(local_name, [(is_attr, name_or_key), ...], keys)], pairs:
// [(base_a, index_a, base_b, index_b, description)].
py::object make_object_identity_guard(const py::list& bases, const py::list& pairs) {
  auto guard = std::make_unique<ObjectIdentityGuard>();
  for (py::handle item : bases) {
    auto b = py::cast<py::tuple>(item);
    if (b.size() != 3 || !(b[0].is_none() || PyUnicode_CheckExact(b[0].ptr()))) {
      throw py::value_error("base must be (local_name: str | None, steps, keys: bool)");
    }
    guard->bases_.push_back(
        IdentityBase{b[0].is_none() ? nullptr : new_ref(b[0]), {}, b[2].cast<bool>()});
    for (py::handle st : py::cast<py::sequence>(b[1])) {
      auto step = py::cast<py::tuple>(st);
      if (step.size() != 2) {
        throw py::value_error("step must be (is_attr, name_or_key)");
      }
      bool attr = step[0].cast<bool>();
      PyObject* k = step[1].ptr();
      // Constant keys only: their hashing and comparison run no user code.
      if (attr ? !PyUnicode_CheckExact(k) : !(PyUnicode_CheckExact(k) || PyLong_CheckExact(k))) {
        throw py::type_error("steps take exact str attribute names and str/int keys");
      }
      guard->bases_.back().steps.push_back(IdentityStep{attr, new_ref(step[1])});
    }
  }
  const auto num_bases = static_cast<int32_t>(guard->bases_.size());
  for (py::handle item : pairs) {
    auto p = py::cast<py::tuple>(item);
    if (p.size() != 5) {
      throw py::value_error("pair must be (base_a, index_a, base_b, index_b, description)");
    }
    IdentityPair pair{
        p[0].cast<int32_t>(), p[2].cast<int32_t>(), p[1].cast<Py_ssize_t>(),
        p[3].cast<Py_ssize_t>()};
    if (pair.base_a < 0 || pair.base_a >= num_bases || pair.base_b < 0 ||
        pair.base_b >= num_bases || pair.index_a < 0 || pair.index_b < 0) {
      throw py::value_error("pair refers to an unknown base or a negative index");
    }
    guard->pairs_.push_back(pair);
    guard->descriptions_.push_back(p[4].cast<std::string>());
  }
  IdentityObject* obj = PyObject_New(IdentityObject, &IdentityType);
  if (obj == nullptr) {
    throw py::error_already_set();
  }
  obj->vectorcall = identity_vectorcall;
  obj->guard = guard.release();
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(obj));
}

} // namespace

void init_tensor_container_guard(py::module_& m) {
  for (int a = 0; a < kNumMarkAttrs; a++) {
    g_mark_attr_names[a] = PyUnicode_InternFromString(kMarkAttrNames[a]);
  }
  g_issubset_name = PyUnicode_InternFromString("issubset");
  g_mode_flag_name =
      PyUnicode_InternFromString("_is_in_any_mode_without_ignore_compile_internals");
  py::module_ dispatch = py::module_::import("torch.utils._python_dispatch");
  g_python_dispatch_dict = new_ref(dispatch.attr("__dict__"));

  ready_type(
      GuardType,
      "torch._dynamo._guard_accel.TensorContainerGuard",
      sizeof(GuardObject),
      offsetof(GuardObject, vectorcall),
      guard_dealloc,
      guard_methods,
      "TensorContainerGuard(container) -> bool: TENSOR_MATCH and dimension-marking "
      "checks for every tensor of one list, tuple or dict");
  ready_type(
      GroupType,
      "torch._dynamo._guard_accel.TensorAliasingGroup",
      sizeof(GroupObject),
      offsetof(GroupObject, vectorcall),
      group_dealloc,
      group_methods,
      "TensorAliasingGroup(): the no-aliasing guard of one frame; call it (as an "
      "epilogue guard) after its participants recorded their tensors",
      group_new);
  ready_type(
      SlotType,
      "torch._dynamo._guard_accel.TensorAliasingSlot",
      sizeof(SlotObject),
      offsetof(SlotObject, vectorcall),
      slot_dealloc,
      nullptr,
      "records one tensor's identity for its TensorAliasingGroup; always True");

  ready_type(
      IdentityType,
      "torch._dynamo._guard_accel.ObjectIdentityGuard",
      sizeof(IdentityObject),
      offsetof(IdentityObject, vectorcall),
      identity_dealloc,
      identity_methods,
      "ObjectIdentityGuard(frame_locals) -> bool: `a is b` for every recorded pair "
      "of container items");
  m.attr("ObjectIdentityGuard") = py::handle(reinterpret_cast<PyObject*>(&IdentityType));
  m.def(
      "make_object_identity_guard",
      &make_object_identity_guard,
      py::arg("bases"),
      py::arg("pairs"),
      "Build an ObjectIdentityGuard. bases: (local_name or None for the guard's argument, steps, keys) with steps "
      "(is_attr, name_or_key) from the frame locals to a list/tuple (keys False) or "
      "dict whose keys are indexed by position (keys True); pairs: (base_a, index_a, "
      "base_b, index_b, description).");
  m.attr("TensorContainerGuard") = py::handle(reinterpret_cast<PyObject*>(&GuardType));
  m.attr("TensorAliasingGroup") = py::handle(reinterpret_cast<PyObject*>(&GroupType));
  m.attr("TensorAliasingSlot") = py::handle(reinterpret_cast<PyObject*>(&SlotType));
  m.attr("MARK_ATTRS") = py::make_tuple(
      kMarkAttrNames[0], kMarkAttrNames[1], kMarkAttrNames[2], kMarkAttrNames[3],
      kMarkAttrNames[4]);
  m.def(
      "make_tensor_container_guard",
      &make_tensor_container_guard,
      py::arg("kind"),
      py::arg("container_name"),
      py::arg("dict_type"),
      py::arg("ordered_keys"),
      py::arg("elements"),
      py::arg("aliasing_group"),
      "Build a TensorContainerGuard. kind: list, tuple, dict_lookup, dict_ordered or "
      "dict_nested; elements: (locator, key, tensor, sizes, strides, marks, aliasing, "
      "name) sorted by locator, sizes/strides entries None for dynamic dimensions, marks "
      "None or one set-or-None per MARK_ATTRS entry. ordered_keys: dict_ordered, every "
      "key in order; dict_nested, None or {outer position: the inner dict's str keys in "
      "order} for positions with elements, whose keys are then checked too.");
}

} // namespace dynapatch
