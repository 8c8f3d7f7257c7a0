// torch._dynamo._guard_accel: native guards for dynapatch.
//
// Dynamo's own guard classes are not exported by libtorch_python, so these
// guards are plain Python callables that torch/_dynamo/guard_accel.py installs
// through the guard manager's Python bindings (add_lambda_guard,
// add_epilogue_lambda_guard). One source file per guard class; each registers
// its part of the module (guard_accel_common.h, RegisterModuleInit).
#include "guard_accel_common.h"

namespace dynapatch {

std::vector<ModuleInit>& module_inits() {
  static std::vector<ModuleInit> inits; // filled by static initializers
  return inits;
}

} // namespace dynapatch

PYBIND11_MODULE(_guard_accel, m) {
  m.doc() = "dynapatch native guards for torch._dynamo";
  m.attr("__version__") = GUARD_ACCEL_VERSION;
  // Each part readies its own types and names only them: the order does not
  // matter.
  for (dynapatch::ModuleInit init : dynapatch::module_inits()) {
    init(m);
  }
}
