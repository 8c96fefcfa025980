# test_trees.py — tree-shaped groups through the update API: responses that share turns beyond the
# prompt (8 trajectories x 4 turns, turn 1 shared by all, turn 2 by pairs, turns 3-4 each its
# own) are detected from their token ids and laid out as a prefix trie (engine/model/pack.h), each
# shared turn once. The result's tokens.packed is the trie's count (fewer than the one-trunk
# layout's and than P + NR), tokens.standard is N(P+R), and /metrics counts both; the same
# update with turn 2 unshared packs the one-trunk count.
import random
import re

P, TURNS, N = 10, (3, 4, 5, 6), 8


def group(rnd, share):
    """prompt ids and N responses whose turn k is shared by the trajectories i // share[k] picks;
    the turns of a depth begin with distinct ids (no sharing by chance)"""
    draw = lambda n: [rnd.randrange(3, 250) for _ in range(n)]
    prompt, resp = draw(P), [[] for _ in range(N)]
    for k, tl in enumerate(TURNS):
        turns = [[f] + draw(tl - 1) for f in rnd.sample(range(3, 250), N // share[k])]
        for i in range(N):
            resp[i] += turns[i // share[k]]
    return prompt, resp


def update(d, prompt, resp):
    u = d.wait_job(d.submit("/v1/updates", {"groups": [{"prompt_ids": prompt, "responses": [
        {"token_ids": r, "reward": float(i % 3)} for i, r in enumerate(resp)]}], "optimizer": {"lr": 1e-3}}))
    assert u["status"] == "done", u
    return u["result"]["tokens"]


def metric(d, phase):
    return int(float(re.search(r'^grpod_tokens_total\{phase="%s"\} (\S+)$' % phase, d.get("/metrics").text, re.M).group(1)))


def test_update_packs_the_trie(make_daemon, tmp_path):
    d = make_daemon(tmp_path / "d")
    rnd = random.Random(35)
    R = sum(TURNS)
    tok = update(d, *group(rnd, (8, 2, 1, 1)))
    trie = P + TURNS[0] + 4 * TURNS[1] + N * (TURNS[2] + TURNS[3])
    assert tok["packed"] == trie and tok["standard"] == N * (P + R), tok
    assert metric(d, "update_packed") == trie and metric(d, "update_standard") == N * (P + R)
    one_trunk = update(d, *group(rnd, (8, 1, 1, 1)))
    assert one_trunk["packed"] == P + TURNS[0] + N * (R - TURNS[0]), one_trunk
    assert trie < one_trunk["packed"] < P + N * R
