# test_lm_eval.py — lm-evaluation-harness's local-completions run as a user runs it, with only
# base_url (its tokenizer is then the server's: /tokenizer_info, /tokenize, /detokenize), on three
# local tasks over random data: a multiple-choice one (loglikelihood, acc), a loglikelihood one
# (acc = is_greedy, read from top_logprobs) and a generate_until one (exact_match). Its numbers
# must be the ones computed directly: acc from /v1/logprobs of each choice, is_greedy from
# /v1/logprobs' most likely token at each position, exact_match from greedy /v1/completions.
#
# lm-eval with its API extra (no torch) is among make test's packages (tools/deps.sh --test): the
# test runs where `import lm_eval` works, in this Python or in the one GRPOD_LM_EVAL_PYTHON names
# (a venv of it), and skips elsewhere (a bare pytest run without make deps).
import glob
import json
import os
import random
import subprocess
import sys

import pytest

PY = os.environ.get("GRPOD_LM_EVAL_PYTHON", sys.executable)

MC = """task: grpod_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
GEN = """task: grpod_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""

LL = """task: grpod_ll
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
target_delimiter: ""
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def have_lm_eval():
    return subprocess.run([PY, "-c", "import lm_eval.models.openai_completions, tenacity"],
                          capture_output=True).returncode == 0


def write_tasks(tmp, rng):
    words = ["cat", "dog", "sun", "red", "blue", "tree"]
    mc = [{"question": "Q%d: %s?" % (i, " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))),
           "choices": [" " + w for w in rng.sample(words, 3)], "answer": rng.randrange(3)} for i in range(8)]
    gen = [{"question": "Say %s:" % rng.choice(words), "answer": rng.choice(words)} for _ in range(4)]
    for name, rows, tpl in (("mc", mc, MC), ("gen", gen, GEN)):
        data = tmp / ("%s.jsonl" % name)
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tmp / ("%s.yaml" % name)).write_text(tpl.format(data=data))
    return mc, gen


def test_local_completions_with_only_base_url(shared_daemon, tmp_path):
    if not have_lm_eval():
        pytest.skip("lm_eval is not installed here (GRPOD_LM_EVAL_PYTHON: a Python that has it)")
    d = shared_daemon
    mc, gen = write_tasks(tmp_path, random.Random(37))


    def tok(text):
        return d.post("/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]

    def top1(ctx, cont):
        """/v1/logprobs of cont after ctx, with each position's most likely id."""
        r = d.post("/v1/logprobs", {"groups": [{"prompt_ids": ctx, "responses": [{"token_ids": cont}]}],
                                    "top_logprobs": 1}).json()
        return [t[0] for t in r["groups"][0]["responses"][0]["top_ids"]]

    # loglikelihood (acc = is_greedy, read from top_logprobs): half the answers are the model's
    # greedy next character (when printable), so acc is neither trivially 0 nor 1
    rng = random.Random(38)
    ll = []
    for i in range(8):
        q = "Z%d %s" % (i, rng.choice(["cat", "dog", "sun"]))
        g = top1(tok(q), tok("a"))[0]
        greedy = d.post("/detokenize", {"tokens": [g]}).json()["prompt"]
        ans = greedy if i % 2 == 0 and len(greedy) == 1 and " " < greedy < "~" else rng.choice("xyz")
        ll.append({"question": q, "answer": ans})
    (tmp_path / "ll.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ll))
    (tmp_path / "ll.yaml").write_text(LL.format(data=tmp_path / "ll.jsonl"))
    out = tmp_path / "out"
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    r = subprocess.run([PY, "-m", "lm_eval", "--model", "local-completions",
                        "--model_args", "base_url=%s/v1/completions" % d.url,
                        "--tasks", "grpod_mc,grpod_gen,grpod_ll", "--include_path", str(tmp_path), "--output_path", str(out)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.load(open(glob.glob(str(out / "**" / "results_*.json"), recursive=True)[0]))["results"]

    right = 0
    for doc in mc:
        ctx = tok(doc["question"])
        scores = []
        for ch in doc["choices"]:
            lp = d.post("/v1/logprobs", {"groups": [{"prompt_ids": ctx, "responses": [{"token_ids": tok(ch)}]}]})
            scores.append(sum(lp.json()["groups"][0]["responses"][0]["logprobs"]))
        right += scores.index(max(scores)) == doc["answer"]
    assert results["grpod_mc"]["acc,none"] == pytest.approx(right / len(mc))
    hits = 0
    for doc in gen:
        c = d.post("/v1/completions", {"prompt": doc["question"], "max_tokens": 8, "temperature": 0,
                                       "stop": ["\n"]}).json()
        hits += c["choices"][0]["text"] == doc["answer"]
    assert results["grpod_gen"]["exact_match,none"] == pytest.approx(hits / len(gen))
    greedy = [top1(tok(doc["question"]), tok(doc["answer"])) == tok(doc["answer"]) for doc in ll]
    assert 0 < sum(greedy) < len(ll)
    assert results["grpod_ll"]["acc,none"] == pytest.approx(sum(greedy) / len(ll))
