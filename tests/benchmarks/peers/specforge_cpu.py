"""SpecForge 0.2.0's ``specforge`` command on a CPU, in one process: the whole adaptation, applied in this launcher
(run by the peer's own interpreter, ``<peer env>/bin/python specforge_cpu.py train --config run.yaml`` or
``... export ...``), never by editing the installed package. Each step names the code of SpecForge it answers.

Settings the bench writes into the run config instead (SpecForge's own options, not adaptations):
``attention_backend: sdpa`` (flash-attn is optional), ``fsdp_sharding: NO_SHARD`` (DDP without device ids on gloo,
where FSDP1 needs an accelerator), ``lm_head_key: model.embed_tokens.weight`` (a tied-embedding target)."""

from __future__ import annotations

import os
import sys
import types

# modeling/draft/llama3_eagle.py and algorithms/eagle3/model.py decorate with torch.compile, which needs a C++
# toolchain per shape on a CPU: off (the decorators become no-ops)
os.environ.update(TORCHDYNAMO_DISABLE="1", TORCH_COMPILE_DISABLE="1")

import torch  # noqa: E402


class LogSoftmaxLoss:
    """core/loss.py's Triton kernel, in torch: per row, -sum_v target_v * log_softmax(logits)_v, rows whose
    position mask is 0 left at 0, the mean over all B * T rows (its forward, and autograd gives its backward)."""

    @staticmethod
    def apply(logits: torch.Tensor, target_p: torch.Tensor, position_mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = logits.shape  # [B, T, Vd], target_p [B, T, Vd], position_mask [B, T, 1]
        rows = -(target_p.float() * torch.log_softmax(logits.float(), dim=-1)).sum(-1)  # [B, T]
        kept = torch.where(position_mask.reshape(b, t) != 0, rows, torch.zeros_like(rows))
        return kept.sum() / (b * t)


# core/loss.py imports triton at its top; algorithms/eagle3/model.py binds LogSoftmaxLoss from it
_loss = types.ModuleType("specforge.core.loss")
_loss.LogSoftmaxLoss = LogSoftmaxLoss
sys.modules["specforge.core.loss"] = _loss

from specforge.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
