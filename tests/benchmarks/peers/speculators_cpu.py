"""speculators 0.9.0's trainer on a CPU, in one process: the whole adaptation, applied in this launcher (run by the
peer's own interpreter, ``<peer env>/bin/python speculators_cpu.py <speculators train flags>``), never by editing
the installed package. Each replacement below names the line of speculators 0.9.0 it answers.

Flags the bench passes with it (not adaptations, speculators' own options): ``--loss-implementation eager`` (the
fused loss imports Triton), ``--draft-attn-impl sdpa`` (FlexAttention has no CPU backward), ``--num-workers 0``.
``METRICS_JSONL`` names the file the training records (speculators' metric dicts) are appended to."""

from __future__ import annotations

import json
import logging
import os
import sys

os.environ.pop("LOCAL_RANK", None)  # train/distributed.py: no LOCAL_RANK -> one process, no NCCL process group

import torch  # noqa: E402

# train/trainer.py (its step timer and the first step): torch.accelerator.synchronize() has no device to wait for
torch.accelerator.synchronize = lambda *args, **kwargs: None

import speculators.train.checkpointer as checkpointer  # noqa: E402
import speculators.train.cli as cli  # noqa: E402
import speculators.train.trainer as trainer  # noqa: E402
from speculators.train.config import TrainConfig  # noqa: E402

# train/trainer.py: the model, batches and optimizer state go .to(get_local_rank()), an int meaning cuda:<rank>
trainer.get_local_rank = lambda: torch.device("cpu")
# train/checkpointer.py: a checkpoint is loaded onto get_current_device(), "cuda:0" without a process group
checkpointer.get_current_device = lambda: "cpu"

_init = trainer.Trainer.__init__


def _cpu_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.device_type = "cpu"  # train/trainer.py: autocast(device_type="cuda") is "cpu" here


trainer.Trainer.__init__ = _cpu_init


class _JsonLines(logging.Handler):
    """speculators.metrics records (dicts: train/val metrics, profile with tokens_per_s) as JSON lines."""

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict) and not getattr(record, "hparams", False):
            with open(os.environ.get("METRICS_JSONL", "metrics.jsonl"), "a") as fh:
                fh.write(json.dumps(record.msg, default=str) + "\n")


_setup = cli.setup_metric_logger


def _setup_with_jsonl(*args, **kwargs):
    _setup(*args, **kwargs)  # it resets the handlers (dictConfig), so add ours after it
    logging.getLogger("speculators.metrics").addHandler(_JsonLines())


cli.setup_metric_logger = _setup_with_jsonl

if __name__ == "__main__":
    cli.main(TrainConfig.resolve(sys.argv[1:]))
