#!/usr/bin/env python3
# train_toy.py — a GRPO training loop that drives a running grpod over its HTTP API alone
# (Python standard library only). It is the "grpod is a trainer" proof: the daemon's built-in
# tiny model (random weights, byte-level vocab) learns a toy task by RL, and this script prints a
# line per step, writes DIR/train_toy.csv and an SVG reward curve DIR/train_toy_curve.svg, and
# ends with `final mean reward X.XXX` (the mean over the last few steps).
#
# The task ("repeat the letter"): the prompt is `Repeat: x` with x drawn from a small alphabet
# (--letters, default "abcd"); the policy answers with --max-tokens tokens (default 1). Rewards are
# computed here, client-side, per generated token, averaged over the response:
#   1.0  the token is the prompt's letter
#   0.1  the token is another letter of the alphabet (a format reward: it makes the signal dense
#        enough for a random policy over 259 tokens to find the alphabet at all)
#   0.0  anything else
# A policy that ignores the prompt (always the same letter, or uniform over the alphabet) earns at
# most 1/K + 0.1 (K-1)/K, 0.325 for K = 4, so a mean reward of 0.9 needs the prompt.
#
# Each step: sample --batch prompts, POST /v1/rollouts (n = --n responses each, temperature 1),
# wait for the job with ?wait=, score the responses, POST /v1/updates with the groups (token ids,
# rewards, rollout logprobs), wait for it. GRPO advantages are computed by grpod per group.
#
# Not a benchmark of grpod's throughput: the model is tiny and the HTTP round trips are a large
# share of a step.
import argparse
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request

CSV_FIELDS = ["step", "mean_reward", "exact_frac", "kl", "loss", "entropy", "grad_norm",
              "tokens_packed", "tokens_standard", "policy_version", "seconds", "elapsed"]


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------

class Client:
    """Minimal JSON client for grpod: post/get return the decoded body, raise on HTTP errors."""

    def __init__(self, url, api_key=None, timeout=120):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def _call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", "Bearer " + self.api_key)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError("%s %s -> %d %s" % (method, path, e.code, e.read().decode(errors="replace")))

    def get(self, path):
        return self._call("GET", path)

    def post(self, path, body):
        return self._call("POST", path, body)

    def run_job(self, path, body, timeout=600):
        """POST a job, long-poll GET /v1/jobs/{id}?wait= until it ends; return its result."""
        job_id = self.post(path, body)["job_id"]
        end = time.time() + timeout
        while time.time() < end:
            job = self.get("/v1/jobs/%s?wait=30" % job_id)
            if job["status"] == "done":
                return job["result"]
            if job["status"] in ("failed", "cancelled"):
                raise RuntimeError("job %s %s: %s" % (job_id, job["status"], job.get("error")))
        raise RuntimeError("job %s did not finish in %d s" % (job_id, timeout))


def wait_ready(client, timeout=120):
    end = time.time() + timeout
    while True:
        try:
            return client.get("/readyz")
        except (urllib.error.URLError, RuntimeError, ConnectionError) as e:
            if time.time() > end:
                raise RuntimeError("grpod at %s not ready: %s" % (client.url, e))
            time.sleep(0.5)


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------

def make_prompt(letter):
    return "Repeat: " + letter


def score(token_ids, target, alphabet, other_letter=0.1):
    """Mean per-token reward of one response (see the file header)."""
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
    """Mean reward (and exact-letter fraction) against step, y in [0, 1]."""
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
    for key, color in (("exact_frac", "#f28e2b"), ("mean_reward", "#1f77b4")):
        pts = " ".join("%.1f,%.1f" % (x(r["step"]), y(r[key])) for r in rows)
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (color, pts))
    lx, ly = left + pw - 200, top + ph - 40
    out.append('<rect x="%d" y="%d" width="190" height="36" fill="white" stroke="#ccc"/>' % (lx, ly))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#1f77b4" stroke-width="2"/>' % (lx + 8, ly + 12, lx + 28, ly + 12))
    out.append('<text x="%d" y="%d">mean reward</text>' % (lx + 34, ly + 16))
    out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#f28e2b" stroke-width="2"/>' % (lx + 8, ly + 28, lx + 28, ly + 28))
    out.append('<text x="%d" y="%d">right letter (fraction)</text>' % (lx + 34, ly + 32))
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
    p = argparse.ArgumentParser(description="GRPO on a toy task through a running grpod (see the file header).")
    p.add_argument("--url", default="http://127.0.0.1:8780", help="grpod base URL")
    p.add_argument("--steps", type=int, default=100, help="training steps (rollout + update each)")
    p.add_argument("--out", default="train_toy_out", help="directory for train_toy.csv and train_toy_curve.svg")
    p.add_argument("--seed", type=int, default=1, help="prompt order and sampling seeds")
    p.add_argument("--letters", default="abcd", help="the alphabet the prompts draw from")
    p.add_argument("--batch", type=int, default=8, help="prompts (groups) per step")
    p.add_argument("--n", type=int, default=16, help="responses per prompt")
    p.add_argument("--max-tokens", type=int, default=1, help="tokens per response")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty against the reference model")
    p.add_argument("--entropy-coeff", type=float, default=0.0, help="entropy bonus")
    p.add_argument("--other-letter", type=float, default=0.1, help="reward for a wrong letter of the alphabet")
    p.add_argument("--lr-schedule", default="constant", help="constant|cosine (cosine decays over --steps)")
    p.add_argument("--min-lr-ratio", type=float, default=0.0, help="cosine floor, a fraction of --lr")
    p.add_argument("--last", type=int, default=10, help="steps averaged for the final mean reward")
    p.add_argument("--api-key", default=os.environ.get("GRPOD_API_KEY"), help="Bearer key (env GRPOD_API_KEY)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    client = Client(args.url, args.api_key)
    wait_ready(client)
    model = client.get("/v1/model")
    rng = random.Random(args.seed)
    alphabet = set(ord(c) for c in args.letters)
    os.makedirs(args.out, exist_ok=True)
    print("grpod %s: %s, %s backend, %d params, policy_version %d; task: repeat one of %r, "
          "%d prompts x %d responses x %d tokens per step"
          % (args.url, model["arch"], model["backend"], model["n_params"], model["policy_version"],
             args.letters, args.batch, args.n, args.max_tokens), flush=True)

    prompt_ids = {c: client.post("/v1/tokenize", {"prompt": make_prompt(c)})["tokens"] for c in args.letters}
    algorithm = {"adv_estimator": "grpo", "norm_adv_by_std": True, "kl_coef": args.kl_coef,
                 "entropy_coeff": args.entropy_coeff, "old_logprobs": "rollout"}
    optimizer = {"lr": args.lr, "weight_decay": 0.0, "grad_clip": 1.0, "lr_schedule": args.lr_schedule,
                 "total_steps": args.steps, "min_lr_ratio": args.min_lr_ratio}
    sampling = {"temperature": 1.0, "max_tokens": args.max_tokens, "ignore_eos": True}

    rows = []
    t_start = time.time()
    for step in range(1, args.steps + 1):
        t0 = time.time()
        letters = [rng.choice(args.letters) for _ in range(args.batch)]
        rollout = client.run_job("/v1/rollouts", {
            "groups": [{"prompt_ids": prompt_ids[c], "n": args.n} for c in letters],
            "sampling": dict(sampling, seed=rng.randrange(1, 2**31))})

        groups, rewards, exact, n_tok = [], [], 0, 0
        for c, g in zip(letters, rollout["groups"]):
            resps = []
            for r in g["responses"]:
                rw = score(r["token_ids"], ord(c), alphabet, args.other_letter)
                rewards.append(rw)
                exact += sum(1 for t in r["token_ids"] if t == ord(c))
                n_tok += len(r["token_ids"])
                resps.append({"token_ids": r["token_ids"], "reward": rw, "logprobs": r["logprobs"],
                              "finish_reason": r["finish_reason"]})
            groups.append({"prompt_ids": g["prompt_ids"], "responses": resps})

        upd = client.run_job("/v1/updates", {"groups": groups, "algorithm": algorithm, "optimizer": optimizer})
        m, tok = upd["metrics"], upd["tokens"]
        now = time.time()
        row = {"step": step, "mean_reward": sum(rewards) / len(rewards), "exact_frac": exact / max(n_tok, 1),
               "kl": float(m["kl"]), "loss": float(m["loss"]), "entropy": float(m["entropy"]),
               "grad_norm": float(m["grad_norm"]), "tokens_packed": tok["packed"],
               "tokens_standard": tok["standard"], "policy_version": upd["policy_version_after"],
               "seconds": now - t0, "elapsed": now - t_start}
        rows.append(row)
        print("step %4d  mean reward %.3f  right %.3f  kl %.4f  loss %+.4f  entropy %.3f  "
              "tokens packed %d / standard %d  %.2fs"
              % (step, row["mean_reward"], row["exact_frac"], row["kl"], row["loss"], row["entropy"],
                 row["tokens_packed"], row["tokens_standard"], row["seconds"]), flush=True)

    csv_path = os.path.join(args.out, "train_toy.csv")
    svg_path = os.path.join(args.out, "train_toy_curve.svg")
    write_csv(csv_path, rows)
    last = rows[-args.last:]
    final = sum(r["mean_reward"] for r in last) / len(last)
    write_svg(svg_path, rows, "grpod train_toy: repeat one of %r (%d steps, %.0f s, %s)"
              % (args.letters, len(rows), rows[-1]["elapsed"], model["backend"]))
    print("wrote %s and %s (%.1f s)" % (csv_path, svg_path, rows[-1]["elapsed"]))
    print("final mean reward %.3f" % final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
