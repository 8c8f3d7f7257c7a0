# Owner(s): ["module: dynamo"]
"""ConfigModule reads of plain entries skip the alias/deprecation/justknob lookups, same values."""

import importlib.util
import os
import sys
import tempfile
import unittest.mock
import warnings

import torch
import torch._dynamo.test_case
import torch.utils._config_module as config_module

CONFIG_SOURCE = """
import sys
from torch.utils._config_module import Config, install_config_module
plain_int = 1
plain_tuple = (1, 2)
mutable_list = [1]
env_default: bool = Config(env_name_default="DYNAPATCH_TEST_ENV_DEFAULT", default=False)
env_force: bool = Config(env_name_force="DYNAPATCH_TEST_ENV_FORCE", default=False)
aliased: int = Config(alias="{name}.plain_int")
deprecated: int = Config(default=3, deprecated=True, deprecation_message="use plain_int")
knob: bool = Config(justknob="does_not_exist", default=True)
install_config_module(sys.modules[__name__])
"""


def make_config_module(name, directory):
    """A fresh config module from a file (install_config_module reads its source; the
    environment variables are read when it is installed)."""
    path = os.path.join(directory, f"{name}.py")
    with open(path, "w") as f:
        f.write(CONFIG_SOURCE.format(name=name))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class ConfigPlainReadTests(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.env = unittest.mock.patch.dict(
            os.environ, {"DYNAPATCH_TEST_ENV_DEFAULT": "1", "DYNAPATCH_TEST_ENV_FORCE": "1"}
        )
        self.env.start()
        self.addCleanup(self.env.stop)
        self.name = f"dynapatch_test_config_{self._testMethodName}"
        self.addCleanup(sys.modules.pop, self.name, None)
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        self.cfg = make_config_module(self.name, directory.name)

    def read_all(self):
        """Every entry's value, plus the alias lookups that ran."""
        lookups = []
        original = config_module.ConfigModule._get_alias_val

        def counting(module, entry):
            if module is self.cfg:
                lookups.append(entry)
            return original(module, entry)

        names = ["plain_int", "plain_tuple", "mutable_list", "env_default", "env_force", "aliased", "knob"]
        with unittest.mock.patch.object(config_module.ConfigModule, "_get_alias_val", counting):
            values = {name: getattr(self.cfg, name) for name in names}
        return values, len(lookups)

    def test_plain_entries_classified(self):
        plain = {name for name, entry in self.cfg._config.items() if entry.plain_read}
        # env_default is plain (the environment's value is a default); env_force is not.
        self.assertEqual(plain, {"plain_int", "plain_tuple", "env_default"})

    def test_values_and_lookups(self):
        values, lookups = self.read_all()
        self.assertEqual(
            values,
            {
                "plain_int": 1,
                "plain_tuple": (1, 2),
                "mutable_list": [1],
                "env_default": True,
                "env_force": True,
                "aliased": 1,
                "knob": True,
            },
        )
        # The three plain entries skip the alias lookup; without this patch every read does
        # it, the aliased entry's own read of plain_int included (8 lookups).
        self.assertEqual(lookups, 7 - 3)

    def test_user_override_wins_then_default_returns(self):
        with self.cfg.patch(plain_int=5, env_default=False):
            self.assertEqual((self.cfg.plain_int, self.cfg.env_default), (5, False))
            self.assertEqual(self.cfg.aliased, 5)
        self.assertEqual((self.cfg.plain_int, self.cfg.env_default), (1, True))
        self.cfg.plain_int = 7
        self.assertEqual(self.cfg.plain_int, 7)
        del self.cfg.plain_int
        # Hidden after delattr (unittest.mock.patch relies on it) until set again.
        self.assertFalse(hasattr(self.cfg, "plain_int"))
        self.cfg.plain_int = 1
        self.assertEqual(self.cfg.plain_int, 1)

    def test_deprecated_entry_still_warns_once(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(self.cfg.deprecated, 3)
            self.assertEqual(self.cfg.deprecated, 3)
        self.assertEqual(len(caught), 1)
        self.assertIn("is deprecated and use plain_int", str(caught[0].message))

    def test_mutable_default_not_shared(self):
        self.cfg.mutable_list.append(2)
        self.assertEqual(self.cfg.mutable_list, [1, 2])
        self.assertEqual(self.cfg._config["mutable_list"].default, [1])

    def test_unknown_name_is_attribute_error(self):
        with self.assertRaisesRegex(AttributeError, "no_such_entry does not exist"):
            self.cfg.no_such_entry


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
