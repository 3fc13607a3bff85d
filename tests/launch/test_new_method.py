"""The proof that a new method plugs in: a toy method registered for one test — a config, a trainer with a
trivial loss, a head module, a proposer that drafts a fixed token, an evaluation option (``--toy-token``) and an
export format (``toy-json``) — runs through `draftsmith train` (the recipe runner), the artefact, `draftsmith eval`
and `draftsmith export` without any other file knowing about it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from draftsmith.common.eval_options import DRAFT_LENGTH, EvalOption
from draftsmith.common.registry import MethodSpec, registered
from draftsmith.inference.core.verify import Draft
from draftsmith.launch.cli import main
from draftsmith.trainers.base import FrozenTargetTrainer

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ToyConfig:
    token: int = field(default=7, metadata={"help": "the token the proposer drafts"})
    draft_length: int = field(default=2, metadata={"help": "tokens per draft"})
    learning_rate: float = field(default=0.5, metadata={"help": "collides with TrainingArguments.learning_rate"})

    def proposer_settings(self) -> dict:
        return {"token": self.token, "draft_length": self.draft_length}



class ToyHead(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.ones(vocab))

    def artefact_config(self) -> dict:
        return {"vocab": self.bias.numel()}


class ToyTrainer(FrozenTargetTrainer):
    config_class = ToyConfig

    def loss_sum(self, model, inputs):  # L = sum_t ||b||^2 / N: the mean is ||b||^2, pulled to 0
        return model.bias.pow(2).sum() * self.count_loss_tokens(inputs), None


class FixedTokenProposer:
    name = "toy"
    lossless = True
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, token: int, length: int) -> None:
        self.token, self.length = token, length

    def reset(self, prompt_ids):
        pass

    def propose(self, tokens, max_tokens, sampling, generator=None):
        return Draft.chain([self.token] * min(self.length, max_tokens)) if max_tokens > 0 else Draft.empty()

    def observe(self, feedback):
        pass

    def report_section(self):
        return "toy", {"token": self.token, "length": self.length}


def build_proposer(ctx):
    heads = load_file(str(ctx.artefact_dir / "heads.safetensors"))  # the artefact's own weights load
    assert set(heads) == {"bias"}
    return FixedTokenProposer(int(ctx.option("token")), int(ctx.option("draft_length")))


def export_json(artefact, manifest, fmt, out, target_model):
    """The toy's export: its bias as a JSON list."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"architectures": ["ToyDrafter"], "token": manifest["proposer"]["token"]}))
    from safetensors.torch import save_file

    save_file(load_file(str(Path(artefact) / "heads.safetensors")), str(out / "model.safetensors"))
    return out


TOY = MethodSpec(name="toy", summary="a fixed-token drafter (test)", proposer=build_proposer, artefact_kind="heads",
                 config=ToyConfig, trainer=ToyTrainer, trainable=lambda models, cfg: ToyHead(128),
                 eval_options=(EvalOption("token", int, 7, flag="--toy-token", metavar="T", help="toy: the token drafted"),
                               DRAFT_LENGTH.default_to(2)),
                 export_formats={"toy-json": export_json})


def test_a_registered_method_trains_saves_and_evaluates(tiny_pair, tmp_path, capsys):
    out = tmp_path / "toy"
    argv = ["--target", str(tiny_pair["target"]), "--dataset", str(tiny_pair["dataset"]), "--output_dir", str(out),
            "max_steps=3", "per_device_train_batch_size=4", "max_length=64", "eval_examples=8", "logging_steps=1",
            "eval_strategy=no", "save_strategy=no", "report_to=none", "disable_tqdm=true", "optim=sgd",
            "learning_rate=0.1", "method.learning_rate=0.25", "token=9"]
    with registered(TOY):
        assert main(["train", "toy", *argv]) == 0  # `draftsmith train toy`: the recipe runner
        manifest = json.loads((out / "artefact" / "manifest.json").read_text())
        assert manifest["method"] == "toy" and manifest["kind"] == "heads"
        assert manifest["proposer"] == {"token": 9, "draft_length": 2}
        assert set(manifest["weights"]) == {"heads.safetensors"}
        assert json.loads((out / "artefact" / "heads_config.json").read_text()) == {"vocab": 128}
        config = manifest["training"]["config"]
        assert config["toy"]["learning_rate"] == 0.25 and config["training_args"]["learning_rate"] == 0.1
        assert manifest["training"]["steps"] == 3 and manifest["training"]["tokens"] > 0
        bias = load_file(str(out / "artefact" / "heads.safetensors"))["bias"]
        assert float(bias.abs().max()) < 1.0  # the trivial loss moved it toward 0

        qfile = tmp_path / "q.jsonl"
        qfile.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["What is 2 plus 2?"]}) + "\n")
        report = tmp_path / "eval" / "report.json"
        assert main(["eval", "--artefact", str(out / "artefact"), "--target", str(tiny_pair["target"]),
                     "--questions", str(qfile), "--max-new-tokens", "8", "--warmup", "0", "--no-progress",
                     "--out", str(report)]) == 0
        summary = json.loads(report.read_text())
        assert summary["method"] == "toy" and summary["summary"]["greedy_identical"] == 1.0
        assert summary["proposer"]["name"] == "toy"
        assert summary["toy"] == {"token": 9, "length": 2}  # the artefact's setting, else the declared default

        # the option the entry declares is a flag of `draftsmith eval`, and wins over the artefact's setting
        assert main(["eval", "--artefact", str(out / "artefact"), "--target", str(tiny_pair["target"]),
                     "--questions", str(qfile), "--max-new-tokens", "8", "--warmup", "0", "--no-progress",
                     "--toy-token", "11", "--draft-length", "3", "--out", str(report)]) == 0
        assert json.loads(report.read_text())["toy"] == {"token": 11, "length": 3}

        # the export format the entry names is one of `draftsmith export`'s
        exported = tmp_path / "exported"
        assert main(["export", "--artefact", str(out / "artefact"), "--format", "toy-json", "--out", str(exported),
                     "--target", str(tiny_pair["target"])]) == 0
        assert json.loads((exported / "config.json").read_text())["token"] == 9
        assert torch.equal(load_file(str(exported / "model.safetensors"))["bias"], bias)
    assert "toy" not in __import__("draftsmith.common.registry", fromlist=["REGISTRY"]).REGISTRY.names()
