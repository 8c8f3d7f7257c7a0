// TensorContainerGuard: one native leaf guard for a list, tuple or dict of
// tensors.
#pragma once

#include <pybind11/pybind11.h>

namespace dynapatch {

// Registers TensorContainerGuard, TensorAliasingGroup and their helpers on `m`.
void init_tensor_container_guard(pybind11::module_& m);

} // namespace dynapatch
