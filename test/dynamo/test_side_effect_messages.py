# Owner(s): ["module: dynamo"]
"""Side-effect log messages are formatted only when something logs them."""

import logging
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo.side_effects import SideEffects


class Holder:
    def __init__(self):
        self.count = 0
        self.log = []


def mutate(holder, d, x):
    holder.count += 1
    holder.log.append(holder.count)
    d["last"] = holder.count
    return x * holder.count


def no_structured_trace():
    # Outside fbcode (and without TORCH_TRACE) the structured-trace handler
    # removes itself on its first record; until then it counts as listening.
    return unittest.mock.patch.object(torch._logging._internal.trace_log, "handlers", [])


def run_compiled_and_eager(test, backend):
    """Call `mutate` three times compiled and eagerly; compare values and state."""
    eager_holder, eager_dict = Holder(), {}
    compiled_holder, compiled_dict = Holder(), {}
    compiled = torch.compile(mutate, backend=backend)
    x = torch.ones(3)
    for _ in range(3):
        expected = mutate(eager_holder, eager_dict, x)
        actual = compiled(compiled_holder, compiled_dict, x)
        test.assertEqual(actual, expected)
        test.assertEqual(compiled_holder.count, eager_holder.count)
        test.assertEqual(compiled_holder.log, eager_holder.log)
        test.assertEqual(compiled_dict, eager_dict)


class SideEffectMessageTests(torch._dynamo.test_case.TestCase):
    def test_messages_not_formatted_when_nothing_logs(self):
        # Without this patch every replayed side effect's message (with its
        # formatted user stack) is built on every compile, logged or not.
        counter = torch._dynamo.testing.CompileCounter()
        with unittest.mock.patch.object(
            SideEffects, "_format_side_effect_message", autospec=True,
            side_effect=SideEffects._format_side_effect_message,
        ) as fmt, no_structured_trace():
            run_compiled_and_eager(self, counter)
        self.assertEqual(counter.frame_count, 3)  # holder.count is specialized per value
        self.assertEqual(fmt.call_count, 0)


class SideEffectMessageLoggingTests(torch._dynamo.test_case.TestCase):
    def test_messages_logged_when_side_effects_log_is_on(self):
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger("torch._dynamo.side_effects")
        counter = torch._dynamo.testing.CompileCounter()
        torch._logging.set_logs(side_effects=True)
        logger.addHandler(handler)
        try:
            with unittest.mock.patch.object(
                SideEffects, "_format_side_effect_message", autospec=True,
                side_effect=SideEffects._format_side_effect_message,
            ) as fmt, no_structured_trace():
                run_compiled_and_eager(self, counter)
        finally:
            logger.removeHandler(handler)
            torch._logging.set_logs()
        self.assertEqual(counter.frame_count, 3)
        messages = [r.getMessage() for r in records if r.getMessage().startswith("Mutating object")]
        # One message per mutated object and compile: the holder's attribute,
        # its list and the dict, each with its source name.
        for name in ("L['holder']", "L['holder'].log", "L['d']"):
            self.assertEqual(
                sum(f"(source name: {name})" in m for m in messages), 3,
                f"not one side-effect message per compile for {name} in {messages}",
            )
        self.assertEqual(fmt.call_count, len(messages))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
