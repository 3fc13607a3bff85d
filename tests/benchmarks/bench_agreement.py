"""Teacher-forced greedy agreement: how often a draft's argmax is the target's next token along the target's own
answers in a greedy `draftsmith eval` report, overall, over each answer's first 8 tokens and per category.

    python tests/benchmarks/bench_agreement.py --draft runs/my-draft/artefact/draft \\
        --report runs/broad/report.json --json runs/broad/agreement.json

Every answer is the target's greedy output (a lossless greedy run writes exactly that), so the draft, fed the prompt
and the answer's tokens before position t, agrees at t when its argmax over its own vocabulary (``config.draft_vocab``
when it has one) is the answer's token t. This is the first-token acceptance of greedy verification with the
proposer taken out: a draft that agrees 0.3 here accepts about 0.3 of its first drafted tokens in decoding, so a
per-category gap between the two points at the proposer, and agreement that is low on a category points at the data.
Prompts are rebuilt from the report's question file through the tokenizer's chat template and checked against the
report's prompt lengths.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

FIRST = 8  # the leading answer tokens reported on their own: where a chain's first drafts are judged


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draft", required=True, help="draft model directory (an artefact's draft/, a zoo draft)")
    p.add_argument("--report", required=True, help="report.json of a greedy `draftsmith eval` run of the target")
    p.add_argument("--tokenizer", default=None, help="the target's tokenizer (default: the report's target)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the result here")
    return p.parse_args(argv)


@torch.no_grad()
def agreement(draft, prompt: list[int], answer: list[int], vocab: torch.Tensor | None) -> torch.Tensor:  # [n] bool
    """Whether the draft's argmax (over ``vocab`` rows, all when None) after ``prompt + answer[:t]`` is ``answer[t]``."""
    from draftsmith.trainers.logits import draft_argmax

    logits = draft(torch.tensor([prompt + answer])).logits[0, len(prompt) - 1: -1]  # [n, V]
    return draft_argmax(logits, vocab) == torch.tensor(answer)


def mean_of(matches: list[torch.Tensor]) -> float:
    """The fraction of True over every position of ``matches`` (NaN when there is none)."""
    every = torch.cat(matches) if matches else torch.zeros(0, dtype=torch.bool)
    return float(every.float().mean()) if every.numel() else float("nan")


def summarise(matches: dict[str, list[torch.Tensor]]) -> dict:
    """``{category: [per-answer bool tensors]}`` -> overall, first-``FIRST`` and per-category agreement."""
    every = [m for ms in matches.values() for m in ms]
    return {"agreement": mean_of(every), f"agreement_first_{FIRST}": mean_of([m[:FIRST] for m in every]),
            "tokens": int(sum(m.numel() for m in every)),
            "categories": {c: round(mean_of(ms), 4) for c, ms in matches.items()}}


def report_agreement(draft, tokenizer, report: dict) -> dict:
    """:func:`summarise` of the draft's agreement along every answer of ``report``."""
    from draftsmith.inference.evaluation.questions import read_questions
    from draftsmith.inference.evaluation.runs import chat_prompt_ids
    from draftsmith.inference.proposers.draft_model import draft_vocab_of

    if report.get("temperature", 0.0) != 0.0:
        raise SystemExit(f"error: the report was sampled (temperature {report['temperature']}): use a greedy report")
    questions = {q.question_id: q for q in read_questions(report["question_file"])}
    vocab, matches = draft_vocab_of(draft), {}
    for row in report["questions"]:
        prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": questions[row["question_id"]].turns[0]}])
        if len(prompt) != row["prompt_tokens"][0]:  # first turns only
            raise SystemExit(f"error: question {row['question_id']}'s prompt is {len(prompt)} tokens here and "
                             f"{row['prompt_tokens'][0]} in the report: pass the target's --tokenizer")
        matches.setdefault(row["category"], []).append(agreement(draft, prompt, list(row["output_ids"][0]), vocab))
    return summarise(matches)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from draftsmith.common.models import load_model, load_tokenizer

    torch.set_num_threads(args.threads)
    report = json.loads(Path(args.report).read_text())
    tokenizer = load_tokenizer(args.tokenizer or report["target"])
    draft = load_model(args.draft, "float32", what="draft").eval()
    result = {"draft": args.draft, "report": args.report, **report_agreement(draft, tokenizer, report)}
    print(f"teacher-forced agreement {result['agreement']:.3f} (first {FIRST} tokens "
          f"{result[f'agreement_first_{FIRST}']:.3f}) over {result['tokens']} answer tokens")
    for category, value in result["categories"].items():
        print(f"  {category:14s} {value:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
