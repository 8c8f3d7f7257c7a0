// TensorContainerGuard's Python type and its construction from Python: what
// torch/_dynamo/guard_accel.py calls. In-tree this file is replaced by a
// py::class_ for the guard and a typed GuardManager.add_tensor_container_guard
// binding; the element tuples (locator, key, tensor, sizes, strides, marks,
// aliasing, name[, grad]) become that binding's arguments.
#include "tensor_container_guard.h"

#include <torch/csrc/autograd/python_variable.h>

#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace dynapatch {
namespace {

struct GuardObject {
  PyObject_HEAD vectorcallfunc vectorcall;
  TensorContainerGuard* guard;
};

// Static type, zero-initialized here and filled in by ready_type at module
// init.
PyTypeObject GuardType{};

PyObject* guard_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames) {
  GUARD_ACCEL_TRY
  PyObject* container = one_arg(args, nargsf, kwnames, "TensorContainerGuard");
  if (container == nullptr) {
    return nullptr;
  }
  return check_result(
      reinterpret_cast<GuardObject*>(self)->guard->check_nopybind(container));
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* guard_explain(PyObject* self, PyObject* container) {
  GUARD_ACCEL_TRY
  return explain_result(
      reinterpret_cast<GuardObject*>(self)->guard->check_verbose_nopybind(
          container));
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* guard_len(PyObject* self, PyObject* /*unused*/) {
  return PyLong_FromSsize_t(
      static_cast<Py_ssize_t>(
          reinterpret_cast<GuardObject*>(self)->guard->records_.size()));
}

PyObject* guard_summary(PyObject* self, PyObject* /*unused*/) {
  GUARD_ACCEL_TRY
  TensorContainerGuard* g = reinterpret_cast<GuardObject*>(self)->guard;
  size_t none = 0, present = 0, metadata = 0, identity = 0;
  for (const Record& r : g->records_) {
    identity += r.identity != 0;
    none += r.grad == kGradMustBeNone;
    present += r.grad == kGradMustBePresent;
    metadata += r.grad >= 0;
  }
  std::ostringstream os;
  if (identity > 0 && identity == g->records_.size()) {
    os << "identity of " << identity
       << " tensors in one native TensorContainerGuard (as ID_MATCH: the same objects)";
  } else {
    os << "tensor metadata of " << g->records_.size()
       << " tensors in one native TensorContainerGuard (type, dispatch keys, dtype, device, "
          "shape, stride, requires_grad, identity)";
    if (identity > 0) {
      os << ", " << identity << " of them by identity only (as ID_MATCH)";
    }
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
    os << ", and the keys in order of the " << g->inner_keys_.size()
       << " dicts holding them";
  }
  return string_result(os.str());
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* guard_code_parts(PyObject* self, PyObject* /*unused*/) {
  GUARD_ACCEL_TRY
  return code_parts_result(*reinterpret_cast<GuardObject*>(self)->guard);
  GUARD_ACCEL_CATCH(nullptr)
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
    {"summary",
     guard_summary,
     METH_NOARGS,
     "one line saying what the guard checks"},
    {"verbose_code_parts",
     guard_code_parts,
     METH_NOARGS,
     "the guard's verbose code parts (as LeafGuard.verbose_code_parts)"},
    {nullptr, nullptr, 0, nullptr}};

std::vector<int64_t> shape_entries(const py::sequence& values) {
  std::vector<int64_t> out;
  out.reserve(values.size());
  for (py::handle v : values) {
    if (v.is_none()) {
      out.push_back(kUnchecked);
      continue;
    }
    if (!PyLong_Check(v.ptr())) {
      throw py::type_error("sizes and strides must be ints or None");
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (value == -1 && PyErr_Occurred()) {
      throw py::error_already_set();
    }
    // kUnchecked is reserved for dynamic dimensions; no real size or stride is.
    if (overflow != 0 || value == kUnchecked) {
      throw py::value_error("size or stride out of the int64 range");
    }
    out.push_back(static_cast<int64_t>(value));
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

bool is_dict_type(py::handle t) {
  return PyType_Check(t.ptr()) &&
      PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(t.ptr()), &PyDict_Type);
}

py::object make_tensor_container_guard(
    const py::handle& kind,
    const py::handle& container_name,
    const py::object& dict_type,
    const py::object& ordered_keys,
    const py::handle& elements_arg,
    const py::object& aliasing_group,
    const py::handle& verbose_code_parts) {
  auto guard = std::make_unique<TensorContainerGuard>(
      verbose_code_parts_arg(verbose_code_parts));
  guard->kind_ = parse_kind(utf8_arg(kind, "kind"));
  guard->container_name_ = utf8_arg(container_name, "container_name");
  if (!PyList_Check(elements_arg.ptr())) {
    throw py::type_error("elements must be a list");
  }
  // A copy: the caller's list cannot change while it is read.
  py::list elements =
      py::reinterpret_steal<py::list>(PySequence_List(elements_arg.ptr()));
  if (!elements) {
    throw py::error_already_set();
  }

  if (guard->kind_ == Kind::kDictOrdered) {
    // The check reads the dict's entries directly once its type matched.
    if (!is_dict_type(dict_type)) {
      throw py::type_error(
          "dict_ordered needs the dict type (dict or a subclass)");
    }
    guard->dict_type_ = dict_type;
    if (!PyList_Check(ordered_keys.ptr()) &&
        !PyTuple_Check(ordered_keys.ptr())) {
      throw py::type_error("dict_ordered needs ordered_keys, a list or tuple");
    }
    for (py::handle key : ordered_keys) {
      if (!PyLong_CheckExact(key.ptr()) && !PyUnicode_CheckExact(key.ptr())) {
        throw py::type_error("dict_ordered keys must be exact int or str");
      }
      guard->ordered_keys_.push_back(py::reinterpret_borrow<py::object>(key));
    }
    guard->dict_size_ = static_cast<Py_ssize_t>(guard->ordered_keys_.size());
  }
  if (guard->kind_ == Kind::kDictNested) {
    if (!is_dict_type(dict_type)) {
      throw py::type_error("dict_nested needs the type of the inner dicts");
    }
    guard->inner_type_ = dict_type;
  }
  const bool nested = guard->kind_ == Kind::kDictNested;

  // elements: (locator, key, tensor, sizes, strides, marks, aliasing, name[,
  // grad])
  DispatchState build_state;
  std::vector<std::string> alias_names;
  Py_ssize_t previous_locator = -1;
  // Fills the tensor metadata of r from e = (.., .., tensor, sizes, strides,
  // marks, aliasing, name); returns the name.
  auto fill = [&](Record& r, const py::tuple& e) -> std::string {
    PyObject* tensor = e[2].ptr();
    if (!THPVariable_Check(tensor)) {
      throw py::type_error("element tensor must be a torch.Tensor");
    }
    if (e[3].is_none() && e[4].is_none()) {
      r.pytype = py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(Py_TYPE(tensor)));
      // An identity record: only `element is tensor` (and its .grad).
      if (!e[5].is_none() || bool_arg(e[6], "element aliasing")) {
        throw py::value_error(
            "an identity record (sizes and strides None) takes no marks and no aliasing");
      }
      r.identity = reinterpret_cast<uintptr_t>(tensor);
      r.grad = kGradUnchecked;
      return utf8_arg(e[7], "element name");
    }
    const at::Tensor& t = THPVariable_Unpack(tensor);
    if (!t.defined() || t.layout() != c10::kStrided || t.is_nested()) {
      throw py::value_error(
          "element tensor must be a defined, strided, non-nested tensor");
    }
    r.pytype = py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(Py_TYPE(tensor)));
    r.dispatch_keys = build_state.apply(t.key_set()).raw_repr();
    r.dtype = t.scalar_type();
    r.device_index = t.device().index();
    r.requires_grad = t.requires_grad();
    std::vector<int64_t> sizes = shape_entries(
        py::reinterpret_borrow<py::sequence>(tuple_or_list(e[3], "sizes")));
    std::vector<int64_t> strides = shape_entries(
        py::reinterpret_borrow<py::sequence>(tuple_or_list(e[4], "strides")));
    if (sizes.size() != static_cast<size_t>(t.dim()) ||
        strides.size() != sizes.size()) {
      throw py::value_error("sizes/strides do not match the tensor's rank");
    }
    if (guard->shape_.size() + 2 * sizes.size() >
        std::numeric_limits<uint32_t>::max()) {
      throw py::value_error("too many sizes and strides for one guard");
    }
    r.rank = static_cast<int32_t>(sizes.size());
    r.shape_offset = static_cast<uint32_t>(guard->shape_.size());
    guard->shape_.insert(guard->shape_.end(), sizes.begin(), sizes.end());
    guard->shape_.insert(guard->shape_.end(), strides.begin(), strides.end());
    r.marks = -1;
    if (!e[5].is_none()) {
      py::tuple marks = tuple_arg(e[5], "marks");
      if (marks.size() != kNumMarkAttrs) {
        throw py::value_error(
            "marks must have one entry per dimension-marking attribute");
      }
      MarkExpectation m{};
      for (int a = 0; a < kNumMarkAttrs; a++) {
        if (!marks[a].is_none() && !is_set_of_ints(marks[a].ptr())) {
          throw py::value_error("dimension markings must be sets of ints");
        }
      }
      for (int a = 0; a < kNumMarkAttrs; a++) {
        if (!marks[a].is_none()) {
          m.subset_of[a] = py::reinterpret_borrow<py::object>(marks[a]);
        }
      }
      r.marks = static_cast<int32_t>(guard->marks_.size());
      guard->marks_.push_back(std::move(m));
    }
    std::string name = utf8_arg(e[7], "element name");
    r.grad = kGradUnchecked;
    if (bool_arg(e[6], "element aliasing")) {
      r.alias_slot = static_cast<int32_t>(alias_names.size());
      alias_names.push_back(name);
    } else {
      r.alias_slot = -1;
    }
    bool known_type = false;
    for (PyTypeObject* seen : guard->tensor_types_) {
      known_type |= seen == r.type();
    }
    if (!known_type) {
      if (type_may_have_mark_attrs(r.type())) {
        throw py::value_error(
            "tensor type defines dimension-marking attributes");
      }
      guard->tensor_types_.push_back(r.type());
      guard->type_versions_.push_back(valid_version_tag(r.type()));
    }
    return name;
  };
  for (py::handle item : elements) {
    py::tuple e = tuple_arg(item, "element");
    if (e.size() != 8 && e.size() != 9) {
      throw py::value_error("element must be an 8- or 9-tuple");
    }
    Py_ssize_t locator = index_arg(e[0], "element locator");
    if (guard->kind_ == Kind::kDictOrdered && locator >= guard->dict_size_) {
      throw py::value_error("element locator is not a position of the dict");
    }
    // kDictNested: several tensors (inner keys) per outer position.
    if (locator < previous_locator ||
        (!nested && locator == previous_locator)) {
      throw py::value_error(
          "elements must be sorted by locator, without duplicates");
    }
    if (nested && !PyUnicode_CheckExact(e[1].ptr())) {
      throw py::type_error("dict_nested inner keys must be exact str");
    }
    // Looked up during a check: hashing and comparing must run no Python code.
    if (guard->kind_ == Kind::kDictLookup &&
        !(PyUnicode_CheckExact(e[1].ptr()) || PyLong_CheckExact(e[1].ptr()))) {
      throw py::type_error("dict_lookup keys must be exact str or int");
    }
    previous_locator = locator;
    guard->records_.push_back(Record{});
    {
      Record& r = guard->records_.back();
      r.locator = locator;
      if (!e[1].is_none()) {
        r.key = py::reinterpret_borrow<py::object>(e[1]);
      }
    }
    std::string name = fill(guard->records_.back(), e);
    guard->names_.push_back(std::move(name));
    // grad: None (unchecked), "none", "present" or a tuple like an element's.
    if (e.size() == 9 && !e[8].is_none()) {
      int32_t grad = kGradUnchecked;
      if (PyUnicode_Check(e[8].ptr())) {
        std::string spec = utf8_arg(e[8], "grad");
        if (spec == "none") {
          grad = kGradMustBeNone;
        } else if (spec == "present") {
          grad = kGradMustBePresent;
        } else {
          throw py::value_error(
              "grad must be None, 'none', 'present' or a record");
        }
      } else {
        py::tuple ge = tuple_arg(e[8], "grad record");
        // An element record of its own, without a grad of its .grad.
        if (ge.size() != 8 && !(ge.size() == 9 && ge[8].is_none())) {
          throw py::value_error(
              "grad record must be an 8-tuple (or 9 with grad None)");
        }
        guard->grad_records_.push_back(Record{});
        fill(
            guard->grad_records_.back(),
            ge); // its name goes to the aliasing group
        grad = static_cast<int32_t>(guard->grad_records_.size()) - 1;
      }
      guard->records_.back().grad = grad;
    }
  }

  if (nested && !ordered_keys.is_none()) {
    // {outer position: the inner dict's keys in order}, for positions with
    // records.
    if (!PyDict_CheckExact(ordered_keys.ptr())) {
      throw py::type_error("dict_nested ordered_keys must be None or a dict");
    }
    // A copy: reading it runs no code that could change it.
    auto inner_keys =
        py::reinterpret_steal<py::dict>(PyDict_Copy(ordered_keys.ptr()));
    if (!inner_keys) {
      throw py::error_already_set();
    }
    guard->inner_keys_of_.assign(guard->records_.size(), -1);
    guard->inner_key_index_.assign(guard->records_.size(), -1);
    for (auto item : inner_keys) {
      Py_ssize_t position = index_arg(item.first, "dict_nested position");
      size_t first = 0;
      while (first < guard->records_.size() &&
             guard->records_[first].locator != position) {
        first++;
      }
      if (first == guard->records_.size()) {
        throw py::value_error(
            "dict_nested inner keys given for a position without records");
      }
      if (guard->inner_keys_of_[first] >= 0) {
        throw py::value_error(
            "dict_nested inner keys given twice for one position");
      }
      if (!PyList_Check(item.second.ptr()) &&
          !PyTuple_Check(item.second.ptr())) {
        throw py::type_error(
            "dict_nested inner keys must be a list or tuple of str");
      }
      std::vector<py::object> keys;
      for (py::handle key : item.second) {
        if (!PyUnicode_CheckExact(key.ptr())) {
          throw py::type_error("dict_nested inner keys must be exact str");
        }
        keys.push_back(py::reinterpret_borrow<py::object>(key));
      }
      guard->inner_keys_of_[first] =
          static_cast<int32_t>(guard->inner_keys_.size());
      guard->inner_keys_.push_back(std::move(keys));
      const std::vector<py::object>& listed = guard->inner_keys_.back();
      if (guard->inner_values_.size() < listed.size()) {
        guard->inner_values_.resize(listed.size());
      }
      for (size_t i = first;
           i < guard->records_.size() && guard->records_[i].locator == position;
           i++) {
        for (size_t k = 0; k < listed.size(); k++) {
          // Both exact str: no Python code runs; -1 only with an error set.
          int cmp =
              PyUnicode_Compare(listed[k].ptr(), guard->records_[i].key.ptr());
          if (cmp == -1 && PyErr_Occurred()) {
            throw py::error_already_set();
          }
          if (cmp == 0) {
            guard->inner_key_index_[i] = static_cast<int32_t>(k);
          }
        }
        if (guard->inner_key_index_[i] < 0) {
          throw py::value_error(
              "a recorded inner key is missing from the inner keys");
        }
      }
    }
  }

  if (!alias_names.empty()) {
    TensorAliasingGroup* group = aliasing_group.is_none()
        ? nullptr
        : aliasing_group_of(aliasing_group.ptr());
    if (group == nullptr) {
      throw py::type_error(
          "tensors that take part in no-aliasing need a TensorAliasingGroup");
    }
    guard->group_object_ = aliasing_group;
    guard->group_ = group;
    guard->participant_ =
        guard->group_->add_participant(std::move(alias_names));
  }

  GuardObject* obj = PyObject_New(GuardObject, &GuardType);
  if (obj == nullptr) {
    throw py::error_already_set();
  }
  obj->vectorcall = guard_vectorcall;
  obj->guard = guard.release();
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(obj));
}

void init_tensor_container_guard(py::module_& m) {
  init_tensor_container_guard_state();
  ready_type(
      GuardType,
      "torch._dynamo._guard_accel.TensorContainerGuard",
      sizeof(GuardObject),
      offsetof(GuardObject, vectorcall),
      guard_dealloc,
      guard_methods,
      "TensorContainerGuard(container) -> bool: TENSOR_MATCH and dimension-marking "
      "checks for every tensor of one list, tuple or dict");
  m.attr("TensorContainerGuard") =
      py::handle(reinterpret_cast<PyObject*>(&GuardType));
  m.attr("MARK_ATTRS") = py::make_tuple(
      kMarkAttrNames[0],
      kMarkAttrNames[1],
      kMarkAttrNames[2],
      kMarkAttrNames[3],
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
      py::arg("verbose_code_parts"),
      "Build a TensorContainerGuard. kind: list, tuple, dict_lookup, dict_ordered or "
      "dict_nested; elements: (locator, key, tensor, sizes, strides, marks, aliasing, "
      "name[, grad]) sorted by locator, sizes/strides entries None for dynamic dimensions "
      "(sizes and strides both None: an identity record, which checks only that the element "
      "is that tensor, by address, and its grad), marks "
      "None or one set-or-None per MARK_ATTRS entry, grad None, 'none', 'present' or the "
      "element record of the tensor's .grad. ordered_keys: dict_ordered, every "
      "key in order; dict_nested, None or {outer position: the inner dict's str keys in "
      "order} for positions with elements, whose keys are then checked too. "
      "verbose_code_parts: the guard's LeafGuard verbose code parts.");
}

const RegisterModuleInit registered(init_tensor_container_guard);

} // namespace
} // namespace dynapatch
