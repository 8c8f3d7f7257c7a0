"""
Real handles for hooks on intermediates that compiled autograd calls.

Under compiled autograd, a hook on an intermediate that is traced into the graph
(intermediate_hooks.py, decision TRACE) is called from the frame's
BackwardState: the graph holds a trampoline, and
``call_hook_from_backward_state`` looks the hook up by name when backward runs.
So its handle can be a real one: a ``BackwardStateHookHandle`` whose
``remove()`` clears the hook there (the gradient then passes unchanged), instead
of a graph break at the ``register_hook`` call. ``remove()`` of it inside the
frame still restarts the trace with a graph break at ``register_hook``, as
without compiled autograd.
"""

from typing import Any, TYPE_CHECKING

from torch.utils.hooks import RemovableHandle

from ..bytecode_transformation import create_call_function
from .constant import ConstantVariable
from .intermediate_hooks import TracedHookHandleVariable

if TYPE_CHECKING:
    from ..codegen import PyCodegen


class BackwardStateHookHandle(RemovableHandle):
    """Runtime handle of a hook that compiled autograd calls from a BackwardState:
    removing it clears the hook there (call_hook_from_backward_state then leaves
    the gradient unchanged)."""

    def __init__(self, bw_state: Any, hook_name: str) -> None:
        super().__init__(_BackwardStateHooks({0: hook_name}))
        self.bw_state = bw_state
        self.hook_name = hook_name

    def remove(self) -> None:
        setattr(self.bw_state, self.hook_name, None)


class _BackwardStateHooks(dict[int, str]):
    # RemovableHandle keeps a weakref to its hooks dict; a plain dict has none.
    pass


class BackwardStateHookHandleVariable(TracedHookHandleVariable):
    """The handle of a traced hook that compiled autograd calls from the frame's
    BackwardState, where it is named ``bw_hook_name``."""

    def __init__(self, ordinal: int | None, bw_hook_name: str, **kwargs: Any) -> None:
        super().__init__(ordinal, **kwargs)
        self.bw_hook_name = bw_hook_name

    def reconstruct(self, codegen: "PyCodegen") -> None:
        codegen.add_push_null(
            lambda: codegen.load_import_from(__name__, "BackwardStateHookHandle")
        )
        codegen.append_output(
            codegen.create_load(codegen.tx.output.backward_state_var)
        )
        codegen(ConstantVariable.create(self.bw_hook_name))
        codegen.extend_output(create_call_function(2, False))
