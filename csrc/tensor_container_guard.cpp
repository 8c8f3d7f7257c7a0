// TensorContainerGuard: one native leaf guard for a list, tuple or dict of
// tensors.
//
// Without it, Dynamo checks every tensor of a container through its own guard
// node: an accessor, TENSOR_MATCH, DIMENSION_DYNAMIC_MARKING_GUARD and a share
// of the relational NO_TENSOR_ALIASING guard. This guard keeps the same
// per-tensor facts as flat records and checks a whole container in one loop
// with early exit. Its Python object (tensor_container_guard_bindings.cpp) is a
// plain callable (vectorcall), installed with GuardManager.add_lambda_guard on
// the container's node by torch/_dynamo/guard_accel.py.
//
// What a record checks is what TENSOR_MATCH checks
// (torch/csrc/dynamo/guards.cpp, TensorCheck): exact Python type, the dispatch
// key set after the thread-local include/exclude sets (and Python-key masking)
// are applied, dtype, device index, requires_grad, rank, and every size and
// stride that is not dynamic. It also checks the dimension-marking attributes
// (_dynamo_dynamic_indices & co) the way DIMENSION_DYNAMIC_MARKING_GUARD does.
// Aliasing is collected into a TensorAliasingGroup and decided once per check
// by its epilogue guard.
//
// Shape (for an in-tree port to torch/csrc/dynamo/guards.cpp): each guard class
// has LeafGuard's interface, check_nopybind (hot path) and
// check_verbose_nopybind (a GuardDebugInfo with the reason); strong references
// are py::object members; every C-API entry point runs inside
// GUARD_ACCEL_TRY/CATCH (HANDLE_TH_ERRORS in-tree), so no C++ exception reaches
// the interpreter.
#include "tensor_container_guard.h"

#include <c10/util/flat_hash_map.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace dynapatch {

PyObject* g_mark_attr_names[kNumMarkAttrs] = {}; // interned, see intern()
PyObject* g_issubset_name = nullptr;
PyObject* g_mode_flag_getter = nullptr;

bool should_mask_python_keys() {
  if (g_mode_flag_getter == nullptr) {
    return true;
  }
  PyObject* flag = PyObject_CallNoArgs(g_mode_flag_getter);
  if (flag == nullptr) {
    PyErr_Clear(); // as if no such mode were active: mask, as LocalState does
    return true;
  }
  bool in_mode = flag == Py_True;
  Py_DECREF(flag);
  return !in_mode;
}
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

namespace {

// A concrete size or stride equal to `expected`. Symbolic values (only seen
// under fake/functional modes, never for real inputs) do not match; this stays
// in line (SymInt::maybe_as_int is not inlined and dominated the loop).
C10_ALWAYS_INLINE bool symint_equals(const c10::SymInt& v, int64_t expected) {
  return !v.is_heap_allocated() && v.as_int_unchecked() == expected;
}

// 0 when the interpreter has no dict versions to offer (3.12 deprecates them).
uint64_t dict_version([[maybe_unused]] PyObject* dict) {
#if PY_VERSION_HEX < 0x030C0000
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#else
  return 0;
#endif
}

// The instance __dict__ of a tensor, or nullptr when it has no instance
// attributes.
PyObject* instance_dict(PyObject* obj) {
  PyObject** dict_ptr = _PyObject_GetDictPtr(obj);
  if (dict_ptr == nullptr || *dict_ptr == nullptr ||
      PyDict_GET_SIZE(*dict_ptr) == 0) {
    return nullptr;
  }
  return *dict_ptr;
}
} // namespace

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
static int mark_attr_index(PyObject* key) {
  for (int a = 0; a < kNumMarkAttrs; a++) {
    if (key == g_mark_attr_names[a]) {
      return a;
    }
  }
  if (!PyUnicode_CheckExact(key)) {
    return -2;
  }
  if (PyUnicode_CHECK_INTERNED(key)) {
    return -1; // the names are interned: an equal interned string is the same
               // object
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
// references, so such a value does not match (a recompile, never a wrong
// accept).
bool is_set_of_ints(PyObject* obj) {
  if (!PyAnySet_CheckExact(obj)) {
    return false;
  }
  // Iterating an exact set runs no Python code.
  auto it = py::reinterpret_steal<py::object>(PyObject_GetIter(obj));
  if (!it) {
    PyErr_Clear();
    return false;
  }
  bool ints = true;
  while (auto item = py::reinterpret_steal<py::object>(PyIter_Next(it.ptr()))) {
    ints &= PyLong_CheckExact(item.ptr());
  }
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return ints;
}

bool TensorContainerGuard::mark_matches(
    const Record& r,
    int a,
    PyObject* present) {
  PyObject* expected =
      r.marks < 0 ? nullptr : marks_[r.marks].subset_of[a].ptr();
  if (expected == nullptr) {
    return false; // compiled without the attribute: a new marking recompiles
  }
  if (!is_set_of_ints(present)) {
    return false;
  }
  auto ok = py::reinterpret_steal<py::object>(
      PyObject_CallMethodOneArg(present, g_issubset_name, expected));
  if (!ok) {
    PyErr_Clear();
    return false;
  }
  int truth = PyObject_IsTrue(ok.ptr());
  if (truth < 0) {
    PyErr_Clear();
  }
  return truth == 1;
}

// DIMENSION_DYNAMIC_MARKING_GUARD: an attribute that was absent at compile time
// must still be absent; one that was present must be absent or a subset of the
// compiled one. Tensors usually have no instance attributes at all; Dynamo
// gives parameters one (_dynamo_static_input_type), so the __dict__ is scanned
// once instead of being probed for each of the five names.
bool TensorContainerGuard::marks_match(
    const Record& r,
    PyObject* obj,
    int* attr_out) {
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

bool TensorContainerGuard::scan_marks(
    const Record& r,
    PyObject* dict,
    int* attr_out) {
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
  if (r.identity != 0) {
    if (reinterpret_cast<uintptr_t>(obj) != r.identity) {
      return fail(Field::kIdentity);
    }
    // Same address and type: the grad check may unpack it.
    if (Py_TYPE(obj) != r.type()) {
      return fail(Field::kType);
    }
    return r.grad == kGradUnchecked ||
        check_grad<kVerbose>(r, obj, ds, aliasing, out);
  }
  if (Py_TYPE(obj) != r.type()) {
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
      if (expected[d] != kUnchecked &&
          !symint_equals(strides[d], expected[d])) {
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

// What GradGuardAccessor + NONE_MATCH / NOT_NONE_MATCH + TENSOR_MATCH check
// about an element's .grad. The grad's Python object is the one `tensor.grad`
// returns (THPVariable_Wrap of the C++ grad; PyObject preservation keeps it
// while the grad lives), so the aliasing identity matches the Python guard's.
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
  const at::Tensor& grad =
      THPVariable_Unpack(obj).unsafeGetTensorImpl()->grad();
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
  py::object grad_obj;
  if (PyObject* existing =
          grad.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj()) {
    grad_obj = py::reinterpret_borrow<py::object>(existing);
  } else {
    grad_obj = py::reinterpret_steal<py::object>(THPVariable_Wrap(grad));
    if (!grad_obj) {
      PyErr_Clear();
      return fail(Field::kGradNone);
    }
  }
  const Record& g = grad_records_[r.grad];
  // Released at return; the grad keeps its Python object alive (preservation),
  // so the identity recorded for aliasing stays the one `tensor.grad` returns.
  bool ok = check_record<kVerbose>(g, grad_obj.ptr(), ds, aliasing, out);
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
// Prefetch them in three stages, each from pointers an earlier stage brought
// in. elements[i] is the object to check against records_[i].
void TensorContainerGuard::prefetch_ahead(
    PyObject* const* elements,
    Py_ssize_t i) const {
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
    if (Py_TYPE(obj) == records_[i + kImplAhead].type()) {
      const char* impl = reinterpret_cast<const char*>(
          THPVariable_Unpack(obj).unsafeGetTensorImpl());
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
    if (Py_TYPE(obj) == r.type()) {
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
bool TensorContainerGuard::read_inner_dict(
    PyObject* dict,
    const std::vector<py::object>& keys) {
  if (PyDict_GET_SIZE(dict) != static_cast<Py_ssize_t>(keys.size())) {
    return false;
  }
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  for (size_t k = 0; PyDict_Next(dict, &pos, &key, &value); k++) {
    if (key != keys[k].ptr() &&
        !(PyUnicode_CheckExact(key) &&
          PyUnicode_Compare(key, keys[k].ptr()) == 0)) {
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
      // walking the entries in order and comparing key pointers is the fast
      // path.
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
          elements_[i] = key == r.key.ptr()
              ? value
              : PyDict_GetItemWithError(container, r.key.ptr());
          if (elements_[i] == nullptr) {
            PyErr_Clear();
            return fail(Field::kMissing, i);
          }
          i++;
        }
        position++;
      }
      for (; i < n; i++) { // the dict got shorter: plain lookups
        elements_[i] =
            PyDict_GetItemWithError(container, records_[i].key.ptr());
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
      if (Py_TYPE(container) != dict_type()) {
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
        if (position >= dict_size_) {
          // The dict grew while being walked (only possible if a key's __eq__
          // ran code, which exact int/str keys never do): fail, never overrun.
          return fail(Field::kContainerLength);
        }
        PyObject* expected_key = ordered_keys_[position].ptr();
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
      if (i < n) {
        return fail(
            Field::kMissing,
            i); // never: locators are checked to be < dict_size_
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
      // their key tables a few records ahead (they are scattered over the
      // heap).
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
        if (i + kKeysAhead < n &&
            Py_TYPE(elements_[i + kKeysAhead]) == inner_type()) {
          __builtin_prefetch(
              reinterpret_cast<PyDictObject*>(elements_[i + kKeysAhead])
                  ->ma_keys);
        }
        inner = elements_[i];
        if (Py_TYPE(inner) != inner_type()) {
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
        elements_[i] = PyDict_GetItemWithError(inner, records_[i].key.ptr());
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

bool TensorContainerGuard::check_nopybind(PyObject* container) {
  return run<false>(container, nullptr);
}

GuardDebugInfo TensorContainerGuard::check_verbose_nopybind(
    PyObject* container) {
  Mismatch m = find_mismatch(container);
  if (m.field == Field::kNone) {
    return GuardDebugInfo(true, 1);
  }
  return GuardDebugInfo(false, describe(m), 0);
}

Mismatch TensorContainerGuard::find_mismatch(PyObject* container) {
  Mismatch m;
  if (run<true>(container, &m)) {
    m.field = Field::kNone;
  }
  return m;
}
namespace {

std::string py_repr(PyObject* obj) {
  if (obj == nullptr) {
    return "<null>";
  }
  auto r = py::reinterpret_steal<py::object>(PyObject_Repr(obj));
  if (!r) {
    PyErr_Clear();
    return "<unprintable>";
  }
  const char* s = PyUnicode_AsUTF8(r.ptr());
  if (s == nullptr) {
    PyErr_Clear(); // e.g. a lone surrogate in the repr
    return "<unprintable>";
  }
  return s;
}

// repr() of exact str and int keys only: other keys could run user code.
std::string key_repr(PyObject* key) {
  if (PyUnicode_CheckExact(key) || PyLong_CheckExact(key)) {
    return py_repr(key);
  }
  return std::string("<") + Py_TYPE(key)->tp_name + " object>";
}

std::string keys_repr(const std::vector<py::object>& keys) {
  std::string out = "[";
  for (size_t k = 0; k < keys.size(); k++) {
    out += (k ? ", " : "") + key_repr(keys[k].ptr());
  }
  return out + "]";
}

std::string dict_keys_repr(PyObject* dict) {
  // Held: repr() allocates, and a collection could run finalizers that change
  // the dict.
  std::vector<py::object> keys;
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    keys.push_back(py::reinterpret_borrow<py::object>(key));
  }
  return keys_repr(keys);
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

} // namespace

std::string TensorContainerGuard::describe(const Mismatch& m) {
  std::ostringstream os;
  if (m.record < 0) {
    os << container_name_ << ": ";
    switch (m.field) {
      case Field::kContainerType:
        os << "type changed to " << Py_TYPE(m.value)->tp_name;
        break;
      case Field::kContainerLength:
        os << "length changed " << dict_size_ << " -> "
           << PyDict_GET_SIZE(m.value);
        break;
      case Field::kKey:
        os << "key at position " << m.position << " changed "
           << py_repr(ordered_keys_[m.position].ptr()) << " -> "
           << py_repr(m.value);
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
       << inner_type()->tp_name << " -> " << Py_TYPE(m.value)->tp_name;
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
    auto grad_obj = py::reinterpret_steal<py::object>(THPVariable_Wrap(grad));
    if (!grad_obj) {
      PyErr_Clear();
      os << "check failed";
      return os.str();
    }
    Mismatch inner = m;
    inner.in_grad = false;
    inner.value = grad_obj.ptr();
    os << describe_fields(grad_records_[owner.grad], inner);
    return os.str();
  }
  os << names_[m.record] << ": " << describe_fields(records_[m.record], m);
  return os.str();
}

std::string TensorContainerGuard::describe_fields(
    const Record& r,
    const Mismatch& m) {
  std::ostringstream os;
  if (m.field == Field::kType) {
    os << "type changed " << _PyType_Name(r.type()) << " -> "
       << _PyType_Name(Py_TYPE(m.value));
    return os.str();
  }
  if (m.field == Field::kIdentity) {
    os << "is another object than the " << _PyType_Name(r.type())
       << " guarded by identity (ID_MATCH)";
    return os.str();
  }
  c10::TensorImpl* impl = THPVariable_Unpack(m.value).unsafeGetTensorImpl();
  switch (m.field) {
    case Field::kDispatchKeys: {
      DispatchState ds;
      os << "dispatch key set changed "
         << key_set_repr(
                c10::DispatchKeySet(c10::DispatchKeySet::RAW, r.dispatch_keys))
         << " -> " << key_set_repr(ds.apply(impl->key_set()));
      break;
    }
    case Field::kDtype:
      os << "dtype changed " << dtype_name(r.dtype) << " -> "
         << dtype_name(impl->dtype().toScalarType());
      break;
    case Field::kDevice:
      os << "device index changed " << static_cast<int>(r.device_index)
         << " -> " << static_cast<int>(impl->device().index());
      break;
    case Field::kRequiresGrad:
      os << "requires_grad changed " << (r.requires_grad ? "True" : "False")
         << " -> " << (impl->requires_grad() ? "True" : "False");
      break;
    case Field::kRank:
      os << "rank changed " << r.rank << " -> " << impl->dim();
      break;
    case Field::kSize:
      os << "size[" << m.dim << "] changed " << shape_[r.shape_offset + m.dim]
         << " -> " << impl->sym_sizes()[m.dim];
      break;
    case Field::kStride:
      os << "stride[" << m.dim << "] changed "
         << shape_[r.shape_offset + r.rank + m.dim] << " -> "
         << impl->sym_strides()[m.dim];
      break;
    case Field::kDimMarking: {
      const char* attr =
          m.dim >= 0 ? kMarkAttrNames[m.dim] : "dimension marking";
      bool expected =
          r.marks >= 0 && m.dim >= 0 && marks_[r.marks].subset_of[m.dim];
      if (expected) {
        os << attr << " is not a subset of "
           << py_repr(marks_[r.marks].subset_of[m.dim].ptr());
      } else {
        os << attr << " was set after compilation";
      }
      break;
    }
    default:
      os << "check failed";
  }
  if (std::strcmp(_PyType_Name(r.type()), "Parameter") == 0 &&
      (m.field == Field::kSize || m.field == Field::kStride)) {
    os << " (a parameter; torch._dynamo.config.force_parameter_static_shapes = False "
          "allows dynamic shapes on parameters)";
  }
  return os.str();
}

void init_tensor_container_guard_state() {
  for (int a = 0; a < kNumMarkAttrs; a++) {
    g_mark_attr_names[a] = intern(kMarkAttrNames[a]);
  }
  g_issubset_name = intern("issubset");
  py::module_ dispatch = py::module_::import("torch.utils._python_dispatch");
  // Never released, like the interned names.
  g_mode_flag_getter =
      py::object(
          dispatch.attr("is_in_any_mode_without_ignore_compile_internals"))
          .release()
          .ptr();
}

} // namespace dynapatch
