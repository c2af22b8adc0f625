"""A base that rarely answers in the lab's format: a short continued pretraining (chapter 10).

    python -m labkit format-base --preset tiny        # -> runs/tiny/format_base/

Why.  "R1-Zero" asks whether RL from a base *creates* a behaviour or *selects* one the base
already shows.  The committed tiny base never answers `{"final_stock": N}` (its pretraining
never shows that key: `labkit.train.corpus`), so GRPO from it sees reward 0 in every group, has no
signal, and can select nothing.  This step makes a base that shows the lab's format *rarely*:
it continues the base's answer phase (`labkit.train.answer_phase`: same document mix, same loss on
the whole answer) at a low learning rate, with a stated share `lab_format_share` of the
documents (2%) in the lab's own prompt (`task.FORMAT_INSTRUCTION`) answered as
`{"final_stock": N}`.  Every problem is fresh: none of the 1,400 (checked per document).

When it stops.  Every `measure_every` updates (and before the first) it measures the share of
valid lab-format answers and of correct ones at temperature 1 on the 200 validation statements
x 4 draws (seeded, the fast sampler), and it stops at the first measurement where that share
reaches `stop_at_valid_share` (5%): the behaviour is then present but rare, which is the set-up
the question needs (absent, RL has nothing to select; common, there is nothing to create).
The model is saved and evaluated on the test statements like every policy (`labkit.eval.evaluate`,
into <folder>/evaluation/format_base/).

Files: `model.safetensors` (digest recorded), `log.json` (loss and measurements),
`manifest.json` (config, counts, the start model's digest, code digests), FINISHED.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..lab.runs import REPO_ROOT, RunFolder, preset_folder, read_json, write_json
from ..lab.runtime import code_digests, deterministic, environment, hashed_seed, seed_everything
from ..task import data
from ..task.problems import FORMAT_INSTRUCTION, solve
from ..config import FormatBaseConfig
from ..models import presets, sampling, scoring
from ..train import answer_phase
from ..train import corpus as corpus_mod
from ..train.schedule import lm_update

MODEL_FILE = "model.safetensors"
POLICY_NAME = "format_base"


def lab_format_document(source: corpus_mod.CorpusGenerator) -> corpus_mod.Document:
    """A chat: a fresh statement, the lab's instruction, the answer as {"final_stock": N}."""
    p = source.problem()
    w = corpus_mod._Writer()
    w.write(corpus_mod.CHAT_USER)
    w.write(source.statement(p), drawn=True)
    w.write("\n" + FORMAT_INSTRUCTION + corpus_mod.CHAT_ASSISTANT + '{"final_stock": ')
    answer_span = w.write(str(solve(p)))
    w.write("}" + corpus_mod.CHAT_END)
    return w.document("lab_format", [p.key], answer_span)


def next_document(source: corpus_mod.CorpusGenerator, cfg: FormatBaseConfig) -> corpus_mod.Document:
    """The lab's format with probability lab_format_share, else the answer phase's mix."""
    if source.rng.random() < cfg.lab_format_share:
        return lab_format_document(source)
    return answer_phase.keyed_document(source) if source.rng.random() < cfg.keyed_share else source.direct()


def measure_seed(problem_id: str, draw: int) -> int:
    """Each measured answer's own seed: SHA-256("format-base/<id>/<draw>"), 62 bits."""
    return hashed_seed(f"format-base/{problem_id}/{draw}")


@torch.no_grad()
def format_share(model, tokenizer, problems: list[dict], draws: int) -> dict:
    """{"valid", "correct", "responses"}: shares of the `draws` temperature-1 answers to each
    problem that are valid lab-format JSON, and that are correct (labkit.task.verifier).  `model` is
    expected in eval mode (no dropout), as everywhere the lab samples; `train` puts it there."""
    items = [(p["id"], scoring.build_prompt_ids(tokenizer, p["statement"]), p["problem"]) for p in problems]
    seeds = [measure_seed(p["id"], d) for p in problems for d in range(draws)]
    groups = sampling.sample_groups(model, tokenizer, items, draws, seeds, sampler="fast")
    verdicts = [v for g in groups for v in g.verdicts]
    return {"valid": sum(v.valid for v in verdicts) / len(verdicts),
            "correct": sum(v.reward for v in verdicts) / len(verdicts), "responses": len(verdicts)}


def validation_problems() -> list[dict]:
    statements = data.open_records("statements", "validation", "learning")
    labels = {r["id"]: r for r in data.open_records("labels", "validation", "learning")}
    return [{**s, **labels[s["id"]]} for s in statements]


def train(model, tokenizer, cfg: FormatBaseConfig, problems: list[dict], progress: bool = True) -> dict:
    """Continue pretraining `model` in place; returns {"log", "documents", "lab_format_documents", ...}."""
    from tqdm import tqdm

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                  weight_decay=cfg.weight_decay)
    forbidden = corpus_mod.dataset_keys()
    stream = corpus_mod.CorpusGenerator(cfg.seed, forbidden)
    # Eval mode while training, as the lab's SFT and GRPO: the tiny architecture's attention dropout
    # (0.1, for chapter 2's "dropout left on" bug) lifts this base's loss on these documents from 0.12
    # to 2.5 and, trained through, took its held-out exact answers from 42% to 28% in 60 updates.
    model.eval()
    log, window, lab_documents, checked = [], [], 0, 0
    log.append({"kind": "measure", "step": 0, **format_share(model, tokenizer, problems, cfg.measure_draws)})
    bar = tqdm(range(cfg.max_steps), desc="format base", disable=not progress, mininterval=5)
    for step in bar:
        documents = [next_document(stream, cfg) for _ in range(cfg.documents_per_step)]
        checked += corpus_mod.check_disjoint(documents, forbidden)  # none of the 1,400 problems
        lab_documents += sum(d.kind == "lab_format" for d in documents)
        batch = answer_phase.answer_batch(tokenizer, documents)
        loss, _ = lm_update(model, optimizer, batch, cfg.lr, cfg.grad_clip)  # constant lr
        window.append(loss)
        done = step + 1
        if done % cfg.log_every == 0:
            log.append({"kind": "train", "step": done, "loss": sum(window) / len(window),
                        "lab_format_documents": lab_documents})
            window = []
        if done % cfg.measure_every == 0 or done == cfg.max_steps:
            row = {"kind": "measure", "step": done, **format_share(model, tokenizer, problems, cfg.measure_draws)}
            log.append(row)
            bar.set_postfix(valid=f"{row['valid']:.3f}")
            if row["valid"] >= cfg.stop_at_valid_share:
                break
    bar.close()
    return {"log": log, "steps": done, "documents": done * cfg.documents_per_step,
            "lab_format_documents": lab_documents, "problems_checked": checked}


def default_run_dir(preset: str) -> Path:
    return preset_folder(preset, "format_base")


def run_format_base(preset: str = "tiny", run_dir: str | Path | None = None, *, cfg: FormatBaseConfig | None = None,
                    evaluate_limit: int | None = None, overwrite: bool = False, progress: bool = True) -> dict:
    """Continue the base's pretraining with the lab's format at a small share, save, measure, evaluate."""
    from ..eval import evaluate

    if preset != "tiny":
        raise ValueError(f"preset {preset!r}: only the tiny base is pretrained by the lab (the qwen base is "
                         "Qwen2.5-0.5B-Instruct, which already follows instructions)")
    cfg = cfg or FormatBaseConfig()
    folder = RunFolder(run_dir or default_run_dir(preset)).open_for_writing(overwrite)
    folder.clear((MODEL_FILE, "log.json", "manifest.json"))
    began = time.perf_counter()
    seed_everything(cfg.seed)
    model, tokenizer = presets.load(preset)  # the committed base, checked against its recorded digest
    start_digest = presets.parameter_digest(model)
    with deterministic("cpu", warn_only=True):
        result = train(model, tokenizer, cfg, validation_problems(), progress)
    presets.save_model(model, folder / MODEL_FILE)
    write_json(folder / "log.json", result["log"])
    measured = [r for r in result["log"] if r["kind"] == "measure"]
    manifest = {
        "step": "format_base", "preset": preset, "config": asdict(cfg),
        "start_model": {"file": str(presets.TINY_BASE_STATE.relative_to(REPO_ROOT)), "parameter_digest": start_digest},
        "final_digest": presets.parameter_digest(model),
        "counts": {k: result[k] for k in ("steps", "documents", "lab_format_documents", "problems_checked")},
        "format_share": {"before": measured[0], "after": measured[-1]},
        "code_sha256": code_digests(), "environment": environment("cpu"),
        "times": {"train_seconds": time.perf_counter() - began},
    }
    for name in (MODEL_FILE, "log.json"):
        folder.register(name)
    manifest["ledger"] = folder.ledger()
    write_json(folder / "manifest.json", manifest)
    folder.mark_finished({"valid_before": measured[0]["valid"], "valid_after": measured[-1]["valid"]})
    evaluate.run_inference(preset, POLICY_NAME, state_file=folder / MODEL_FILE, eval_root=folder / "evaluation",
                           limit=evaluate_limit, overwrite=overwrite)
    return manifest


def read_log(run_dir: str | Path | None = None, preset: str = "tiny") -> list[dict]:
    folder = RunFolder(run_dir or default_run_dir(preset))
    folder.check_file("log.json")
    return read_json(folder / "log.json")
