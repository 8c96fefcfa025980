/* routes.h — the route table: one row per route with its method, path, handler, who may call it
 * and its entry in the OpenAPI document, so GET /openapi.json is made from the rows that serve
 * and cannot disagree with them. The router (router.c) tries the rows in order and the document
 * (openapi.c) lists the paths in that order.
 *
 * Adding a route is a row in API_ROUTES and its handler, an api_handler defined in the file of
 * its family (handlers.c, openai*.c, dashboard.c, cluster.c, openapi.c). The list is expanded
 * twice: into the handlers' declarations (below, seen by every handler through internal.h) and
 * into the table (routes.c).
 *
 * A row: X(method, path, handler, auth, the OpenAPI entry as api_doc's designated initializers).
 * A path's "{id}" matches one segment (a suffix may follow) and is handed to the handler as id. */
#ifndef GRPOD_API_ROUTES_H
#define GRPOD_API_ROUTES_H
#include <microhttpd.h>

#include "api/http.h"

typedef struct api_req api_req; /* one request's state (internal.h) */

/* Serves one request on an MHD thread: replies (or suspends the connection, and is called again
 * on resume) and returns what MHD is to be told. req: the JSON body when the row's doc names one,
 * else NULL, and NULL on the calls after a suspend; the router puts it when the handler returns.
 * id: the path's {id} segment ("" when the path has none). */
typedef enum MHD_Result api_handler(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id);

typedef enum {
    API_OPEN, /* anyone who passes the guard (guard.h) */
    API_KEY, /* also Authorization: Bearer <the --api-key-file key>, when there is one */
} api_auth;

/* A route's OpenAPI entry. */
typedef struct {
    const char *summary;
    const char *body; /* components/schemas name of the JSON body; NULL: no body is read */
    int body_optional; /* an empty body reads as {} (requestBody required: false) */
    int ok; /* the success status: 200 (0 says 200) or 202 */
    const char *ok_body; /* the success body: a components/schemas name, "text/plain" (a
                                     * string), or NULL (not described) */
    const char *query; /* the query parameters: an OpenAPI parameter array in JSON, or NULL */
} api_doc;

typedef struct {
    const char *method, *path;
    api_handler *handler;
    api_auth auth;
    api_doc doc;
} api_route;

#define API_ROUTES(X) \
    X("GET", "/healthz", api_healthz_get, API_OPEN, .summary = "Liveness: 200 while the process serves HTTP") \
    X("GET", "/readyz", api_readyz_get, API_OPEN, \
      .summary = "Readiness: 200 once the model is loaded, 503 before or when the engine failed") \
    X("GET", "/metrics", api_metrics_get, API_OPEN, .summary = "Prometheus text exposition", .ok_body = "text/plain") \
    X("GET", "/openapi.json", api_openapi_get, API_OPEN, .summary = "This document") \
    X("POST", "/v1/rollouts", api_rollouts_post, API_KEY, \
      .summary = "Queue a rollout job: sample n responses per prompt group, score them", .body = "RolloutRequest", .ok = 202, \
      .ok_body = "Accepted") \
    X("POST", "/v1/updates", api_updates_post, API_KEY, \
      .summary = "Queue an update job: one policy-gradient step on scored groups", .body = "UpdateRequest", .ok = 202, \
      .ok_body = "Accepted") \
    X("GET", "/v1/jobs", api_jobs_get, API_KEY, \
      .summary = "List jobs, newest first (?kind=&status=&limit=&after=; next: the cursor of the next page)", \
      .query = "[{\"name\":\"kind\",\"in\":\"query\",\"schema\":{\"type\":\"string\"," \
               "\"enum\":[\"rollout\",\"update\",\"checkpoint\",\"logprobs\"]}}," \
               "{\"name\":\"status\",\"in\":\"query\",\"schema\":{\"type\":\"string\"," \
               "\"enum\":[\"queued\",\"running\",\"done\",\"failed\",\"cancelled\"]}}," \
               "{\"name\":\"limit\",\"in\":\"query\",\"schema\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":1000," \
               "\"default\":100}}," \
               "{\"name\":\"after\",\"in\":\"query\",\"description\":\"a page's next: the page after it\"," \
               "\"schema\":{\"type\":\"string\"}}]") \
    X("GET", "/v1/jobs/{id}", api_job_get, API_KEY, \
      .summary = "A job with its result; ?wait=S long-polls up to S seconds (max 60) until it finishes", .ok_body = "Job", \
      .query = "[{\"name\":\"wait\",\"in\":\"query\",\"description\":\"long-poll up to this many seconds (capped at 60)\"," \
               "\"schema\":{\"type\":\"number\",\"minimum\":0,\"default\":0}}]") \
    X("DELETE", "/v1/jobs/{id}", api_job_delete, API_KEY, \
      .summary = "Cancel a job: 200 when it was queued, 202 when running (flagged)", .ok_body = "Job") \
    X("GET", "/v1/model", api_model_get, API_KEY, .summary = "Model shape, backend and policy_version") \
    X("POST", "/v1/checkpoints", api_checkpoints_post, API_KEY, \
      .summary = "Queue a checkpoint job (HF directory + optimizer state)", .body = "CheckpointRequest", .body_optional = 1, \
      .ok = 202, .ok_body = "Accepted") \
    X("GET", "/v1/checkpoints", api_checkpoints_get, API_KEY, .summary = "List checkpoints, newest first") \
    X("POST", "/v1/logprobs", api_logprobs_post, API_KEY, \
      .summary = "Score given responses under the policy or the reference (synchronous; 202 with job_id after 600 s)", \
      .body = "LogprobsRequest") \
    X("POST", "/v1/tokenize", api_tokenize_post, API_KEY, \
      .summary = "Text or chat messages (with tools) to token ids, as vLLM's /tokenize", .body = "TokenizeRequest", \
      .ok_body = "TokenizeResponse") \
    X("POST", "/v1/detokenize", api_detokenize_post, API_KEY, .summary = "Token ids to text", .body = "DetokenizeRequest") \
    X("GET", "/v1/models", api_oa_models_get, API_KEY, .summary = "OpenAI-compatible: the served policy") \
    X("GET", "/v1/models/{id}", api_oa_model_get, API_KEY, \
      .summary = "OpenAI-compatible: the served policy by its id (404 for any other model)") \
    X("POST", "/v1/completions", api_oa_completions_post, API_KEY, \
      .summary = "OpenAI-compatible completions from the live policy (through the rollout scheduler; " \
                 "stream: true answers as server-sent events)", \
      .body = "CompletionRequest") \
    X("POST", "/v1/chat/completions", api_oa_chat_post, API_KEY, \
      .summary = "OpenAI-compatible chat completions from the live policy (the model's chat template)", \
      .body = "ChatCompletionRequest") \
    X("GET", "/health", api_vllm_health_get, API_OPEN, \
      .summary = "vLLM's probe: 200 with an empty body while the model serves, else 503") \
    X("GET", "/version", api_vllm_version_get, API_OPEN, .summary = "vLLM's version route: {\"version\"}") \
    X("POST", "/tokenize", api_vllm_tokenize_post, API_OPEN, .summary = "vLLM's /tokenize: POST /v1/tokenize", \
      .body = "TokenizeRequest", .ok_body = "TokenizeResponse") \
    X("POST", "/detokenize", api_vllm_detokenize_post, API_OPEN, .summary = "vLLM's /detokenize: POST /v1/detokenize", \
      .body = "DetokenizeRequest") \
    X("GET", "/tokenizer_info", api_vllm_tokenizer_info_get, API_OPEN, \
      .summary = "vLLM's /tokenizer_info: tokenizer_config.json (special tokens as text, chat_template) and " \
                 "tokenizer_class") \
    X("GET", "/dashboard", api_dashboard_page_get, API_OPEN, \
      .summary = "The training dashboard (an HTML page drawing GET /v1/dashboard)") \
    X("GET", "/v1/dashboard", api_dashboard_get, API_KEY, \
      .summary = "The dashboard's data: history per policy version, queue, running jobs, model, memory " \
                 "(?after=ID: newer history only)", \
      .query = "[{\"name\":\"after\",\"in\":\"query\",\"description\":\"only history rows with a larger id\"," \
               "\"schema\":{\"type\":\"integer\",\"minimum\":0,\"default\":0}}]") \
    X("POST", "/v1/jobs/{id}/requeue", api_job_requeue_post, API_KEY, \
      .summary = "Queue a failed job again (e.g. one failed as interrupted by repeated crashes)", .ok_body = "Job") \
    X("DELETE", "/v1/checkpoints/{id}", api_checkpoint_delete, API_KEY, \
      .summary = "Delete a checkpoint: its index entry and directory") \
    X("POST", "/v1/cluster/join", api_cluster_join_post, API_KEY, \
      .summary = "Leader with --followers: a follower joins (202 while the world is not whole, 200 with epoch, " \
                 "rank0, world, comm once it is)") \
    X("GET", "/v1/cluster/next", api_cluster_next_get, API_KEY, \
      .summary = "Leader: a follower's next SPMD call after ?after=SEQ, rollout parts placed on its ranks and parts " \
                 "cancelled (?follower=ID; waits up to 1 s; 204 when none)") \
    X("POST", "/v1/cluster/done", api_cluster_done_post, API_KEY, \
      .summary = "Leader: a follower's outcome of call seq {seq, rc, msg}, or of a rollout part {part, rc, msg, result}") \
    X("GET", "/v1/cluster/beat", api_cluster_beat_get, API_KEY, .summary = "Leader: a follower's heartbeat (?follower=ID)")

#define API_DECLARE_HANDLER_(method, path, handler, ...) api_handler handler;
API_ROUTES(API_DECLARE_HANDLER_)
#undef API_DECLARE_HANDLER_

extern const api_route api_routes[];
extern const int api_n_routes;

/* The router: serves a request whose head and body have arrived (server.c's MHD callback). */
enum MHD_Result api_route_request(api_server *s, struct MHD_Connection *c, api_req *x, const char *url);
#endif
