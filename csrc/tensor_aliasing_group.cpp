// TensorAliasingGroup's Python types: the group (an epilogue guard) and the
// slot through which a single tensor records its identity.
#include "tensor_aliasing_group.h"

#include <memory>
#include <string>

namespace dynapatch {
namespace {

struct GroupObject {
  PyObject_HEAD vectorcallfunc vectorcall;
  TensorAliasingGroup* group;
};

// One single tensor's entry in a TensorAliasingGroup: records its identity.
class TensorAliasingSlot final : public LeafGuard {
 public:
  TensorAliasingSlot(
      py::object group_object,
      TensorAliasingGroup* group,
      int participant,
      py::object verbose_code_parts)
      : LeafGuard(std::move(verbose_code_parts)),
        group_object_(std::move(group_object)),
        group_(group),
        participant_(participant) {}

  bool check_nopybind(PyObject* tensor) override {
    record_identity(group_->participant(participant_), 0, tensor);
    return true;
  }

  GuardDebugInfo check_verbose_nopybind(PyObject* tensor) override {
    return GuardDebugInfo(check_nopybind(tensor), 1);
  }

 private:
  py::object group_object_; // keeps group_ alive
  TensorAliasingGroup* group_;
  int participant_; // with one entry
};

struct SlotObject {
  PyObject_HEAD vectorcallfunc vectorcall;
  TensorAliasingSlot* slot; // owned
};

// Static types, zero-initialized here and filled in by ready_type at module
// init.
PyTypeObject GroupType{};
PyTypeObject SlotType{};

PyObject* group_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames) {
  GUARD_ACCEL_TRY
  // Installed as an epilogue guard: called with the frame locals, which it
  // does not read; any arguments are accepted.
  PyObject* value = PyVectorcall_NARGS(nargsf) > 0 ? args[0] : Py_None;
  (void)kwnames;
  return check_result(
      reinterpret_cast<GroupObject*>(self)->group->check_nopybind(value));
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* group_explain(
    PyObject* self,
    PyObject* const* /*args*/,
    Py_ssize_t /*nargs*/) {
  GUARD_ACCEL_TRY
  return explain_result(
      reinterpret_cast<GroupObject*>(self)->group->check_verbose_nopybind(
          Py_None));
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* group_num_tensors(PyObject* self, PyObject* /*unused*/) {
  return PyLong_FromSize_t(
      reinterpret_cast<GroupObject*>(self)->group->num_tensors());
}

PyObject* slot_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames);

PyObject* group_add_tensor(
    PyObject* self,
    PyObject* const* args,
    Py_ssize_t nargs) {
  GUARD_ACCEL_TRY
  if (nargs != 2 || !PyUnicode_Check(args[0])) {
    PyErr_SetString(
        PyExc_TypeError, "add_tensor(name: str, verbose_code_parts: list)");
    return nullptr;
  }
  std::string name = utf8_arg(args[0], "name");
  py::object parts = verbose_code_parts_arg(args[1]);
  TensorAliasingGroup* group = reinterpret_cast<GroupObject*>(self)->group;
  auto slot = std::make_unique<TensorAliasingSlot>(
      py::reinterpret_borrow<py::object>(self),
      group,
      group->add_participant({std::move(name)}),
      std::move(parts));
  SlotObject* obj = PyObject_New(SlotObject, &SlotType);
  if (obj == nullptr) {
    return nullptr;
  }
  obj->vectorcall = slot_vectorcall;
  obj->slot = slot.release();
  return reinterpret_cast<PyObject*>(obj);
  GUARD_ACCEL_CATCH(nullptr)
}

void group_dealloc(PyObject* self) {
  delete reinterpret_cast<GroupObject*>(self)->group;
  Py_TYPE(self)->tp_free(self);
}

PyObject* group_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  GUARD_ACCEL_TRY
  if (PyTuple_GET_SIZE(args) != 1 ||
      (kwargs != nullptr && PyDict_GET_SIZE(kwargs))) {
    PyErr_SetString(
        PyExc_TypeError, "TensorAliasingGroup(verbose_code_parts: list)");
    return nullptr;
  }
  auto group = std::make_unique<TensorAliasingGroup>(
      verbose_code_parts_arg(PyTuple_GET_ITEM(args, 0)));
  GroupObject* self = reinterpret_cast<GroupObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->vectorcall = group_vectorcall;
  self->group = group.release();
  return reinterpret_cast<PyObject*>(self);
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* group_code_parts(PyObject* self, PyObject* /*unused*/) {
  GUARD_ACCEL_TRY
  return code_parts_result(*reinterpret_cast<GroupObject*>(self)->group);
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* slot_code_parts(PyObject* self, PyObject* /*unused*/);

PyMethodDef group_methods[] = {
    {"explain",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(group_explain)),
     METH_FASTCALL,
     "explain(*args) -> True, or which two entries were the same tensor in the last check"},
    {"add_tensor",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(group_add_tensor)),
     METH_FASTCALL,
     "add_tensor(name, verbose_code_parts) -> a guard that records one tensor's identity for this group"},
    {"verbose_code_parts",
     group_code_parts,
     METH_NOARGS,
     "the guard's verbose code parts (as LeafGuard.verbose_code_parts)"},
    {"num_tensors",
     group_num_tensors,
     METH_NOARGS,
     "number of tensors in the group"},
    {nullptr, nullptr, 0, nullptr}};

PyObject* slot_vectorcall(
    PyObject* self,
    PyObject* const* args,
    size_t nargsf,
    PyObject* kwnames) {
  GUARD_ACCEL_TRY
  PyObject* tensor = one_arg(args, nargsf, kwnames, "TensorAliasingGroup slot");
  if (tensor == nullptr) {
    return nullptr;
  }
  return check_result(
      reinterpret_cast<SlotObject*>(self)->slot->check_nopybind(tensor));
  GUARD_ACCEL_CATCH(nullptr)
}

PyObject* slot_code_parts(PyObject* self, PyObject* /*unused*/) {
  GUARD_ACCEL_TRY
  return code_parts_result(*reinterpret_cast<SlotObject*>(self)->slot);
  GUARD_ACCEL_CATCH(nullptr)
}

PyMethodDef slot_methods[] = {
    {"verbose_code_parts",
     slot_code_parts,
     METH_NOARGS,
     "the guard's verbose code parts (as LeafGuard.verbose_code_parts)"},
    {nullptr, nullptr, 0, nullptr}};

void slot_dealloc(PyObject* self) {
  delete reinterpret_cast<SlotObject*>(self)->slot;
  Py_TYPE(self)->tp_free(self);
}

void init_tensor_aliasing_group(py::module_& m) {
  ready_type(
      GroupType,
      "torch._dynamo._guard_accel.TensorAliasingGroup",
      sizeof(GroupObject),
      offsetof(GroupObject, vectorcall),
      group_dealloc,
      group_methods,
      "TensorAliasingGroup(verbose_code_parts): the no-aliasing guard of one frame; call it (as an "
      "epilogue guard) after its participants recorded their tensors",
      group_new);
  ready_type(
      SlotType,
      "torch._dynamo._guard_accel.TensorAliasingSlot",
      sizeof(SlotObject),
      offsetof(SlotObject, vectorcall),
      slot_dealloc,
      slot_methods,
      "records one tensor's identity for its TensorAliasingGroup; always True");

  m.attr("TensorAliasingGroup") =
      py::handle(reinterpret_cast<PyObject*>(&GroupType));
  m.attr("TensorAliasingSlot") =
      py::handle(reinterpret_cast<PyObject*>(&SlotType));
}

const RegisterModuleInit registered(init_tensor_aliasing_group);

} // namespace

TensorAliasingGroup* aliasing_group_of(PyObject* obj) {
  return Py_TYPE(obj) == &GroupType ? reinterpret_cast<GroupObject*>(obj)->group
                                    : nullptr;
}

} // namespace dynapatch
