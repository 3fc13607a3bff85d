"""Statistical check that speculative sampling leaves the target's output distribution unchanged.

From each fixed prompt we draw ``num_samples`` continuations of ``num_positions`` tokens twice: with
the speculative decode loop under test (``generate`` with a proposer, sequentially, batch 1) and with
plain sampling from the target (batched, no cache, no draft: an independent reference). For every
prompt we then test, for each generated position, the marginal distribution of the token there, and
the joint distribution of the whole prefix of ``num_positions`` tokens (answers that ended early get
an "ended" category).

Test (stated): Pearson's chi-square test of homogeneity on the 2 x K contingency table
(speculative vs plain counts over K categories), categories whose expected count is below
``min_expected`` (5) merged into one "other" category, K - 1 degrees of freedom. With m tests in all,
each p-value is Bonferroni-adjusted (min(1, m p)); the check FAILS if any adjusted p-value is below
``threshold`` (default 1e-3), i.e. the family-wise false-alarm rate of a correct sampler is at most
1e-3. Everything is seeded, so a given configuration always gives the same verdict.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, Verifier, generate
from draftsmith.inference.core.proposer import acceptance_rule
from draftsmith.inference.core.sampling import SamplingParams, process_logits

ENDED = -1  # category of a position after the answer ended (EOS)
TEST_NAME = (
    "Pearson chi-square test of homogeneity, speculative vs plain sampling, 2xK table per prompt and "
    "position (plus the joint prefix), categories with expected count < {min_expected} merged, "
    "Bonferroni-adjusted over {m} tests, fail if any adjusted p < {threshold:g}"
)


@dataclass
class HomogeneityTest:
    prompt: int  # index into the prompts
    position: str  # "1", "2", ... (1-based generated token) or "joint"
    statistic: float
    dof: int
    p_value: float
    p_adjusted: float = 1.0
    categories: int = 0  # after merging
    total_variation: float = 0.0  # between the two empirical distributions (before merging)


@dataclass
class DistributionCheck:
    tests: list[HomogeneityTest]
    threshold: float
    num_samples: int
    num_positions: int
    sampling: dict
    method: str
    test: str
    verifier: str = "default"
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(t.p_adjusted >= self.threshold for t in self.tests)

    @property
    def min_p_adjusted(self) -> float:
        return min((t.p_adjusted for t in self.tests), default=1.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["passed"] = self.passed
        d["min_p_adjusted"] = self.min_p_adjusted
        return d

    def summary(self) -> str:
        worst = min(self.tests, key=lambda t: t.p_adjusted) if self.tests else None
        verdict = "PASS" if self.passed else "FAIL"
        where = f" (worst: prompt {worst.prompt}, position {worst.position}, chi2 {worst.statistic:.1f} on {worst.dof} dof)" if worst else ""
        return (
            f"distribution check {verdict}: {len(self.tests)} tests, min Bonferroni-adjusted p = "
            f"{self.min_p_adjusted:.3g} vs threshold {self.threshold:g}{where}; {self.num_samples} samples per "
            f"prompt and sampler"
        )


# ----------------------------------------------------------------------------------------------- the test


def merge_rare(
    table: list[list[int]],  # [2][K] counts
    min_expected: float = 5.0,
) -> list[list[int]]:  # [2][K'] with every expected count >= min_expected (when possible)
    """Merge the rarest categories into one until every expected count reaches ``min_expected``."""
    cols = sorted(zip(*table), key=lambda c: sum(c), reverse=True)  # most frequent first
    rows_total = [sum(r) for r in table]
    n = sum(rows_total)
    if n == 0:
        return [[], []]

    def ok(col) -> bool:
        return min(rows_total) * sum(col) / n >= min_expected

    kept = [list(c) for c in cols if ok(c)]
    rest = [c for c in cols if not ok(c)]
    if rest:
        other = [sum(c[0] for c in rest), sum(c[1] for c in rest)]
        if ok(other) or not kept:
            kept.append(other)
        else:  # fold the small remainder into the smallest kept category
            kept[-1] = [kept[-1][0] + other[0], kept[-1][1] + other[1]]
    return [[c[0] for c in kept], [c[1] for c in kept]]


def chi_square_homogeneity(table: list[list[int]]) -> tuple[float, int, float]:
    """(statistic, dof, p-value) of Pearson's chi-square test on a 2xK table (no continuity correction)."""
    from scipy.stats import chi2

    k = len(table[0])
    if k < 2:
        return 0.0, 0, 1.0
    rows = [sum(r) for r in table]
    cols = [table[0][j] + table[1][j] for j in range(k)]
    n = sum(rows)
    stat = 0.0
    for i in range(2):
        for j in range(k):
            e = rows[i] * cols[j] / n
            if e > 0:
                stat += (table[i][j] - e) ** 2 / e
    dof = k - 1
    return stat, dof, float(chi2.sf(stat, dof))


def compare_samples(
    spec: Sequence[Hashable],
    plain: Sequence[Hashable],
    min_expected: float = 5.0,
) -> tuple[float, int, float, int, float]:
    """(statistic, dof, p-value, categories after merging, total variation) of two samples."""
    a, b = Counter(spec), Counter(plain)
    keys = sorted(set(a) | set(b), key=repr)
    table = merge_rare([[a[k] for k in keys], [b[k] for k in keys]], min_expected)
    stat, dof, p = chi_square_homogeneity(table)
    tv = 0.5 * sum(abs(a[k] / len(spec) - b[k] / len(plain)) for k in keys)
    return stat, dof, p, len(table[0]), tv


# ----------------------------------------------------------------------------------------------- sampling


def _pad(ids: list[int], n: int) -> tuple[int, ...]:
    return tuple(ids[:n]) + (ENDED,) * max(0, n - len(ids))


def speculative_samples(
    target: ModelAdapter,
    prompt_ids: torch.Tensor,  # [L]
    proposer,
    sampling: SamplingParams,
    num_samples: int,
    num_positions: int,
    generator: torch.Generator,
    eos_token_ids: tuple[int, ...] = (),
    verifier: Verifier | None = None,
    progress=None,
) -> list[tuple[int, ...]]:
    """``num_samples`` continuations through the decode loop under test (one ``generate`` each)."""
    config = GenerationConfig(max_new_tokens=num_positions, sampling=sampling, eos_token_ids=eos_token_ids)
    out = []
    for _ in range(num_samples):
        res = generate(target, prompt_ids, config, proposer, generator=generator, verifier=verifier)
        out.append(_pad(res.output_ids, num_positions))
        if progress is not None:
            progress.update(1)
    return out


@torch.inference_mode()
def plain_samples(
    model,
    prompt_ids: torch.Tensor,  # [L]
    sampling: SamplingParams,
    num_samples: int,
    num_positions: int,
    generator: torch.Generator,
    eos_token_ids: tuple[int, ...] = (),
    batch_size: int = 512,
) -> list[tuple[int, ...]]:
    """Plain ancestral sampling from the Hugging Face model itself (full forwards, no cache, no
    draft), with the same logit processing."""
    out: list[tuple[int, ...]] = []
    device = next(model.parameters()).device
    for start in range(0, num_samples, batch_size):
        b = min(batch_size, num_samples - start)
        ids = prompt_ids.to(device)[None].repeat(b, 1)  # [b, L]
        ended = torch.zeros(b, dtype=torch.bool, device=device)
        picked = []
        for _ in range(num_positions):
            logits = model(input_ids=ids).logits[:, -1].float()  # [b, V]
            probs = process_logits(logits, sampling)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # [b]
            picked.append(torch.where(ended, torch.full_like(tok, ENDED), tok))
            if eos_token_ids:
                ended |= torch.isin(tok, torch.tensor(eos_token_ids, device=device))
            ids = torch.cat([ids, tok[:, None]], dim=1)
        rows = torch.stack(picked, dim=1).tolist()  # [b, P]
        out.extend(tuple(r) for r in rows)
    return out


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def check_distribution(
    target_model,
    proposer_factory: Callable[[], object],
    prompts: Sequence[torch.Tensor | Sequence[int]],
    sampling: SamplingParams,
    num_samples: int = 1000,
    num_positions: int = 3,
    seed: int = 0,
    threshold: float = 1e-3,
    min_expected: float = 5.0,
    verifier: Verifier | None = None,
    eos_token_ids: tuple[int, ...] = (),
    progress: bool = False,
) -> DistributionCheck:
    """Compare speculative and plain sampling on ``prompts`` (see the module docstring).

    ``verifier`` replaces the acceptance rule (e.g. the broken
    :func:`~draftsmith.inference.core.verify.verify_accept_all`, which must fail)."""
    if sampling.greedy:
        raise ConfigError("the distribution check needs sampling: use a temperature > 0 (e.g. --temperature 1.0)")
    if num_samples < 20 or num_positions < 1 or not prompts:
        raise ConfigError("the distribution check needs >= 20 samples, >= 1 position and at least one prompt")
    if not 0 < threshold < 1:
        raise ConfigError(f"threshold must be in (0, 1), got {threshold}")
    from tqdm.auto import tqdm

    target = ModelAdapter(target_model)
    proposer = proposer_factory()
    tests: list[HomogeneityTest] = []
    bar = tqdm(total=num_samples * len(prompts), desc="distribution check", disable=not progress, unit="sample")
    try:
        for pi, prompt in enumerate(prompts):
            prompt = torch.as_tensor(prompt, dtype=torch.long).reshape(-1)
            gen = _generator(target.device, seed + 7919 * pi)
            spec = speculative_samples(
                target, prompt, proposer, sampling, num_samples, num_positions, gen, eos_token_ids, verifier, bar
            )
            plain = plain_samples(
                target_model, prompt, sampling, num_samples, num_positions, _generator(target.device, seed + 7919 * pi + 1),
                eos_token_ids,
            )
            columns = [(str(j + 1), [s[j] for s in spec], [s[j] for s in plain]) for j in range(num_positions)]
            if num_positions > 1:
                columns.append(("joint", spec, plain))
            for name, a, b in columns:
                stat, dof, p, k, tv = compare_samples(a, b, min_expected)
                tests.append(HomogeneityTest(pi, name, stat, dof, p, categories=k, total_variation=tv))
    finally:
        bar.close()
    m = len(tests)
    for t in tests:
        t.p_adjusted = min(1.0, t.p_value * m)
    notes = []
    powerless = sum(1 for t in tests if t.dof == 0)
    if powerless:
        notes.append(
            f"{powerless} of {m} tests had a single category after merging (all samples on one token): they cannot "
            "detect anything; use more samples or prompts with less certain continuations"
        )
    return DistributionCheck(
        notes=notes,
        tests=tests,
        threshold=threshold,
        num_samples=num_samples,
        num_positions=num_positions,
        sampling={"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p},
        method=getattr(proposer, "name", "ar") if proposer is not None else "ar",
        test=TEST_NAME.format(min_expected=min_expected, m=m, threshold=threshold),
        verifier=_rule_name(acceptance_rule(proposer, verifier)),
    )


def _rule_name(rule) -> str:
    """The acceptance rule's name: ``default`` (exact speculative sampling) unless one replaces it."""
    return "default" if rule is None else getattr(rule, "__name__", "custom")
