"""The length-generalisation recipe: buckets, exact match, randomised positions, bad options."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("lightning", reason="the recipes need mmpe[recipes]")

import torch
from mmpe.recipes import lengthgen as lg
from mmpe.recipes.compare import compare, resolve_encodings

QUICK = ["--trainer.max_steps", "4", "--trainer.enable_progress_bar", "false",
         "--data.eval_examples", "3", "--data.batch_size", "8", "--model.d_model", "16",
         "--model.depth", "1", "--trainer.enable_checkpointing", "false"]


def test_buckets_cover_training_then_double():
    assert lg.bucket_lengths("copy", 8, 1) == list(range(1, 9))
    assert lg.bucket_lengths("copy", 8, 2) == list(range(9, 17))
    assert lg.bucket_lengths("copy", 8, 8) == list(range(33, 65))
    assert lg.bucket_lengths("scan", 6, 4) == [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 24]


def test_reach_stops_at_the_first_bucket_below_half():
    assert lg.reach([1.0, 0.9, 0.4, 0.8]) == 2
    assert lg.reach([0.3, 1.0, 1.0, 1.0]) == 0
    assert lg.reach([0.5, None, 1.0, 1.0]) == 1
    assert lg.reach([1.0, 1.0, 1.0, 0.6]) == 8


def test_collate_masks_the_answer_and_draws_sorted_positions():
    data = lg.TaskData(tasks=["copy"])
    items = data.eval_set("copy", 1)[:4]
    items = [(ids, sep, seed) for seed, (ids, sep, _) in enumerate(items)]
    batch = lg.Collate(random_positions=300)(items)
    for row, (ids, sep, _) in enumerate(items):
        answer = batch["tokens"][row, 1:][batch["answer"][row]].tolist()
        assert answer == ids[sep + 1:]  # the answer digits and <eos>
    pos = batch["position_ids"]
    assert pos.shape == batch["answer"].shape and bool((pos[:, 1:] > pos[:, :-1]).all())
    again = lg.Collate(random_positions=300)(items)["position_ids"]
    assert torch.equal(pos, again)


def test_exact_match_is_all_answer_tokens():
    """A model whose argmax is the target everywhere scores 1; one wrong answer token, 0;
    a wrong prediction outside the answer changes nothing."""
    data = lg.TaskData(tasks=["reverse"])
    batch = lg.Collate()(data.eval_set("reverse", 1)[:2])
    model = lg.TaskLM(vocab_size=data.vocab_size)
    target = batch["tokens"][:, 1:]
    logits = torch.nn.functional.one_hot(target, data.vocab_size).float()
    model.forward = lambda b: logits
    assert model.exact_match(batch).tolist() == [True, True]
    prompt = (~batch["answer"][0]).nonzero()[0, 0]
    logits[0, prompt] = logits[0, prompt].roll(1)
    assert model.exact_match(batch).tolist() == [True, True]
    first = batch["answer"][1].nonzero()[0, 0]
    logits[1, first] = logits[1, first].roll(1)
    assert model.exact_match(batch).tolist() == [True, False]


def test_eval_sets_do_not_depend_on_the_run():
    a = lg.TaskData().eval_set("addition", 2)
    b = lg.TaskData().eval_set("addition", 2)
    assert a == b and len(a) == 100
    lengths = {(ids.index(lg.Tokenizer().index["+"]) - 1) for ids, _, _ in a}
    assert lengths == set(range(5, 9))  # addition: L = 4 digits, bucket 2x = (4, 8]


def test_quick_run_reports_every_bucket(tmp_path):
    metrics = lg.run_one("learned", seed=0, out_dir=tmp_path, cli_args=QUICK)
    assert set(metrics) == {f"{t}@{m}x" for t in lg.TASKS for m in lg.MULTIPLIERS} | {
        f"{t} reach" for t in lg.TASKS}
    assert all(v is None or 0.0 <= v <= 1.0 for k, v in metrics.items() if "@" in k)
    # a learned table of the training length cannot represent the longer buckets
    assert metrics["copy@4x"] is None and metrics["copy@1x"] is not None


def test_randomised_positions_give_a_learned_table_every_length(tmp_path):
    metrics = lg.run_one("learned+randpos", seed=0, out_dir=tmp_path, cli_args=QUICK)
    assert all(metrics[f"{t}@8x"] is not None for t in lg.TASKS)


@pytest.mark.parametrize("call, match", [
    (lambda: lg.TaskData(tasks=["copy", "multiply"]), "unknown task 'multiply'"),
    (lambda: lg.TaskData(random_positions=100), "random_positions=100 is smaller"),
    (lambda: lg.TaskData(train_lengths={"copy": 0}), r"train_lengths\['copy'\]"),
    (lambda: lg.check_options("abacus", ["--data.tasks", "[scan]"]), "contain no numbers"),
    (lambda: resolve_encodings(lg.COMPARE, "rope,bogus+randpos", None), "bogus"),
    (lambda: resolve_encodings(lg.COMPARE, "bogus+randpos_ref", None), "bogus"),
    (lambda: lg.TaskData(tasks=["copy", "sort"], per_length=True), "one model per task"),
    (lambda: lg.TaskData(tasks=["copy"], eval_random_positions=True), "needs data.random_positions"),
])
def test_bad_options_fail_before_training(call, match):
    with pytest.raises((ValueError, KeyError), match=match):
        call()


def test_compare_stores_and_plots(tmp_path):
    table = compare("lengthgen", "nope,abacus", out_dir=tmp_path / "out", seeds=1,
                    store=tmp_path / "store", cli_args=QUICK)
    assert re.search(r"\| abacus( †)? \|", table) and "copy reach" in table  # † from a dirty tree
    assert (tmp_path / "out" / "exact_match_accuracy.png").stat().st_size > 10_000


@pytest.mark.slow
def test_copy_is_learned_in_distribution(tmp_path):
    """A real claim that can fail: 600 steps of RoPE on copy alone reach ≥ 90 % at 1x."""
    metrics = lg.run_one("rope", seed=0, out_dir=tmp_path, cli_args=[
        "--trainer.max_steps", "600", "--data.tasks", "[copy]", "--trainer.enable_progress_bar", "false"])
    assert metrics["copy@1x"] >= 0.9


PER_TASK = [*QUICK, "--data.per_length", "true"]


def test_per_task_columns_chance_and_what_is_read_against_what():
    cols = lg.per_task_columns("copy")
    assert cols[:4] == ["copy ≤L", "copy >L", "copy tok >L", "copy reach/L"]
    assert "copy[16]" in cols and "copy[17]" not in cols and "copy tok[1]" in cols
    assert lg.chance("parity[3]") == 0.5 and lg.chance("parity tok >L") == 0.5
    assert lg.chance("copy >L") == 0.0 and lg.chance("copy tok[9]") == 0.1
    assert lg.chance("scan tok >L") == pytest.approx(1 / 6) and lg.chance("copy reach/L") is None
    assert lg.chance("parity@2x") == 0.5 and lg.chance("parity reach") is None
    assert lg.in_distribution("copy >L") == "copy ≤L" and lg.in_distribution("copy ≤L") is None
    assert lg.in_distribution("copy[8]") is None and lg.in_distribution("copy[9]") == "copy ≤L"
    assert lg.in_distribution("addition@4x") == "addition@1x"
    assert lg.in_distribution("addition reach") == "addition@1x"
    assert lg.parse_encoding("rope+randpos_ref") == ("rope", True)
    assert lg.randpos_at_eval("rope+randpos_ref") and not lg.randpos_at_eval("rope+randpos")


def test_per_task_positions_beyond_training_are_unseen():
    data = lg.TaskData(tasks=["copy"], per_length=True)
    assert data.longest_train == 1 + 8 + 1 + 8  # [copy] 8 digits = 8 digits (no <eos> input)
    assert data.longest_eval == 1 + 16 + 1 + 16  # up to 2 L
    assert data.table_positions == data.longest_eval  # the table's rows beyond L never train
    lengths = {len(ids) for ids, _, _ in (data.length_set("copy", 12))}
    assert lengths == {1 + 12 + 1 + 12 + 1}
    assert data.length_set("copy", 12) == lg.TaskData(tasks=["copy"], per_length=True).length_set("copy", 12)


def test_answer_hits_count_tokens_without_eos():
    data = lg.TaskData(tasks=["reverse"], per_length=True)
    batch = lg.Collate()(data.length_set("reverse", 3)[:2])
    model = lg.TaskLM(vocab_size=data.vocab_size)
    logits = torch.nn.functional.one_hot(batch["tokens"][:, 1:], data.vocab_size).float()
    model.forward = lambda b: logits
    first = batch["answer"][1].nonzero()[0, 0]
    logits[1, first] = logits[1, first].roll(1)
    exact, right, total = model.answer_hits(batch)
    assert exact.tolist() == [True, False] and total.tolist() == [3, 3] and right.tolist() == [3, 2]


def test_per_task_run_reports_every_length(tmp_path):
    metrics = lg.run_one("learned", seed=0, out_dir=tmp_path,
                         cli_args=[*PER_TASK, "--data.tasks", "[parity]"])
    assert set(metrics) == set(lg.per_task_columns("parity"))
    assert metrics["parity[16]"] is not None  # the table holds every evaluated position
    assert 0 <= metrics["parity reach/L"] <= 2
    ref = lg.run_one("rope+randpos_ref", seed=0, out_dir=tmp_path / "ref",
                     cli_args=[*PER_TASK, "--data.tasks", "[copy]"])
    assert set(ref) == set(lg.per_task_columns("copy"))


def test_per_task_plan_stores_a_setting_per_task_and_plots(tmp_path):
    lg.run_per_task(tmp_path / "store", seeds=[0], tasks=["copy", "sort"], encodings=["nope"],
                    out_dir=tmp_path / "out", extra=QUICK)
    from mmpe.results import report, store

    records = store.read(tmp_path / "store", "lengthgen")
    assert sorted(r["setting"] for r in records) == ["task-copy", "task-sort"]
    table = report.render_table(lg.COMPARE, records, settings=["task-copy", "task-sort"],
                                merge=True, columns=["copy ≤L", "sort ≤L", "sort >L"])
    assert table.count("| nope") == 1
    png = report.plot(lg.COMPARE, records, tmp_path / "curves.png", "task-copy,task-sort")
    assert png.stat().st_size > 10_000
