"""The live policy shared by the in-process sampler, trainer and evaluator.

One model object, one tokenizer, one version counter. The sampler generates from the very
weights the trainer updates, so in-process weight sync costs nothing, and every sample is stamped
with the version it was drawn under. For LoRA the reference policy is the same model with the
adapter disabled: no second copy in memory. For full fine-tuning a frozen snapshot is kept,
on CPU if asked.

A backend module: imports torch, transformers and peft.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from rlvr.backends.model.io import load_model, load_tokenizer
from rlvr.seeding import derive_seed

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class LoraSpec:
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    targets: Sequence[str] = DEFAULT_TARGETS


class Policy:
    """A causal LM (LoRA-wrapped when ``lora.rank > 0``) plus its tokenizer and version."""

    def __init__(self, base: str, *, lora: LoraSpec | None = LoraSpec(), dtype: str = "float32",
                 device: str = "cpu", reference_on_cpu: bool = False, need_reference: bool = True,
                 seed: int = 0):
        self.base, self.device, self.lora = base, device, lora
        self.tokenizer = load_tokenizer(base)
        model = load_model(base, dtype=dtype, device=device)
        self.reference = None
        if lora is not None and lora.rank > 0:
            config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft takes a float
                                lora_dropout=lora.dropout,
                                target_modules=list(lora.targets), bias="none", task_type="CAUSAL_LM")
            # The adapter's random init is drawn from (seed, "lora-init"), not the global stream.
            with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
                # peft asks transformers by a name transformers 5 deprecates: a warning per run, not ours to fix
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
                torch.manual_seed(derive_seed(seed, "lora-init"))
                model = get_peft_model(model, config)
        elif need_reference:
            self.reference = copy.deepcopy(model).to("cpu" if reference_on_cpu else device).eval()
            self.reference.requires_grad_(False)
        self.model = model
        self.version = 0

    @property
    def is_lora(self) -> bool:
        return isinstance(self.model, PeftModel)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextmanager
    def as_reference(self) -> Iterator[torch.nn.Module]:
        """The frozen reference policy: the base with the adapter disabled, or the snapshot."""
        if self.is_lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            assert self.reference is not None, "full fine-tune policy built without a reference"
            yield self.reference

    @property
    def eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        ids = eos if isinstance(eos, (list, tuple)) else [eos]
        return {i for i in ids if i is not None} | {self.tokenizer.eos_token_id}
