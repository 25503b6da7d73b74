"""Every verification mode of the rejection sampler as a ``RejectionSamplerConfig`` (shared by the tests).

The modes come from the one registry of rules (``spec_backend.verify_rules``); ``test_verify_rules``
checks the registry against hard-coded expectations, so these tests do not trust it blindly.
"""

from __future__ import annotations

from spec_backend.config.rejection import RejectionSamplerConfig as Config
from spec_backend.verify_rules import REGISTRY

#: mode_name -> the config that selects it (method "standard")
CONFIG_MODES = {rule.name: Config(**rule.config_flags()) for rule in REGISTRY if rule.method == "standard"}
