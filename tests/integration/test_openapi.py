# test_openapi.py — /openapi.json checked against what the server does: every documented
# route is served and every served route documented (the router and the document come from
# one table, api/openapi.c); request schemas say additionalProperties: false and the server
# indeed refuses an unknown member, naming it; every documented member of a request (and of
# sampling / algorithm / optimizer) is one the validators know; documented bounds are the
# server's (a value just outside is a 400 naming the field); the query parameters are the ones
# the handlers read; /v1 routes carry the bearer security scheme.
import copy

import pytest

SERVED = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics"), ("GET", "/openapi.json"),
          ("POST", "/v1/rollouts"), ("POST", "/v1/updates"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/{id}"),
          ("DELETE", "/v1/jobs/{id}"), ("GET", "/v1/model"), ("POST", "/v1/checkpoints"), ("GET", "/v1/checkpoints"),
          ("POST", "/v1/logprobs"), ("POST", "/v1/tokenize"), ("POST", "/v1/detokenize"), ("GET", "/v1/models"),
          ("GET", "/v1/models/{id}"), ("GET", "/health"), ("GET", "/version"), ("POST", "/tokenize"),
          ("POST", "/detokenize"), ("GET", "/tokenizer_info"),
          ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/dashboard"),
          ("GET", "/v1/dashboard"), ("POST", "/v1/jobs/{id}/requeue"), ("DELETE", "/v1/checkpoints/{id}"),
          ("POST", "/v1/cluster/join"), ("GET", "/v1/cluster/next"), ("POST", "/v1/cluster/done"), ("GET", "/v1/cluster/beat")}

# a valid body per request schema, and where its nested sections sit
BASE = {
    "RolloutRequest": ({"groups": [{"prompt": "hi", "n": 1}], "sampling": {"max_tokens": 1}},
                       {"Sampling": "sampling", "RolloutGroup": "groups.0"}),
    "UpdateRequest": ({"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2], "reward": 1.0}]}]},
                      {"Algorithm": "algorithm", "Optimizer": "optimizer"}),
    "LogprobsRequest": ({"groups": [{"prompt_ids": [1], "responses": [{"token_ids": [2]}]}]}, {}),
    "TokenizeRequest": ({"prompt": "hi"}, {}),
    "DetokenizeRequest": ({"tokens": [72]}, {}),
    "CompletionRequest": ({"prompt": "hi", "max_tokens": 1}, {}),
    "ChatCompletionRequest": ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, {}),
    "CheckpointRequest": ({}, {}),
}
ROUTE_OF = {}


@pytest.fixture(scope="module")
def doc(shared_daemon):
    d = shared_daemon.get("/openapi.json").json()
    for path, item in d["paths"].items():
        for m, op in item.items():
            rb = op.get("requestBody")
            if rb:
                ROUTE_OF[rb["content"]["application/json"]["schema"]["$ref"].split("/")[-1]] = path
    return d


def at(body, where):
    for k in where.split("."):
        body = body[int(k)] if k.isdigit() else body.setdefault(k, {})
    return body


def test_routes_and_security(shared_daemon, doc):
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert documented == SERVED
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"]["bearerAuth"]["description"]}
    for p, item in doc["paths"].items():
        for m, op in item.items():
            assert ("security" in op) == p.startswith("/v1/"), (m, p)


def test_query_parameters_are_the_handlers(shared_daemon, doc):
    d = shared_daemon
    params = {(p, q["name"]) for p, item in doc["paths"].items() for op in item.values()
              for q in op.get("parameters", []) if q["in"] == "query"}
    assert params == {("/v1/jobs", "kind"), ("/v1/jobs", "status"), ("/v1/jobs", "limit"), ("/v1/jobs", "after"),
                      ("/v1/jobs/{id}", "wait"), ("/v1/dashboard", "after")}
    bad = {"kind": "bogus", "status": "bogus", "limit": "0", "wait": "-1", "after": "x"}
    for path, name in params:
        r = d.get(path.replace("{id}", "j_0000000000000000") + "?%s=%s" % (name, bad[name]))
        assert r.status_code == 400 and r.json()["error"]["field"] == name, (path, name, r.text)
    limit = doc["paths"]["/v1/jobs"]["get"]["parameters"][2]["schema"]
    assert d.get("/v1/jobs?limit=%d" % limit["maximum"]).status_code == 200
    assert d.get("/v1/jobs?limit=%d" % (limit["maximum"] + 1)).status_code == 400


def test_request_schemas_match_the_validators(shared_daemon, doc):
    d = shared_daemon
    schemas = doc["components"]["schemas"]
    assert set(BASE) == set(ROUTE_OF), set(BASE) ^ set(ROUTE_OF)
    for name, (base, nested) in BASE.items():
        path = ROUTE_OF[name]
        r = d.post(path, base)
        assert r.status_code in (200, 202), (name, r.text)
        for sname, where in [(name, "")] + list(nested.items()):
            sch = schemas[sname]
            assert sch.get("additionalProperties") is False, sname
            prefix = where.replace(".0", "[0]") + "." if where else ""
            # an unknown member is refused, named
            body = copy.deepcopy(base)
            (at(body, where) if where else body)["zz_unknown"] = 1
            r = d.post(path, body)
            assert r.status_code == 400 and r.json()["error"]["field"] == prefix + "zz_unknown", (sname, r.text)
            # every documented member is known (an error, if any, is not "unknown field")
            for prop in sch["properties"]:
                body = copy.deepcopy(base)
                (at(body, where) if where else body)[prop] = [["zz"]]
                r = d.post(path, body)
                assert "unknown field" not in r.text, (sname, prop, r.text)


def test_sampling_bounds_are_the_servers(shared_daemon, doc):
    d = shared_daemon
    props = doc["components"]["schemas"]["Sampling"]["properties"]
    checked = 0
    for k, p in props.items():
        if p.get("type") not in ("number", "integer"):
            continue
        for bound, outside in (("minimum", -1), ("maximum", 1), ("exclusiveMinimum", 0)):
            if bound not in p:
                continue
            v = p[bound] + outside * (1 if p["type"] == "integer" else 0.5)
            if bound == "exclusiveMinimum":
                v = p[bound]
            r = d.post("/v1/rollouts", {"groups": [{"prompt": "hi"}], "sampling": {"max_tokens": 1, k: v}})
            assert r.status_code == 400 and r.json()["error"]["field"] == "sampling." + k, (k, bound, v, r.text)
            checked += 1
    assert checked >= 6
