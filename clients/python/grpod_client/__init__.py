"""grpod_client — the Python client of grpod's HTTP API (docs/api.md), standard library only.

One method per route; the job routes come as submit_* (returns the job id) and a blocking form
(submits, long-polls GET /v1/jobs/{id}?wait= and returns the result). 429 and 503 are retried
after the server's Retry-After; every other error raises GrpodError carrying the server's code,
field and message. Not here: any training logic (examples/train_toy.py is a loop built on this).
"""
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["Client", "GrpodError", "JobFailed", "Result"]
__version__ = "0.1.0"

Json = Dict[str, Any]


class GrpodError(Exception):
    """An error reply (or a failed job): status (HTTP, 0 when no reply), code (invalid_field,
    conflict, queue_full, ...), field ("groups[0].n" or ""), message."""

    def __init__(self, status: int, code: str, message: str, field: str = "", body: Any = None):
        super().__init__("%s%s: %s" % (code, " (%s)" % field if field else "", message))
        self.status, self.code, self.message, self.field, self.body = status, code, message, field, body


class JobFailed(GrpodError):
    """A job that ended failed or cancelled; .job is the job object (status, error, ...)."""

    def __init__(self, job: Json):
        err = job.get("error") or {}
        code = err.get("code", "cancelled" if job.get("status") == "cancelled" else "failed")
        super().__init__(0, code, "job %s %s: %s" % (job.get("id"), job.get("status"), err.get("message", "")),
                         err.get("field", ""), job)
        self.job = job


class Result(dict):
    """A finished job's result (the server's JSON object) with the job's id and policy_version."""
    job_id: str = ""
    policy_version: Optional[int] = None


class Client:
    """grpod at url. api_key (default: env GRPOD_API_KEY) is sent as a Bearer token; timeout is
    per HTTP request; max_retries bounds the 429/503 retries (and connection retries of GETs)."""

    def __init__(self, url: str = "http://127.0.0.1:8780", api_key: Optional[str] = None,
                 timeout: float = 120.0, max_retries: int = 8, max_retry_wait: float = 30.0):
        self.url = url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("GRPOD_API_KEY")
        self.timeout, self.max_retries, self.max_retry_wait = timeout, max_retries, max_retry_wait

    # ------------------------------------------------------------------------------ transport

    def request(self, method: str, path: str, body: Optional[Json] = None, query: Optional[Json] = None,
                raw: bool = False) -> Any:
        """One call; returns the decoded JSON (text when raw). Retries 429/503 (they mean the
        request was not taken, so a POST is safe to repeat) and connection errors of GETs."""
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        attempt = 0
        while True:
            req = urllib.request.Request(self.url + path, data=data, method=method)
            if data is not None:
                req.add_header("Content-Type", "application/json")
            if self.api_key:
                req.add_header("Authorization", "Bearer " + self.api_key)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    text = r.read().decode("utf-8", "replace")
                    return text if raw else json.loads(text)
            except urllib.error.HTTPError as e:
                text = e.read().decode("utf-8", "replace")
                if e.code in (429, 503) and attempt < self.max_retries:
                    attempt += 1
                    time.sleep(self._retry_wait(e.headers.get("Retry-After"), attempt))
                    continue
                raise self._error(e.code, text) from None
            except (urllib.error.URLError, ConnectionError) as e:
                if method in ("GET", "HEAD") and attempt < self.max_retries:
                    attempt += 1
                    time.sleep(self._retry_wait(None, attempt))
                    continue
                raise GrpodError(0, "connection", "%s %s: %s" % (method, self.url + path, e)) from None

    def _retry_wait(self, header: Optional[str], attempt: int) -> float:
        try:
            w = float(header) if header else 0.25 * 2 ** (attempt - 1)
        except ValueError:
            w = 1.0
        return max(0.0, min(w, self.max_retry_wait))

    @staticmethod
    def _error(status: int, text: str) -> GrpodError:
        try:
            body = json.loads(text)
            err = body.get("error") or {}
            return GrpodError(status, err.get("code", "http_%d" % status), err.get("message", text),
                              err.get("field", ""), body)
        except (ValueError, AttributeError):
            return GrpodError(status, "http_%d" % status, text[:500])

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)

    def post(self, path: str, body: Json) -> Any:
        return self.request("POST", path, body)

    # ------------------------------------------------------------------------------ health, model

    def healthz(self) -> Json:
        return self.get("/healthz")

    def ready(self) -> bool:
        """GET /readyz once (no retries): True when the model is loaded."""
        try:
            self._readyz_once()
            return True
        except GrpodError:
            return False

    def _readyz_once(self) -> Json:
        saved, self.max_retries = self.max_retries, 0
        try:
            return self.get("/readyz")
        finally:
            self.max_retries = saved

    def wait_ready(self, timeout: float = 120.0) -> Json:
        """Blocks until GET /readyz is 200 (the model is loaded); GrpodError after timeout."""
        end = time.time() + timeout
        while True:
            try:
                return self._readyz_once()
            except GrpodError as e:
                if time.time() > end:
                    raise GrpodError(e.status, e.code, "grpod at %s not ready after %.0f s: %s"
                                     % (self.url, timeout, e.message)) from None
                time.sleep(0.25)

    def model(self) -> Json:
        """GET /v1/model: arch, dimensions, vocab, max_model_len, backend, policy_version, ..."""
        return self.get("/v1/model")

    def metrics(self) -> str:
        """GET /metrics, the Prometheus text."""
        return self.request("GET", "/metrics", raw=True)

    def tokenize(self, prompt: Optional[str] = None, messages: Optional[Sequence[Json]] = None,
                 add_special_tokens: Optional[bool] = None, add_generation_prompt: Optional[bool] = None) -> List[int]:
        body = _drop_none(prompt=prompt, messages=messages, add_special_tokens=add_special_tokens,
                          add_generation_prompt=add_generation_prompt)
        return self.post("/v1/tokenize", body)["tokens"]

    def detokenize(self, tokens: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.post("/v1/detokenize", {"tokens": list(tokens), "skip_special_tokens": skip_special_tokens})["prompt"]

    # ------------------------------------------------------------------------------ jobs

    def job(self, job_id: str, wait: Optional[float] = None) -> Json:
        """GET /v1/jobs/{id} (wait: long-poll up to that many seconds, the server caps it at 60)."""
        return self.get("/v1/jobs/" + job_id, wait=wait)

    def jobs(self, kind: Optional[str] = None, status: Optional[str] = None, limit: Optional[int] = None) -> List[Json]:
        """One page of GET /v1/jobs, newest first (iter_jobs walks them all)."""
        return self.get("/v1/jobs", kind=kind, status=status, limit=limit)["jobs"]

    def iter_jobs(self, kind: Optional[str] = None, status: Optional[str] = None, page: int = 1000):
        """Every stored job, newest first, page by page (the cursor is not moved by jobs added
        meanwhile: those are newer than the first page)."""
        after = None
        while True:
            r = self.get("/v1/jobs", kind=kind, status=status, limit=page, after=after)
            yield from r["jobs"]
            after = r.get("next")
            if not after:
                return

    def wait(self, job_id: str, timeout: Optional[float] = None) -> Result:
        """Long-polls until the job ends; returns its result, raises JobFailed when it failed or was
        cancelled, GrpodError (code "timeout") when timeout seconds pass first."""
        end = None if timeout is None else time.time() + timeout
        while True:
            left = 30.0 if end is None else max(0.0, min(30.0, end - time.time()))
            j = self.job(job_id, wait=round(left, 3))
            if j["status"] == "done":
                r = Result(j.get("result") or {})
                r.job_id, r.policy_version = job_id, j.get("policy_version")
                return r
            if j["status"] in ("failed", "cancelled"):
                raise JobFailed(j)
            if end is not None and time.time() >= end:
                raise GrpodError(0, "timeout", "job %s still %s after %.0f s" % (job_id, j["status"], timeout))

    def cancel(self, job_id: str) -> Json:
        """DELETE /v1/jobs/{id}: a queued job is cancelled now, a running one is asked to stop."""
        return self.request("DELETE", "/v1/jobs/" + job_id)

    # ------------------------------------------------------------------------------ rollouts, updates

    def submit_rollouts(self, groups: Sequence[Json], sampling: Optional[Json] = None,
                        overlong_buffer: Optional[Json] = None, metadata: Any = None) -> str:
        """POST /v1/rollouts; groups are {"prompt"|"prompt_ids"|"messages", "n", "reward"?}. Returns the job id."""
        body = _drop_none(groups=list(groups), sampling=sampling, overlong_buffer=overlong_buffer, metadata=metadata)
        return self.post("/v1/rollouts", body)["job_id"]

    def rollouts(self, groups: Sequence[Json], sampling: Optional[Json] = None, timeout: Optional[float] = None,
                 **kw: Any) -> Result:
        """Submits and waits: {"groups": [{"responses": [{token_ids, text, logprobs, reward, ...}]}], ...}."""
        return self.wait(self.submit_rollouts(groups, sampling, **kw), timeout)

    def submit_update(self, groups: Optional[Sequence[Json]] = None, rollout_job_id: Optional[str] = None,
                      algorithm: Optional[Json] = None, optimizer: Optional[Json] = None,
                      expected_policy_version: Optional[int] = None,
                      max_tokens_per_micro_batch: Optional[int] = None) -> str:
        """POST /v1/updates with scored groups or a finished rollout's id. Returns the job id."""
        body = _drop_none(groups=list(groups) if groups is not None else None, rollout_job_id=rollout_job_id,
                          algorithm=algorithm, optimizer=optimizer, expected_policy_version=expected_policy_version,
                          max_tokens_per_micro_batch=max_tokens_per_micro_batch)
        return self.post("/v1/updates", body)["job_id"]

    def update(self, groups: Optional[Sequence[Json]] = None, timeout: Optional[float] = None, **kw: Any) -> Result:
        """Submits and waits: {"metrics": {loss, kl, entropy, clip_frac, grad_norm, ...}, "tokens", ...}."""
        return self.wait(self.submit_update(groups, **kw), timeout)

    def logprobs(self, groups: Sequence[Json], model: str = "policy", temperature: Optional[float] = None) -> Json:
        """POST /v1/logprobs: groups of {"prompt_ids", "responses": [{"token_ids"}]} scored under the
        policy or the reference; {"groups": [{"responses": [{"logprobs": [...]}]}], "policy_version"}."""
        body = _drop_none(groups=list(groups), model=model, temperature=temperature)
        r = self.post("/v1/logprobs", body)
        if "job_id" in r and "groups" not in r:        # over 600 s: the server handed back a job
            return self.wait(r["job_id"])
        return r

    # ------------------------------------------------------------------------------ checkpoints

    def submit_checkpoint(self) -> str:
        return self.post("/v1/checkpoints", {})["job_id"]

    def checkpoint(self, timeout: Optional[float] = None) -> Result:
        """Saves the policy (HF directory + optimizer state); {"path", "policy_version", ...}."""
        return self.wait(self.submit_checkpoint(), timeout)

    def checkpoints(self) -> List[Json]:
        return self.get("/v1/checkpoints")["checkpoints"]


def _drop_none(**kw: Any) -> Json:
    return {k: v for k, v in kw.items() if v is not None}
