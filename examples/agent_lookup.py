#!/usr/bin/env python3
# agent_lookup.py — multi-turn RL with a tool, through a running grpod's HTTP API alone (Python
# standard library and clients/python): the shape of an agent loop, token in / token out, on the
# daemon's built-in tiny model (random weights, byte-level vocab), small enough to learn on a CPU.
#
# The task ("look it up"): the prompt is `Look up: ` ; the policy speaks one token (its "call");
# the tool answers `\n= y` with y a letter drawn at random for that trajectory; the policy speaks
# one more token, and earns 1 when it is y. A policy that ignores the tool earns 1/26 at best
# (1/k with --letters of k), so a mean reward near 1 means it reads the tool's output. 200 steps
# lift it from 0.009 to 0.75 in ~3 minutes on 2 CPU cores.
#
# Each step:
#   1. turn 1: one rollout job, --batch groups x --n trajectories, one token each;
#   2. the tool runs here, on each trajectory's tokens;
#   3. turn 2: one rollout job of --batch x --n groups of one response, each prompt the prompt,
#      the trajectory's turn-1 token and the tool's ids — ids, never re-tokenized text. grpod's
#      prefix cache holds the prompt's keys and values from turn 1, so only the new ids are
#      prefilled (`cached_tokens` in the result; the script sums them);
#   4. the update trains each trajectory as one response, [turn 1, tool ids, turn 2], with a
#      `loss_mask` of 0 on the tool's ids: they are context, attended to and never trained (veRL's
#      response_mask, slime's loss_mask); GRPO advantages per group of --n trajectories.
# The recipe is train_toy.py's (lr 1e-3 cosine to 1e-4, KL 0.05 against the initial model,
# entropy bonus 0.01).
#
# On a real model the loop is the same: render the chat template once (POST /v1/tokenize with
# messages), append each turn's token_ids and the tool's ids (tokenized once, as the template
# wraps a tool message), and pass the trajectory back with loss_mask 0 wherever the tokens are
# not the policy's own; rollouts and updates take the ids verbatim.
import argparse
import os
import random
import string
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
from grpod_client import Client  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description="multi-turn GRPO with a lookup tool through a running grpod; see the header")
    p.add_argument("--url", default="http://127.0.0.1:8780", help="grpod base URL")
    p.add_argument("--steps", type=int, default=200, help="training steps (two rollouts + one update each)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--letters", default=string.ascii_lowercase, help="the letters the tool draws from")
    p.add_argument("--batch", type=int, default=16, help="groups per step")
    p.add_argument("--n", type=int, default=16, help="trajectories per group")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--decay-steps", type=int, default=200, help="cosine horizon in optimizer steps")
    p.add_argument("--kl-coef", type=float, default=0.05)
    p.add_argument("--entropy-coeff", type=float, default=0.01)
    p.add_argument("--last", type=int, default=10, help="steps averaged for the first and final mean reward")
    p.add_argument("--api-key", default=os.environ.get("GRPOD_API_KEY"))
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    c = Client(a.url, a.api_key)
    c.wait_ready(120)
    rng = random.Random(a.seed)
    prompt = c.tokenize("Look up: ")
    tool = {ch: c.tokenize("\n= " + ch) for ch in a.letters}
    sampling = {"temperature": 1.0, "max_tokens": 1, "ignore_eos": True}
    algorithm = {"adv_estimator": "grpo", "kl_coef": a.kl_coef, "entropy_coeff": a.entropy_coeff}
    optimizer = {"lr": a.lr, "weight_decay": 0.0, "grad_clip": 1.0, "lr_schedule": "cosine",
                 "total_steps": a.decay_steps, "min_lr_ratio": 0.1}
    rewards, cached, t0 = [], 0, time.time()
    for step in range(1, a.steps + 1):
        t1 = c.rollouts([{"prompt_ids": prompt, "n": a.n} for _ in range(a.batch)],
                        dict(sampling, seed=rng.randrange(1, 2**31)))
        trajs = []   # (group, turn-1 ids, the tool's letter, its ids)
        for gi, g in enumerate(t1["groups"]):
            for r in g["responses"]:
                y = rng.choice(a.letters)
                trajs.append((gi, r["token_ids"], y, tool[y]))
        t2 = c.rollouts([{"prompt_ids": prompt + ids + tids, "n": 1} for _, ids, _, tids in trajs],
                        dict(sampling, seed=rng.randrange(1, 2**31)))
        cached += t2["usage"]["prompt_tokens_details"]["cached_tokens"]
        groups = [{"prompt_ids": prompt, "responses": []} for _ in range(a.batch)]
        step_rewards = []
        for (gi, ids, y, tids), g2 in zip(trajs, t2["groups"]):
            said = g2["responses"][0]["token_ids"]
            rw = 1.0 if said == [ord(y)] else 0.0
            step_rewards.append(rw)
            groups[gi]["responses"].append({"token_ids": ids + tids + said, "reward": rw,
                                            "loss_mask": [1] * len(ids) + [0] * len(tids) + [1] * len(said)})
        c.update(groups=groups, algorithm=algorithm, optimizer=optimizer)
        rewards.append(sum(step_rewards) / len(step_rewards))
        print("step %4d  mean reward %.3f  %.2fs" % (step, rewards[-1], time.time() - t0), flush=True)
    k = min(a.last, len(rewards))
    print("prompt ids copied from the prefix cache in turn 2: %d" % cached)
    print("first mean reward %.3f" % (sum(rewards[:k]) / k))
    print("final mean reward %.3f" % (sum(rewards[-k:]) / k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
