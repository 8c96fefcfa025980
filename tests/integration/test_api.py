# test_api.py — every endpoint of a real grpod over HTTP, the OpenAPI document against the
# served routes, rollout → update → rollout, and every bad-input case (4xx JSON error naming
# the field, the daemon keeps serving).
import json
import re

import pytest

from test_openapi import SERVED

PROMPT = {"prompt": "What is 6 times 7?", "n": 4, "reward": {"type": "contains", "answer": "a"}}


def rollout(d, groups=None, **sampling):
    s = {"max_tokens": 8, "seed": 7, **sampling}
    return d.wait_job(d.submit("/v1/rollouts", {"groups": groups or [PROMPT], "sampling": s}))


def test_health_ready_model(shared_daemon):
    d = shared_daemon
    assert d.get("/healthz").json() == {"status": "ok"}
    r = d.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"
    m = d.get("/v1/model").json()
    assert m["arch"] == "qwen3" and m["backend"] == "cpu" and m["vocab"] > 0 and m["max_model_len"] > 0
    assert isinstance(m["policy_version"], int)


def test_openapi_matches_served_routes(shared_daemon):
    d = shared_daemon
    doc = d.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    served = SERVED   # one list of the routes, test_openapi.py's
    assert documented == served
    # every documented route is served (not 404/405), and unknown ones are 404/405
    for method, path in documented:
        r = d.post(path.replace("{id}", "j_0000000000000000"), b"{}") if method == "POST" else \
            d.get(path.replace("{id}", "j_0000000000000000")) if method == "GET" else \
            d.delete(path.replace("{id}", "j_0000000000000000"))
        assert r.status_code not in (405,), (method, path, r.status_code)
        if "{id}" not in path:
            assert r.status_code != 404, (method, path)
    assert d.get("/v1/nope").status_code == 404
    assert d.delete("/v1/model").status_code == 405
    assert d.get("/v1/rollouts").status_code == 405


def test_tokenize_detokenize(shared_daemon):
    d = shared_daemon
    r = d.post("/v1/tokenize", {"prompt": "hello"})
    assert r.status_code == 200
    ids = r.json()["tokens"]
    assert r.json()["count"] == len(ids) > 0
    back = d.post("/v1/detokenize", {"tokens": ids, "skip_special_tokens": True}).json()["prompt"]
    assert back == "hello"
    r = d.post("/v1/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["count"] > 2


def test_rollout_result_shape_and_seed(shared_daemon):
    d = shared_daemon
    j = rollout(d)
    assert j["status"] == "done", j
    res = j["result"]
    assert isinstance(res["policy_version"], int)
    (g,) = res["groups"]
    assert len(g["responses"]) == 4 and len(g["prompt_ids"]) > 0
    rewards = [x["reward"] for x in g["responses"]]
    assert abs(g["reward_mean"] - sum(rewards) / 4) < 1e-6
    for x in g["responses"]:
        assert len(x["logprobs"]) == len(x["token_ids"]) > 0
        assert all(lp <= 0 for lp in x["logprobs"])
        assert x["finish_reason"] in ("stop", "length")
        assert isinstance(x["text"], str)
    assert res["usage"]["completion_tokens"] == sum(len(x["token_ids"]) for x in g["responses"])
    assert "total" in res["timings_ms"]
    # the same seed gives the same tokens (same policy version)
    j2 = rollout(d)
    if j2["result"]["policy_version"] == res["policy_version"]:
        assert [x["token_ids"] for x in j2["result"]["groups"][0]["responses"]] == \
               [x["token_ids"] for x in g["responses"]]
    # prompt_ids and messages prompts; no reward spec → reward null
    j3 = rollout(d, [{"prompt_ids": g["prompt_ids"], "n": 1},
                     {"messages": [{"role": "user", "content": "Say 42"}], "n": 2,
                      "reward": {"type": "math", "answer": "42"}}])
    assert j3["status"] == "done"
    g0, g1 = j3["result"]["groups"]
    assert g0["reward_mean"] is None and g0["responses"][0]["reward"] is None
    assert len(g1["responses"]) == 2 and g1["reward_std"] >= 0


def test_jobs_list_and_cancel(shared_daemon):
    d = shared_daemon
    # a rollout of its own: the list must not depend on what earlier tests submitted (run alone,
    # or after a test that failed before submitting, the list was empty)
    mine = rollout(d)["id"]
    r = d.get("/v1/jobs?kind=rollout&limit=5")
    assert r.status_code == 200
    jobs = r.json()["jobs"]
    assert 0 < len(jobs) <= 5 and all(j["kind"] == "rollout" for j in jobs)
    assert jobs[0]["id"] == mine, jobs   # newest first
    assert d.get("/v1/jobs?status=bogus").status_code == 400
    # cancel: a long job runs; the second is queued or (continuous batching) running beside it,
    # and long enough (256 tokens) that it has not finished when the DELETE arrives
    long = d.submit("/v1/rollouts", {"groups": [{"prompt": "x", "n": 8}],
                                     "sampling": {"max_tokens": 256, "ignore_eos": True, "seed": 1}})
    queued = d.submit("/v1/rollouts", {"groups": [{"prompt": "y", "n": 1}],
                                       "sampling": {"max_tokens": 256, "ignore_eos": True}})
    r = d.delete("/v1/jobs/" + queued)
    assert r.status_code in (200, 202), r.text
    j = d.wait_job(queued)
    assert j["status"] in ("cancelled", "done")
    if r.status_code == 200:
        assert j["status"] == "cancelled"
    d.wait_job(long)
    assert d.delete("/v1/jobs/" + long).status_code == 409
    assert d.get("/v1/jobs/j_0000000000000000").status_code == 404


def test_rollout_update_rollout(shared_daemon):
    d = shared_daemon
    j = rollout(d, [{"prompt": "abc", "n": 4, "reward": {"type": "contains", "answer": "e"}},
                    {"prompt": "xyz", "n": 4, "reward": {"type": "regex", "answer": "[a-m]"}}],
                max_tokens=12, temperature=1.0)
    v0 = j["result"]["policy_version"]
    groups = j["result"]["groups"]
    # give explicit rewards so the update has a non-zero advantage whatever was sampled
    upd_groups = [{"prompt_ids": g["prompt_ids"],
                   "responses": [{"token_ids": x["token_ids"], "reward": float(i % 2)}
                                 for i, x in enumerate(g["responses"])]} for g in groups]
    lp_req = {"groups": [{"prompt_ids": g["prompt_ids"], "responses": [{"token_ids": x["token_ids"]}
                                                                       for x in g["responses"]]}
                         for g in groups]}
    before = d.post("/v1/logprobs", lp_req)
    assert before.status_code == 200, before.text
    # logprobs under the policy equal the rollout's own (same version, temperature 1)
    for g, s in zip(groups, before.json()["groups"]):
        for x, y in zip(g["responses"], s["responses"]):
            assert max(abs(a - b) for a, b in zip(x["logprobs"], y["logprobs"])) < 1e-3
    u = d.wait_job(d.submit("/v1/updates", {"groups": upd_groups, "optimizer": {"lr": 1e-2},
                                            "algorithm": {"kl_coef": 0.0},
                                            "expected_policy_version": v0}))
    assert u["status"] == "done", u
    res = u["result"]
    assert res["policy_version_before"] == v0 and res["policy_version_after"] == v0 + 1
    assert res["tokens"]["packed"] < res["tokens"]["standard"]
    for k in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "grad_norm", "lr", "actor/pg_clipfrac",
              "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/kl_loss", "actor/entropy"):
        assert k in res["metrics"]
    # one optimizer step: veRL's pg_clipfrac is grpod's clip_frac; no reference, no kl_loss
    assert res["metrics"]["actor/pg_clipfrac"] == pytest.approx(res["metrics"]["clip_frac"], abs=1e-12)
    assert res["metrics"]["actor/kl_loss"] == 0 and res["metrics"]["actor/entropy"] > 0
    # loss_scale_factor's default without a rollout job: the longest response of the update
    assert res["metrics"]["loss_scale_factor"] == max(len(x["token_ids"]) for g in upd_groups for x in g["responses"])
    after = d.post("/v1/logprobs", lp_req).json()
    diff = max(abs(a - b) for g0, g1 in zip(before.json()["groups"], after["groups"])
               for r0, r1 in zip(g0["responses"], g1["responses"])
               for a, b in zip(r0["logprobs"], r1["logprobs"]))
    assert diff > 1e-4, "logprobs did not change after an update"
    assert after["policy_version"] == v0 + 1
    j2 = rollout(d)
    assert j2["result"]["policy_version"] == v0 + 1
    # stale expected_policy_version → 409 at submit
    r = d.post("/v1/updates", {"groups": upd_groups, "expected_policy_version": v0})
    assert r.status_code == 409 and r.json()["error"]["field"] == "expected_policy_version"
    # a bad loss_scale_factor is a 400 naming it
    r = d.post("/v1/updates", {"groups": upd_groups, "algorithm": {"loss_scale_factor": -3}})
    assert r.status_code == 400 and r.json()["error"]["field"] == "algorithm.loss_scale_factor", r.text
    # train on a finished rollout by id: loss_scale_factor defaults to the rollout's max_tokens
    u2 = d.wait_job(d.submit("/v1/updates", {"rollout_job_id": j["id"], "algorithm": {
        "filter_groups": True, "loss_agg_mode": "seq-mean-token-sum-norm", "kl_type": "k3+"}}))
    assert u2["status"] == "done", u2
    assert u2["result"]["policy_version_after"] == v0 + 2
    assert u2["result"]["metrics"]["loss_scale_factor"] == 12
    # loss masks: context tokens (0) are attended to and not trained; a response all 0 is dropped
    masked = [{"prompt_ids": g["prompt_ids"],
               "responses": [dict(x, loss_mask=[0] * len(x["token_ids"]) if i == 0 else
                                  [(i + t) % 3 != 0 for t in range(len(x["token_ids"]))])
                             for i, x in enumerate(g["responses"])]} for g in upd_groups]
    for g in masked:
        for x in g["responses"]:
            x["loss_mask"] = [int(v) for v in x["loss_mask"]]
    u3 = d.wait_job(d.submit("/v1/updates", {"groups": masked, "algorithm": {"kl_coef": 0.0}}))
    assert u3["status"] == "done", u3
    assert u3["result"]["policy_version_after"] == v0 + 3
    # veRL's rollout correction against the rollout's own logprobs (sampled at version v0): IcePop
    # weights and token rejection, with its rollout_corr/ metrics
    corr = [{"prompt_ids": g["prompt_ids"],
             "responses": [{"token_ids": x["token_ids"], "logprobs": x["logprobs"], "reward": float(i % 2)}
                           for i, x in enumerate(g["responses"])]} for g in groups]
    u4 = d.wait_job(d.submit("/v1/updates", {"groups": corr, "algorithm": {
        "kl_coef": 0.0, "rollout_is": "token", "rollout_is_threshold": "0.5_2.0",
        "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}}))
    assert u4["status"] == "done", u4
    m4 = u4["result"]["metrics"]
    for k in ("kl", "k3_kl", "rollout_is_mean", "rollout_is_oob_ratio", "rollout_rs_masked_fraction",
              "logprob_abs_diff_mean", "logprob_abs_diff_max"):
        assert "rollout_corr/" + k in m4, m4
    assert m4["rollout_corr/logprob_abs_diff_max"] >= m4["rollout_corr/logprob_abs_diff_mean"] > 0
    assert "rollout_corr/kl" not in u3["result"]["metrics"]
    # reference model logprobs stay those of the start
    ref = d.post("/v1/logprobs", dict(lp_req, model="reference"))
    assert ref.status_code == 200 and ref.json()["model"] == "reference"


def test_checkpoint_and_metrics(shared_daemon):
    d = shared_daemon
    j = d.wait_job(d.submit("/v1/checkpoints", {}))
    assert j["status"] == "done", j
    cks = d.get("/v1/checkpoints").json()["checkpoints"]
    assert cks and cks[0]["id"] == j["result"]["id"]
    text = d.get("/metrics").text
    for name in ("grpod_jobs{", "grpod_queue_depth", "grpod_tokens_total{phase=\"rollout_completion\"}",
                 "grpod_packed_token_ratio", "grpod_seconds_total{phase=\"rollout\"}", "grpod_policy_version",
                 "grpod_http_requests_total{method=\"POST\",route=\"/v1/rollouts\",code=\"202\"}"):
        assert name in text, name
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert re.match(r'^[a-z_]+(\{.*\})? -?[0-9.e+]+$', line), line


LONG = "x" * 5000
BAD = [
    # (path, body, field or None)
    ("/v1/rollouts", b"{not json", None),
    ("/v1/rollouts", b"", None),
    ("/v1/rollouts", b"[1,2]", None),
    ("/v1/rollouts", b'{"groups": []} trailing', None),
    ("/v1/rollouts", {}, "groups"),
    ("/v1/rollouts", {"groups": "x"}, "groups"),
    ("/v1/rollouts", {"groups": [{"prompt": "a"}], "bogus": 1}, "bogus"),
    ("/v1/rollouts", {"groups": [{"prompt": "a", "n": 0}]}, "groups[0].n"),
    ("/v1/rollouts", {"groups": [{"prompt": "a", "n": 100000}]}, "groups[0].n"),
    ("/v1/rollouts", {"groups": [{"prompt": "a", "n": "2"}]}, "groups[0].n"),
    ("/v1/rollouts", {"groups": [{"prompt": "a", "n": 1.5}]}, "groups[0].n"),
    ("/v1/rollouts", {"groups": [{"n": 1}]}, "groups[0].prompt"),
    ("/v1/rollouts", {"groups": [{"prompt": "a", "prompt_ids": [1]}]}, "groups[0].prompt"),
    ("/v1/rollouts", {"groups": [{"prompt_ids": [1, 999999]}]}, "groups[0].prompt_ids"),
    ("/v1/rollouts", {"groups": [{"prompt_ids": [-1]}]}, "groups[0].prompt_ids"),
    ("/v1/rollouts", {"groups": [{"prompt_ids": []}]}, "groups[0].prompt_ids"),
    ("/v1/rollouts", {"groups": [{"prompt": "a", "reward": {"type": "vibes"}}]}, "groups[0].reward.type"),
    ("/v1/rollouts", {"groups": [{"prompt": "a", "reward": {"type": "math"}}]}, None),
    ("/v1/rollouts", {"groups": [{"prompt": "a", "reward": {"type": "regex", "answer": "("}}]}, None),
    ("/v1/rollouts", {"groups": [{"prompt": "a"}], "sampling": {"temperature": -1}}, "sampling.temperature"),
    ("/v1/rollouts", {"groups": [{"prompt": "a"}], "sampling": {"max_tokens": 10 ** 9}}, "sampling.max_tokens"),
    ("/v1/rollouts", {"groups": [{"prompt": "a"}], "sampling": {"top_p": 0}}, "sampling.top_p"),
    ("/v1/rollouts", {"groups": [{"prompt": "a"}], "sampling": {"stop": [1]}}, "sampling.stop[0]"),
    ("/v1/rollouts", {"groups": [{"prompt": "a"}], "sampling": {"seeed": 1}}, "sampling.seeed"),
    ("/v1/rollouts", {"groups": [{"prompt": LONG}], "sampling": {"max_tokens": 4000}}, "groups[0]"),
    ("/v1/rollouts", {"groups": [{"messages": [{"role": "wizard", "content": "x"}]}]}, "groups[0].messages[0].role"),
    ("/v1/updates", {}, "groups"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2]}]}]}, "groups[0].responses[0].reward"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": "1"}]}]}, "groups[0].responses[0].reward"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1}]}],
                     "algorithm": {"adv_estimator": "ppo?"}}, "algorithm.adv_estimator"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1}]}],
                     "algorithm": {"old_logprobs": "rollout"}}, "groups[0].responses[0].logprobs"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1}]}],
                     "optimizer": {"betas": [0.9]}}, "optimizer.betas"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1},
                                                                   {"token_ids": [2, 3], "reward": 0, "loss_mask": [1]}]}]},
     "groups[0].responses[1].loss_mask"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1}]},
                                {"prompt_ids": [1], "responses": [{"token_ids": [2, 3], "reward": 0, "loss_mask": [1, 2]}]}]},
     "groups[1].responses[0].loss_mask"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1}]}],
                     "algorithm": {"rollout_is": "token"}}, "groups[0].responses[0].logprobs"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1, "logprobs": [-1.0]}]}],
                     "algorithm": {"rollout_is": "token", "old_logprobs": "rollout"}}, "algorithm.rollout_is"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1, "logprobs": [-1.0]}]}],
                     "algorithm": {"rollout_rs": "token_k2"}}, "algorithm.rollout_rs_threshold"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1, "logprobs": [-1.0]}]}],
                     "algorithm": {"rollout_rs": "token_k2", "rollout_rs_threshold": "0.5_2"}}, "algorithm.rollout_rs_threshold"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1, "logprobs": [-1.0]}]}],
                     "algorithm": {"rollout_is": "token", "rollout_is_threshold": "2_0.5"}}, "algorithm.rollout_is_threshold"),
    ("/v1/updates", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1, "logprobs": [-1.0]}]}],
                     "algorithm": {"rollout_rs": "token_k1,seq_sum_k3", "rollout_rs_threshold": 2}}, "algorithm.rollout_rs"),
    ("/v1/updates", {"rollout_job_id": "nope"}, "rollout_job_id"),
    ("/v1/updates", {"rollout_job_id": "j_0123456789abcdef"}, "rollout_job_id"),
    ("/v1/logprobs", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2]}]}], "model": "x"}, "model"),
    ("/v1/logprobs", {"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [1e9]}]}]}, "groups[0].responses[0].token_ids"),
    ("/v1/tokenize", {"prompt": 5}, "prompt"),
    ("/v1/tokenize", {}, "prompt"),
    ("/v1/detokenize", {"tokens": [1, "a"]}, "tokens"),
    ("/v1/checkpoints", {"x": 1}, "x"),
]


@pytest.mark.parametrize("path,body,field", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input(shared_daemon, path, body, field):
    d = shared_daemon
    r = d.post(path, body if isinstance(body, (bytes, str)) else json.dumps(body).encode(),
               headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["code"] and err["message"]
    if field is not None:
        assert err.get("field") == field, err
    assert d.get("/healthz").status_code == 200


def test_limits_and_body_size(make_daemon):
    d = make_daemon(args=["--max-body-bytes", "2048", "--max-n", "3", "--max-queued-jobs", "1"])
    r = d.post("/v1/rollouts", b'{"groups":[{"prompt":"' + b"a" * 4000 + b'"}]}')
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    r = d.post("/v1/rollouts", {"groups": [{"prompt": "a", "n": 4}]})
    assert r.status_code == 400 and "1..3" in r.json()["error"]["message"]
    assert d.get("/healthz").status_code == 200


def test_auth(make_daemon, tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret-key-123\n")
    d = make_daemon(args=["--api-key-file", str(key)])
    assert d.get("/healthz").status_code == 200
    assert d.get("/v1/model").status_code == 401
    r = d.get("/v1/model", headers={"Authorization": "Bearer wrong-key-000"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert d.get("/v1/model", headers={"Authorization": "Bearer s3cret-key-123"}).status_code == 200


def test_config_precedence(make_daemon, tmp_path):
    cfg = tmp_path / "grpod.conf"
    cfg.write_text("# test\nmax-n = 3\nlog-level = warn\n")
    # env says 2, config says 3, flag says 5: flag wins
    d = make_daemon(args=["--config", str(cfg), "--max-n", "5"], env={"GRPOD_MAX_N": "2"})
    r = d.post("/v1/rollouts", {"groups": [{"prompt": "a", "n": 6}], "sampling": {"max_tokens": 1}})
    assert "1..5" in r.json()["error"]["message"]
    d.stop()
    # no flag: config (3) beats env (2)
    d2 = make_daemon(args=["--config", str(cfg)], env={"GRPOD_MAX_N": "2"})
    r = d2.post("/v1/rollouts", {"groups": [{"prompt": "a", "n": 6}], "sampling": {"max_tokens": 1}})
    assert "1..3" in r.json()["error"]["message"]
    d2.stop()
    # env alone
    d3 = make_daemon(env={"GRPOD_MAX_N": "2"})
    r = d3.post("/v1/rollouts", {"groups": [{"prompt": "a", "n": 6}], "sampling": {"max_tokens": 1}})
    assert "1..2" in r.json()["error"]["message"]
