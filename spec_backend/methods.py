"""The table of drafting methods: every name, its family, its hidden states and where its builder lives.

This is the ground floor of the method vocabulary: it imports nothing of the project and no torch, so
the configuration (``spec_backend.config.methods`` derives its names and literals from ``METHODS``), the
vLLM hook and the drafter registry (``spec_backend.proposers.registry``, which imports ``build``) all read
it without loading a drafter.

Glossary: *model-free* — drafts from the token history alone (no draft weights); *family* — how the
drafter runs: ``host`` (a host algorithm behind ``HostDrafter``; ``build`` makes its ``Proposer`` from
the config and device), ``draft_model`` (a separate causal LM), ``eagle`` (a head on the target's hidden
states), ``head`` (Medusa / MLPSpeculator heads on the last hidden state), ``record`` (no drafts: records
hidden states); the builders of every family but ``host`` take a ``DrafterContext``. *alias* — another
accepted spelling of a method name (``ALIASES``, the one place they are resolved).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Family = Literal["host", "draft_model", "eagle", "head", "record"]

_P = "spec_backend.proposers."


@dataclass(frozen=True)
class MethodSpec:
    """One drafting method (see the module docstring).

    ``build``: ``"module:function"`` of its builder, imported when a drafter is built (None: the method is
    known and validated, as vLLM does, but has no drafter in this package).
    """

    name: str
    family: Family
    aux_hidden_states: bool = False  # reads auxiliary target layers (changes the target's forward)
    build: str | None = None

    @property
    def model_free(self) -> bool:
        """No draft weights: the ``model`` field names the method itself."""
        return self.family in ("host", "record")

    @property
    def implemented(self) -> bool:
        return self.build is not None


#: Every method of vLLM's ``SpeculativeConfig.method``, in the order the docs and errors list them.
METHODS: Final[dict[str, MethodSpec]] = {
    spec.name: spec
    for spec in (
        MethodSpec("ngram", "host", build=_P + "ngram:build_ngram_proposer"),
        MethodSpec("ngram_gpu", "host", build=_P + "ngram_gpu:build_ngram_gpu_proposer"),
        MethodSpec("suffix", "host", build=_P + "suffix:build_suffix_proposer"),
        MethodSpec("draft_model", "draft_model", build=_P + "draft_model:build_draft_model_drafter"),
        MethodSpec("medusa", "head", build=_P + "medusa:build_medusa_drafter"),
        MethodSpec("mlp_speculator", "head", build=_P + "mlp_speculator:build_mlp_speculator_drafter"),
        MethodSpec("eagle", "eagle", build=_P + "eagle_build:build_eagle_drafter"),
        MethodSpec("eagle3", "eagle", aux_hidden_states=True, build=_P + "eagle_build:build_eagle3_drafter"),
        MethodSpec("dflash", "eagle", aux_hidden_states=True, build=_P + "dflash:build_dflash_drafter"),
        MethodSpec("dspark", "eagle", aux_hidden_states=True, build=_P + "dspark:build_dspark_drafter"),
        MethodSpec("mtp", "eagle", build=_P + "eagle_build:build_mtp_drafter"),
        MethodSpec(
            "extract_hidden_states",
            "record",
            aux_hidden_states=True,
            build=_P + "extract_hidden_states:build_extractor",
        ),
    )
}

#: ``model_type`` of MTP draft configs. Each is also accepted as a method name, deprecated: it means ``mtp``.
MTP_MODEL_TYPES: Final[tuple[str, ...]] = (
    "deepseek_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "hy_v3_mtp",
)

#: Accepted spelling -> method: vLLM's ``[ngram]``, and the deprecated per-architecture MTP names.
ALIASES: Final[dict[str, str]] = {"[ngram]": "ngram", **{t: "mtp" for t in MTP_MODEL_TYPES if t != "mtp"}}

#: Aliases that log a deprecation warning when used.
DEPRECATED_ALIASES: Final[frozenset[str]] = frozenset(t for t in MTP_MODEL_TYPES if t != "mtp")


def accepted_names() -> tuple[str, ...]:
    """Every accepted value of ``method``: each method followed by its aliases, the MTP names last."""
    names: list[str] = []
    for name in METHODS:
        if name != "mtp":  # listed among the per-architecture MTP names
            names += [name, *(alias for alias, target in ALIASES.items() if target == name)]
    return (*names, *MTP_MODEL_TYPES)


__all__ = [
    "ALIASES",
    "DEPRECATED_ALIASES",
    "METHODS",
    "MTP_MODEL_TYPES",
    "Family",
    "MethodSpec",
    "accepted_names",
]
