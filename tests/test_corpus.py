"""The pretraining corpus (free of dataset problems, not in the lab's answer format) and the pretraining loop."""

from __future__ import annotations

import re

import pytest
import torch

from labkit.train import corpus, pretrain
from labkit.task import problems
from labkit.train.answer_phase import AnswerPhaseConfig
from labkit.models.presets import TINY_BASE_DIR, load_state_into, new_tiny_model, parameter_digest
from labkit.lab.runs import RunExistsError, read_json, read_jsonl
from labkit.models.tokenizer import load_tiny_tokenizer


@pytest.fixture(scope="module")
def documents():
    return corpus.generate(3000)


@pytest.fixture(scope="module")
def forbidden():
    return corpus.dataset_keys()


def test_dataset_keys_are_the_1400_problems(forbidden):
    assert len(forbidden) == 1400


def test_the_committed_base_was_trained_on_a_corpus_without_dataset_problems(forbidden):
    """Regenerate exactly the documents the committed base consumed: same digest, no dataset problem."""
    manifest = read_json(TINY_BASE_DIR / "manifest.json")["corpus"]
    docs = corpus.generate(manifest["documents"], seed=manifest["seed"])
    digest = corpus.CorpusDigest()
    for doc in docs:
        digest.update(doc)
    assert digest.hexdigest() == manifest["digest_sha256"]
    assert corpus.check_disjoint(docs, forbidden) == manifest["problems_checked"] > 100_000
    assert manifest["dataset_problems_found"] == 0


def test_a_dataset_problem_in_a_document_is_refused(forbidden):
    record = problems.generate_dataset()[1000]  # validation-0000
    problem = problems.Problem.from_dict(record["problem"])
    swapped = problems.Problem(problem.initial, problem.deliveries[::-1], problem.withdrawals[::-1])
    doc = corpus.Document("direct", "...", [swapped.key])  # a re-ordering is the same problem
    with pytest.raises(ValueError, match=re.escape(f"holds the StockArithmetic-v1 problem {problem.key}")):
        corpus.check_disjoint([corpus.Document("sums", "1 + 1 = 2"), doc], forbidden)


def test_the_generator_skips_forbidden_problems():
    first = corpus.CorpusGenerator(seed=5, forbidden=frozenset()).problem()
    again = corpus.CorpusGenerator(seed=5, forbidden=frozenset({first.key})).problem()
    assert again.key != first.key


def test_documents_never_show_the_lab_format(documents):
    for doc in documents:
        assert "final_stock" not in doc.text and problems.FORMAT_INSTRUCTION not in doc.text
        assert doc.text.endswith("<|endoftext|>")
    kinds = {doc.kind for doc in documents}
    assert kinds == {"direct", "worked", "equations", "sums"}


def test_every_stated_answer_is_the_solvers(documents):
    for doc in documents:
        if doc.kind == "direct":
            answer = doc.text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
            (key,) = doc.keys
            problem = problems.Problem(key[0], key[1], key[2])  # sums do not depend on the order
            assert re.findall(r"\d+", answer) == [str(problems.solve(problem))], doc.text
        if doc.kind in ("equations", "sums"):
            for line in doc.text.removesuffix("<|endoftext|>").split("\n"):
                left, right = line.split(" = ")
                first, *rest = left.split(" ")
                total = int(first)
                for sign, value in zip(rest[::2], rest[1::2]):
                    total += int(value) if sign == "+" else -int(value)
                assert total == int(right) >= 0, line


def test_a_chat_document_starts_with_the_labs_prompt_tokens(documents):
    tok = load_tiny_tokenizer()
    doc = next(d for d in documents if d.kind == "direct")
    user = doc.text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
    prompt = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    ids = tok(doc.text, add_special_tokens=False)["input_ids"]
    assert ids[: len(prompt)] == prompt


def test_the_corpus_is_deterministic():
    assert [d.text for d in corpus.generate(50, seed=9)] == [d.text for d in corpus.generate(50, seed=9)]
    assert [d.text for d in corpus.generate(50, seed=9)] != [d.text for d in corpus.generate(50, seed=10)]


# -- pretraining pieces --------------------------------------------------------------


def test_pack_rows_first_fit_keeps_documents_whole():
    lengths = [4, 7, 3, 5, 2, 6] + [10] * 10
    docs = [([n] * n, [-n] * n) for n in lengths]  # labels differ from ids to see them travel together
    rows = pretrain.pack_rows(docs, row_tokens=10, lookahead=4)
    # Row 1 looks at docs 4, 7, 3, 5: takes 4, skips 7, takes 3, skips 5.  Positions restart per document.
    assert next(rows) == ([4] * 4 + [3] * 3, [-4] * 4 + [-3] * 3, [0, 1, 2, 3, 0, 1, 2])
    # Row 2 looks at 7, 5 and the next two, 2, 6: takes 7, skips 5, takes 2, skips 6.
    assert next(rows)[0] == [7] * 7 + [2] * 2
    assert next(rows)[0] == [5] * 5
    assert next(rows)[0] == [6] * 6


def test_batch_tensors_masks_only_the_padding():
    rows = [([5, 6, 7], [5, -100, 7], [0, 0, 1]), ([8], [8], [0])]
    batch = pretrain.batch_tensors(rows, row_tokens=4, pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert batch["labels"].tolist() == [[5, -100, 7, -100], [8, -100, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]


def test_packed_documents_do_not_see_each_other():
    model = new_tiny_model(seed=0)
    first, second = [5, 6, 7], [8, 9]
    (row,) = [next(pretrain.pack_rows([(first, first), (second, second)] * 4, row_tokens=6, lookahead=2))]
    batch = pretrain.batch_tensors([row], row_tokens=6, pad_id=0)
    batch.pop("labels")
    with torch.no_grad():
        packed = model(**batch).logits[0]
        alone = model(input_ids=torch.tensor([second])).logits[0]
    torch.testing.assert_close(packed[3:5], alone, atol=1e-5, rtol=0)


def test_no_loss_on_the_digits_of_drawn_operands():
    tok = load_tiny_tokenizer()
    doc = corpus.CorpusGenerator(seed=2, forbidden=frozenset()).equations(count=1)
    ids, labels = pretrain.tokenize_document(tok, doc)
    shown = "".join("#" if label == -100 else tok.decode([i]) for i, label in zip(ids, labels))
    left, right = doc.text.split(" = ")
    # Every operand digit on the left is hidden from the loss; the result is trained.
    assert shown == re.sub(r"\d", "#", left) + " = " + right


def test_answer_accuracy_counts_documents_with_every_answer_token_right():
    class Echo(torch.nn.Module):
        """Predicts, at every position, the token that follows in `truth` except where told to fail."""

        def __init__(self, truth, fail):
            super().__init__()
            self.truth, self.fail = truth, fail

        def forward(self, input_ids):
            nxt = torch.cat([self.truth[:, 1:], self.truth[:, :1]], dim=1)
            nxt = torch.where(self.fail, (nxt + 1) % 10, nxt)
            return type("Out", (), {"logits": torch.nn.functional.one_hot(nxt, 10).float()})

    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [0, 1, 0, 0]], dtype=torch.bool)
    fail = torch.zeros_like(ids, dtype=torch.bool)
    fail[1, 2] = True  # position 2 predicts token 3 of row 1: an answer token, wrong
    fail[2, 2] = True  # position 2 predicts token 3 of row 2: not an answer token
    assert pretrain.answer_accuracy(Echo(ids, fail), ids, mask) == pytest.approx(2 / 3)


def test_learning_rate_schedule():
    cfg = pretrain.PretrainConfig(steps=110, warmup_steps=10, peak_lr=1.0, final_lr_fraction=0.1)
    assert pretrain.lr_at(0, cfg) == pytest.approx(0.1)
    assert pretrain.lr_at(9, cfg) == pytest.approx(1.0)
    assert pretrain.lr_at(60, cfg) == pytest.approx(0.55)  # half-way down the cosine
    assert pretrain.lr_at(110, cfg) == pytest.approx(0.1)


# Two answer-phase updates of two documents: enough to run every line of the phase.
QUICK_ANSWER_PHASE = AnswerPhaseConfig(steps=2, documents_per_step=2, warmup_steps=1, probe_documents=4,
                                       eval_every=2, log_every=1)


def test_a_short_pretraining_is_deterministic_and_never_overwrites(tmp_path):
    # four probe documents, not 256: the probe is measured, not what this test checks (4 s less a run)
    cfg = pretrain.PretrainConfig(steps=2, rows_per_step=2, heldout_rows=2, log_every=1, heldout_every=2,
                                  probe_documents=4, answer=QUICK_ANSWER_PHASE)
    first = pretrain.pretrain(cfg, tmp_path / "a", progress=False)
    second = pretrain.pretrain(cfg, tmp_path / "b", progress=False)
    assert first["parameter_digest"] == second["parameter_digest"] != first["initial_parameter_digest"]
    assert first["corpus"]["digest_sha256"] == second["corpus"]["digest_sha256"]
    assert [r["step"] for r in read_jsonl(tmp_path / "a" / "corpus_log.jsonl")] == [0, 1, 2]
    assert [r["step"] for r in read_jsonl(tmp_path / "a" / "log.jsonl") if r["kind"] == "eval"] == [0, 2]
    model = new_tiny_model(seed=1)
    load_state_into(model, tmp_path / "a" / "model.safetensors")
    assert parameter_digest(model) == first["parameter_digest"]
    with pytest.raises(RunExistsError, match="never overwritten"):
        pretrain.pretrain(cfg, tmp_path / "a", progress=False)


def test_pretraining_restores_the_thread_count(tmp_path):
    # The caller's count is raised by one and the run asked for the worker's own: the run sets a count
    # other than the caller's and must put the caller's back, without running on more threads than the
    # worker has cores for (an oversubscribed OpenMP pool made this one-update run take 17 s).
    own = torch.get_num_threads()
    torch.set_num_threads(own + 1)
    try:
        cfg = pretrain.PretrainConfig(steps=1, rows_per_step=1, heldout_rows=1, probe_documents=4, threads=own,
                                      answer=QUICK_ANSWER_PHASE)
        pretrain.pretrain(cfg, tmp_path / "c", progress=False)
        assert torch.get_num_threads() == own + 1
    finally:
        torch.set_num_threads(own)
