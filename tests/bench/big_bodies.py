#!/usr/bin/env python3
"""big_bodies.py — what a maximum-size request body costs the daemon in memory: 8 MiB
POST /v1/updates bodies of one-digit token ids (json-c's worst case, ~3 bytes an id), of ids
0..255, of ids + logprobs, of 2.8 million empty objects, and of 1024 x 64 responses of six
tokens (the most json-c objects the default limits allow), one at a time and four at once,
against a fresh daemon. Each body names a wrong expected_policy_version, so it is parsed and
validated whole, then refused with 409 before the store (or 413 when over a limit): what is
measured is the HTTP side. Per run: RSS before, the peak (VmHWM, reset through
/proc/PID/clear_refs before the run) and RSS 1 s after, and the peak over the bodies' size.

  python3 tests/bench/big_bodies.py [./grpod]"""
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile_inputs as hostile  # noqa: E402  (start, status)

GRPOD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "./grpod")
J = {"Content-Type": "application/json"}


def body(with_logprobs, top, limit=8 << 20):
    rnd = random.Random(20)
    groups, size = [], 40
    while True:
        ids = [rnd.randrange(top) for _ in range(2000)]
        r = {"token_ids": ids, "reward": 1.0}
        if with_logprobs:
            r["logprobs"] = [-round(rnd.random() * 8, 6) for _ in ids]
        g = {"prompt_ids": ids[:500], "responses": [r] * (1 if top > 10 else 2)}    # <= 1024 groups
        n = len(json.dumps(g)) + 2
        if size + n > limit - 64:
            break
        groups.append(g)
        size += n
    return json.dumps({"groups": groups, "expected_policy_version": 999,
                       "algorithm": {"old_logprobs": "rollout" if with_logprobs else "recompute"}})


def empty_objects(limit=8 << 20):
    """8 MiB of {}: ~800 bytes of json-c each."""
    return '{"groups":[' + ",".join(["{}"] * (limit // 3 - 16)) + "]}"


def short_responses():
    """The most json-c-heavy body the default limits allow: 1024 groups x 64 responses of 6 tokens."""
    r = '{"token_ids":[5,2,3,4,5,6],"reward":0.5,"finish_reason":"stop","logprobs":[-1,-2,-3,-4,-5,-6]}'
    g = '{"prompt_ids":[1,2],"responses":[' + ",".join([r] * 64) + "]}"
    return '{"expected_policy_version":999,"groups":[' + ",".join([g] * 1024) + "]}"


def main():
    tmp = tempfile.mkdtemp(prefix="grpod_bodies_")
    p, url = hostile.start(GRPOD, tmp + "/data")
    try:
        print("grpod %s; RSS at start %.0f MiB" % (GRPOD, hostile.status(p.pid, "VmRSS:")))
        for name, make in (("ids 0..9", lambda: body(False, 10)), ("ids 0..255", lambda: body(False, 256)),
                           ("ids + logprobs", lambda: body(True, 256)), ("{} x 2.8 M", empty_objects),
                           ("64 Ki short resps", short_responses)):
            raw = make()
            for conc in (1, 4):
                before = hostile.status(p.pid, "VmRSS:")
                with open("/proc/%d/clear_refs" % p.pid, "w") as f:
                    f.write("5")
                codes, t = [], time.time()

                def post():
                    codes.append(requests.post(url + "/v1/updates", data=raw, headers=J, timeout=600).status_code)
                th = [threading.Thread(target=post) for _ in range(conc)]
                for x in th:
                    x.start()
                for x in th:
                    x.join()
                dt = time.time() - t
                peak = hostile.status(p.pid, "VmHWM:")
                time.sleep(1)
                after = hostile.status(p.pid, "VmRSS:")
                print("%-17s x%d (%.2f MiB each): %s in %5.2f s; RSS %4.0f MiB before, peak %4.0f (+%.0f MiB = "
                      "%.1fx the bodies), %4.0f after" % (
                          name, conc, len(raw) / 2 ** 20, sorted(set(codes)), dt, before,
                          peak, peak - before, (peak - before) / (conc * len(raw) / 2 ** 20), after))
    finally:
        p.terminate()
        p.wait(60)
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
