// torch._dynamo._guard_accel: native guards for dynapatch.
//
// For now the module only reports its version; the container guard lands with
// the guard accelerator patch.
#include <pybind11/pybind11.h>

PYBIND11_MODULE(_guard_accel, m) {
  m.doc() = "dynapatch native guards for torch._dynamo";
  m.attr("__version__") = GUARD_ACCEL_VERSION;
}
