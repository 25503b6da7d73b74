"""Every verification mode of the rejection sampler as a ``RejectionSamplerConfig`` (shared by the tests)."""

from __future__ import annotations

from spec_backend.config.rejection import RejectionSamplerConfig as Config

#: mode_name -> the config that selects it (method "standard")
CONFIG_MODES = {
    "standard": Config(),
    "block-lossless": Config(enable_block_verify=True),
    "block-cumulative": Config(enable_block_verify=True, block_verify_mode="cumulative"),
    "entropy": Config(enable_entropy_verify=True),
    "block-cumulative+entropy": Config(
        enable_block_verify=True, block_verify_mode="cumulative", enable_entropy_verify=True
    ),
    "block-lossless+entropy": Config(enable_block_verify=True, enable_entropy_verify=True),
}
