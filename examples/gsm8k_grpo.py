#!/usr/bin/env python3
# gsm8k_grpo.py — GRPO on GSM8K through a running grpod, scored by grpod's `math` verifier.
# Standard library and the repository's client package (clients/python). The recipe, what
# to watch in its log and the knobs: examples/gsm8k.md. Smoke-tested against the tiny
# CPU model (where every reward is 0); meant for a GPU machine and a real model directory.
import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
from grpod_client import Client  # noqa: E402

INSTRUCTION = " Let's think step by step and output the final answer after \"####\"."


def load(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    # the reference answer is what follows "####" in the solution, e.g. "72" or "1,200"
    return [(r["question"], r["answer"].split("####")[-1].strip().replace(",", "")) for r in rows]


def group(question, answer, n):
    return {"messages": [{"role": "user", "content": question + INSTRUCTION}], "n": n,
            "reward": {"type": "math", "answer": answer}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:8780")
    p.add_argument("--data", default="../shared/data/gsm8k")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64, help="questions per step")
    p.add_argument("--n", type=int, default=8, help="responses per question")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-size", type=int, default=256, help="test questions per evaluation (greedy)")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log", default="gsm8k_log.jsonl")
    args = p.parse_args()

    client = Client(args.url, os.environ.get("GRPOD_API_KEY"), timeout=600)
    client.wait_ready(timeout=1800)             # a large model takes a while to load
    train, test = load(os.path.join(args.data, "train.jsonl")), load(os.path.join(args.data, "test.jsonl"))
    rng = random.Random(args.seed)
    algorithm = {"adv_estimator": "grpo", "norm_adv_by_std": True, "loss_mode": "vanilla",
                 "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "loss_agg_mode": "token-mean",
                 "kl_coef": 0.001, "kl_type": "low_var_kl", "entropy_coeff": 0.0,
                 "old_logprobs": "rollout", "mask_truncated_completions": False, "filter_groups": True}
    optimizer = {"lr": args.lr, "weight_decay": 0.01, "grad_clip": 1.0, "warmup_steps": 10}
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": args.max_tokens}
    log = open(args.log, "a")

    def evaluate(step):
        qs = test[:args.eval_size]
        res = client.rollouts([group(q, a, 1) for q, a in qs], dict(sampling, temperature=0.0, seed=1),
                              timeout=3600)
        acc = sum(g["responses"][0]["reward"] for g in res["groups"]) / len(qs)
        print("step %4d  test accuracy %.3f (%d questions, greedy)" % (step, acc, len(qs)), flush=True)
        log.write(json.dumps({"step": step, "test_accuracy": acc}) + "\n")
        log.flush()

    evaluate(0)
    for step in range(1, args.steps + 1):
        t0 = time.time()
        batch = rng.sample(train, args.batch)
        rollout = client.rollouts([group(q, a, args.n) for q, a in batch],
                                  dict(sampling, seed=rng.randrange(1, 2**31)), timeout=3600)
        rewards = [r["reward"] for g in rollout["groups"] for r in g["responses"]]
        lengths = [len(r["token_ids"]) for g in rollout["groups"] for r in g["responses"]]
        upd = client.update(rollout_job_id=rollout.job_id, algorithm=algorithm, optimizer=optimizer, timeout=3600)
        m, tok = upd["metrics"], upd["tokens"]
        row = {"step": step, "reward": sum(rewards) / len(rewards), "len": sum(lengths) / len(lengths),
               "kl": m["kl"], "entropy": m["entropy"], "clip_frac": m["clip_frac"],
               "groups_filtered": m["groups_filtered"], "packed": tok["packed"], "standard": tok["standard"],
               "rollout_s": rollout["timings_ms"]["total"] / 1e3, "update_s": upd["timings_ms"]["total"] / 1e3,
               "seconds": time.time() - t0}
        print("step %4d  reward %.3f  len %5.1f  kl %.4f  entropy %.3f  filtered %d  tokens %d/%d  "
              "rollout %.1fs update %.1fs" % (step, row["reward"], row["len"], row["kl"], row["entropy"],
                                               row["groups_filtered"], row["packed"], row["standard"],
                                               row["rollout_s"], row["update_s"]), flush=True)
        log.write(json.dumps(row) + "\n")
        log.flush()
        if step % args.eval_every == 0 or step == args.steps:
            evaluate(step)
        if step % args.checkpoint_every == 0 or step == args.steps:
            client.checkpoint(timeout=3600)


if __name__ == "__main__":
    main()
