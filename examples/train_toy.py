#!/usr/bin/env python3
# train_toy.py — a GRPO training loop that drives a running grpod over its HTTP API alone
# (Python standard library and clients/python, the repository's client package). It is the "grpod is a trainer" proof: the daemon's built-in
# tiny model (random weights, byte-level vocab) learns a toy task by RL, and this script prints a
# line per step, writes DIR/train_toy.csv and an SVG reward curve DIR/train_toy_curve.svg, and
# ends with `final mean reward X.XXX` (the mean over the last few steps).
#
# The task ("repeat the letter"): the prompt is `Repeat: x` with x one of the 26 lowercase letters
# (--letters); the policy answers with one token (--max-tokens). Reward 1 when the token is x,
# else 0 — grpod's built-in `exact` verifier, so each update just names its rollout
# (rollout_job_id). From random weights over a 259-token byte vocab the first hits are rare
# (~0.4 % per sample), so a step samples 16 prompts x 16 responses; a policy that ignores the
# prompt earns at most 1/26, so a mean reward of 0.9 needs the prompt. `--rewards client` scores
# here instead and sends the groups back (the way to train on any reward function).
#
# Each step: draw --batch letters, POST /v1/rollouts (n = --n, temperature 1, a seed per step),
# long-poll GET /v1/jobs/{id}?wait=, POST /v1/updates (GRPO advantages per group, computed by
# grpod), long-poll it. The recipe that keeps every letter learnable: lr 1e-3 with a cosine decay
# to 1e-4 (late steps have few groups with any reward variance, and Adam turns their small
# gradients into full-size steps that knock other letters over), a KL penalty 0.05 against the
# initial model and an entropy bonus 0.01 (both slow the collapse of a letter onto a wrong answer
# before its right one has been sampled).
#
# With LoRA (grpod serve --lora-rank 8) the embedding / lm head (tied, N(0, 0.02) rows of norm
# ~0.23) and the final norm stay frozen: the best logit gap a frozen head allows is ~0.23 x
# sqrt(128) = 2.6 nats at temperature 1, so p(answer) <= ~5 %; --temperature 0.2 (sampling and
# training alike) makes the same head able to answer with certainty.
#
# Not a benchmark of grpod's throughput: the model is tiny and the HTTP round trips are a large
# share of a step.
import argparse
import json
import os
import random
import string
import sys
import time

CSV_FIELDS = ["step", "mean_reward", "kl", "loss", "entropy", "lr", "tokens_packed", "tokens_standard",
              "policy_version", "seconds", "elapsed"]


# ---------------------------------------------------------------------------------------------
# HTTP: the client package of this repository (clients/python), used in place when not installed
# ---------------------------------------------------------------------------------------------

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
from grpod_client import Client  # noqa: E402


def wait_ready(client, timeout=120):
    if client.ready():
        return
    print("waiting for grpod at %s (start it with `make run`) ..." % client.url, flush=True)
    client.wait_ready(timeout)


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------

def make_prompt(letter):
    return "Repeat: " + letter


def score(token_ids, target, alphabet, other_letter=0.0):
    """--rewards client: per generated token 1 when it is the target letter, other_letter when it is
    another letter of the alphabet, else 0; averaged over the response. Token ids are bytes here
    (the built-in byte-level tokenizer); the verifier mode has no such assumption."""
    if not token_ids:
        return 0.0
    total = 0.0
    for t in token_ids:
        if t == target:
            total += 1.0
        elif t in alphabet:
            total += other_letter
    return total / len(token_ids)


# ---------------------------------------------------------------------------------------------
# Output: CSV and an SVG curve (hand-written polyline, axes, ticks)
# ---------------------------------------------------------------------------------------------

def write_csv(path, rows):
    with open(path, "w") as f:
        f.write(",".join(CSV_FIELDS) + "\n")
        for r in rows:
            f.write(",".join(_fmt(r[k]) for k in CSV_FIELDS) + "\n")


def _fmt(v):
    return "%.6g" % v if isinstance(v, float) else str(v)


def write_svg(path, rows, title):
    """Mean reward per step and its 10-step moving average against step, y in [0, 1]."""
    W, H = 640, 400
    left, right, top, bottom = 60, 20, 40, 50
    pw, ph = W - left - right, H - top - bottom
    n_max = max(rows[-1]["step"], 1)

    def x(step):
        return left + pw * step / n_max

    def y(v):
        return top + ph * (1.0 - max(0.0, min(1.0, v)))

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">' % (W, H, W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="14" text-anchor="middle">%s</text>' % (W // 2, _xml(title))]
    for i in range(6):  # y grid and ticks
        v = i / 5
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (left, y(v), left + pw, y(v)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.1f</text>' % (left - 6, y(v) + 4, v))
    step_tick = _nice_step(n_max)
    s = 0
    while s <= n_max:
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#000"/>' % (x(s), top + ph, x(s), top + ph + 5))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (x(s), top + ph + 18, s))
        s += step_tick
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/>' % (left, top + ph, left + pw, top + ph))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#000"/>' % (left, top, left, top + ph))
    out.append('<text x="%d" y="%d" text-anchor="middle">step</text>' % (left + pw // 2, H - 10))
    out.append('<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">reward</text>'
               % (top + ph // 2, top + ph // 2))
    out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#2ca02c" stroke-dasharray="6 4"/>'
               % (left, y(0.9), left + pw, y(0.9)))
    out.append('<text x="%d" y="%.1f" fill="#2ca02c" text-anchor="end">0.9</text>' % (left + pw - 4, y(0.9) + 14))
    avg = [sum(r["mean_reward"] for r in rows[max(0, i - 9):i + 1]) / (i + 1 - max(0, i - 9))
           for i in range(len(rows))]
    for vals, color, width in (([r["mean_reward"] for r in rows], "#9ecae1", 1), (avg, "#08519c", 2.5)):
        pts = " ".join("%.1f,%.1f" % (x(r["step"]), y(v)) for r, v in zip(rows, vals))
        out.append('<polyline fill="none" stroke="%s" stroke-width="%s" points="%s"/>' % (color, width, pts))
    lx, ly = left + pw - 230, top + ph - 44
    out.append('<rect x="%d" y="%d" width="222" height="38" fill="white" stroke="#ccc"/>' % (lx, ly))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#9ecae1" stroke-width="1"/>' % (lx + 8, ly + 13, lx + 28, ly + 13))
    out.append('<text x="%d" y="%d">mean reward per step</text>' % (lx + 34, ly + 17))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#08519c" stroke-width="2.5"/>' % (lx + 8, ly + 29, lx + 28, ly + 29))
    out.append('<text x="%d" y="%d">mean over the last 10 steps</text>' % (lx + 34, ly + 33))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def _nice_step(n):
    for s in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000):
        if n / s <= 10:
            return s
    return max(1, n // 10)


def _xml(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description="GRPO on a toy task (repeat the letter) through a running grpod; "
                                            "see the file header.")
    p.add_argument("--url", default="http://127.0.0.1:8780", help="grpod base URL")
    p.add_argument("--steps", type=int, default=300, help="training steps (one rollout + one update each)")
    p.add_argument("--out", default="train_toy_out", help="directory for train_toy.csv and train_toy_curve.svg")
    p.add_argument("--seed", type=int, default=1, help="seed of the prompt draws and of the sampling seeds")
    p.add_argument("--letters", default=string.ascii_lowercase, help="the alphabet the prompts draw from")
    p.add_argument("--batch", type=int, default=16, help="prompts (groups) per step")
    p.add_argument("--n", type=int, default=16, help="responses per prompt")
    p.add_argument("--max-tokens", type=int, default=1, help="tokens per response")
    p.add_argument("--rewards", choices=("verifier", "client"), default="verifier",
                   help="verifier: grpod's exact verifier + an update by rollout_job_id; "
                        "client: scored here, groups sent back with the update")
    p.add_argument("--other-letter", type=float, default=0.0,
                   help="with --rewards client: reward for a letter of the alphabet that is not the prompt's")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (peak)")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="cosine",
                   help="cosine decays the lr over --decay-steps down to --min-lr-ratio")
    p.add_argument("--decay-steps", type=int, default=300,
                   help="cosine horizon in optimizer steps (grpod counts them across runs)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine floor, a fraction of --lr")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling and training temperature (a policy with a frozen head, e.g. LoRA, needs < 1 here)")
    p.add_argument("--kl-coef", type=float, default=0.05, help="KL penalty against the reference (initial) model")
    p.add_argument("--entropy-coeff", type=float, default=0.01, help="entropy bonus")
    p.add_argument("--last", type=int, default=10, help="steps averaged for the final mean reward")
    p.add_argument("--api-key", default=os.environ.get("GRPOD_API_KEY"), help="Bearer key (env GRPOD_API_KEY)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    client = Client(args.url, args.api_key)
    wait_ready(client)
    model = client.model()
    rng = random.Random(args.seed)
    alphabet = set(ord(c) for c in args.letters)
    os.makedirs(args.out, exist_ok=True)
    print("grpod %s: %s, %s backend, %d params, policy_version %d; task: repeat one of %d letters, "
          "%d prompts x %d responses x %d tokens per step, rewards by %s"
          % (args.url, model["arch"], model["backend"], model["n_params"], model["policy_version"],
             len(args.letters), args.batch, args.n, args.max_tokens,
             "grpod's exact verifier" if args.rewards == "verifier" else "this script"), flush=True)
    if model["policy_version"] != 0:
        print("note: this policy has been trained before (policy_version %d); for a run from random "
              "weights stop grpod, remove its data dir (rm -rf grpod-data) and start it again"
              % model["policy_version"], flush=True)

    prompt_ids = {c: client.tokenize(make_prompt(c)) for c in args.letters}
    algorithm = {"adv_estimator": "grpo", "norm_adv_by_std": True, "kl_coef": args.kl_coef,
                 "entropy_coeff": args.entropy_coeff, "old_logprobs": "rollout", "temperature": args.temperature}
    optimizer = {"lr": args.lr, "weight_decay": 0.0, "grad_clip": 1.0, "lr_schedule": args.lr_schedule,
                 "total_steps": args.decay_steps, "min_lr_ratio": args.min_lr_ratio}
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens, "ignore_eos": True}

    rows = []
    t_start = time.time()
    for step in range(1, args.steps + 1):
        t0 = time.time()
        letters = [rng.choice(args.letters) for _ in range(args.batch)]
        groups = [{"prompt_ids": prompt_ids[c], "n": args.n} for c in letters]
        if args.rewards == "verifier":
            for g, c in zip(groups, letters):
                g["reward"] = {"type": "exact", "answer": c}
        rollout = client.rollouts(groups, dict(sampling, seed=rng.randrange(1, 2**31)))

        if args.rewards == "verifier":
            # grpod scored the responses; the update takes the rollout (and its logprobs) by id
            rewards = [r["reward"] for g in rollout["groups"] for r in g["responses"]]
            update = {"rollout_job_id": rollout.job_id}
        else:
            # score here and send the groups back: the way to train on any reward function
            rewards, scored = [], []
            for c, g in zip(letters, rollout["groups"]):
                resps = []
                for r in g["responses"]:
                    rw = score(r["token_ids"], ord(c), alphabet, args.other_letter)
                    rewards.append(rw)
                    resps.append({"token_ids": r["token_ids"], "reward": rw, "logprobs": r["logprobs"],
                                  "finish_reason": r["finish_reason"]})
                scored.append({"prompt_ids": g["prompt_ids"], "responses": resps})
            update = {"groups": scored}
        update.update(algorithm=algorithm, optimizer=optimizer)
        upd = client.update(**update)

        m, tok = upd["metrics"], upd["tokens"]
        now = time.time()
        row = {"step": step, "mean_reward": sum(rewards) / len(rewards),
               "kl": float(m["kl"]), "loss": float(m["loss"]), "entropy": float(m["entropy"]),
               "lr": float(m["lr"]), "tokens_packed": tok["packed"], "tokens_standard": tok["standard"],
               "policy_version": upd["policy_version_after"], "seconds": now - t0, "elapsed": now - t_start}
        rows.append(row)
        print("step %4d  mean reward %.3f  kl %.4f  loss %+.4f  entropy %.3f  tokens packed %d / standard %d  %.2fs"
              % (step, row["mean_reward"], row["kl"], row["loss"], row["entropy"],
                 row["tokens_packed"], row["tokens_standard"], row["seconds"]), flush=True)

    csv_path = os.path.join(args.out, "train_toy.csv")
    svg_path = os.path.join(args.out, "train_toy_curve.svg")
    write_csv(csv_path, rows)
    last = rows[-args.last:]
    final = sum(r["mean_reward"] for r in last) / len(last)
    write_svg(svg_path, rows, "grpod train_toy: repeat the letter, %d steps in %.0f s (%s backend)"
              % (len(rows), rows[-1]["elapsed"], model["backend"]))
    print("wrote %s and %s; %d steps in %.1f s" % (csv_path, svg_path, len(rows), rows[-1]["elapsed"]))
    print("final mean reward %.3f" % final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
