// torch._dynamo._guard_accel: native guards for dynapatch.
//
// Dynamo's own guard classes are not exported by libtorch_python, so these
// guards are plain Python callables that torch/_dynamo/guard_accel.py installs
// through the guard manager's Python bindings (add_lambda_guard,
// add_epilogue_lambda_guard).
#include <pybind11/pybind11.h>

#include "tensor_container_guard.h"

PYBIND11_MODULE(_guard_accel, m) {
  m.doc() = "dynapatch native guards for torch._dynamo";
  m.attr("__version__") = GUARD_ACCEL_VERSION;
  dynapatch::init_tensor_container_guard(m);
}
