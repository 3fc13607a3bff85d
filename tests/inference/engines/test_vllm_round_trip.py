"""The round trip through vLLM itself (`make test-engine`; deselected by default, skipped without the environment):
an export loads in the engine, drafts the tokens draftsmith's loop drafts, and changes no answer.

- prompt lookup as vLLM's ngram on the tiny zoo: every answer identical to both ARs;
- an EAGLE-3 head on a 4-layer target (the layer ids vLLM would otherwise guess wrong), untrained but perturbed,
  in the eagle3 layout and in speculators' layout: it loads and runs, answers identical, and vLLM's acceptance by
  position within 0.03 of draftsmith's;
- a P-EAGLE head likewise, served with vLLM's parallel drafting, and an EAGLE-3.1 head (fc norms, normed feedback);
- a DFlash draft trained briefly, served as vLLM's dflash.
"""

from __future__ import annotations

import json

import pytest

from draftsmith.common.errors import EngineError
from draftsmith.inference.engines.environment import engine_python
from draftsmith.launch.cli import main

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def vllm_python():
    try:
        return str(engine_python())
    except EngineError as err:
        pytest.skip(str(err))


def _eval(*args, out):
    assert main(["eval", "--engine", "both", *args, "--limit", "12", "--max-new-tokens", "32", "--warmup", "0",
                 "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_prompt_lookup_runs_as_ngram_and_changes_no_answer(vllm_python, tmp_path):
    report = _eval("--method", "pld", "--engine-python", vllm_python, out=tmp_path / "pld" / "report.json")
    assert report["engine_method"] == "ngram"
    assert report["summary"]["identical_to_engine_ar"] == 1.0 and report["summary"]["drafts"] > 0
    assert report["differences"]["speculative_vs_draftsmith_ar"]["differs"] == 0  # near ties only, if any


@pytest.mark.parametrize("layout", ["auto", "speculators", "peagle", "eagle31"])
def test_an_eagle3_head_of_a_shallow_target_loads_and_drafts_as_in_draftsmith(layout, vllm_python, tmp_path):
    import torch

    from draftsmith.common.models import target_identity
    from draftsmith.data.zoo import load_zoo
    from draftsmith.inference.artefacts.manifest import write_artefact
    from draftsmith.inference.drafters.eagle import Eagle3Head, draft_vocab
    from draftsmith.trainers.zoo import ensure_zoo

    zoo = ensure_zoo("tiny")
    tokenizer, target, _ = load_zoo("tiny")
    counts = torch.arange(target.config.vocab_size).flip(0).float()
    if layout == "peagle":  # the block drafted in one forward (vLLM: eagle3 with parallel_drafting)
        from draftsmith.inference.drafters.peagle import PEagleHead

        head = PEagleHead.for_target(target, *draft_vocab(counts, 1024), None, mask_token_id=0)
    else:  # eagle31: EAGLE-3.1's fc norms and normed feedback, which vLLM's EAGLE-3 model reads from the config
        v31 = {"fc_norm": True, "norm_output": True} if layout == "eagle31" else {}
        head = Eagle3Head.for_target(target, *draft_vocab(counts, 1024), None, **v31)
    torch.manual_seed(0)
    for p in head.parameters():
        p.data.add_(torch.randn_like(p) * 0.02)
    artefact = tmp_path / "artefact"
    write_artefact(artefact, "heads", method="eagle", target=target_identity(target, tokenizer, str(zoo / "target")),
                   proposer={"tree": "chain"}, tensors=head.state_dict(), config=head.artefact_config())
    report = _eval("--artefact", str(artefact), "--target", str(zoo / "target"), "--engine-python", vllm_python,
                   "--engine-export", layout if layout in ("auto", "speculators") else "auto",
                   out=tmp_path / "eagle3" / "report.json")
    assert report["engine_method"] == "eagle3" and report["summary"]["identical_to_engine_ar"] == 1.0
    assert report["parity"]["max_abs_difference"] <= 0.03


def test_a_dflash_draft_loads_and_drafts_as_in_draftsmith(vllm_python, tmp_path):
    """A DFlash draft trained briefly on the tiny zoo (so that it accepts something), served as vLLM's ``dflash``:
    answers identical, acceptance by position within 0.03 of draftsmith's."""
    from draftsmith.launch.recipe import run_recipe
    from draftsmith.trainers.zoo import ensure_zoo

    zoo = ensure_zoo("tiny")
    result = run_recipe("dflash", ["--output_dir", str(tmp_path / "run"), "max_steps=30", "eval_strategy=no",
                                   "save_strategy=no", "evaluate=false", "block_size=5", "draft_layers=1",
                                   "disable_tqdm=true"])
    report = _eval("--artefact", str(result.artefact), "--target", str(zoo / "target"), "--engine-python", vllm_python,
                   out=tmp_path / "dflash" / "report.json")
    assert report["engine_method"] == "dflash" and report["summary"]["identical_to_engine_ar"] == 1.0
    assert report["parity"]["max_abs_difference"] <= 0.03
