/* openapi.h — the route table (one list that both the router and the OpenAPI document are
 * made from, so GET /openapi.json can never disagree with what is served) and the document. */
#ifndef GRPOD_API_OPENAPI_H
#define GRPOD_API_OPENAPI_H

typedef enum { R_HEALTHZ, R_READYZ, R_METRICS, R_OPENAPI, R_ROLLOUTS, R_UPDATES, R_JOBS, R_JOB_GET,
               R_JOB_DELETE, R_MODEL, R_CKPT_POST, R_CKPT_GET, R_LOGPROBS, R_TOKENIZE, R_DETOKENIZE,
               R_OA_MODELS, R_OA_COMPLETIONS, R_OA_CHAT, R_DASHBOARD, R_DASHBOARD_DATA,
               R_JOB_REQUEUE, R_CKPT_DELETE, R_CLUSTER_JOIN, R_CLUSTER_NEXT, R_CLUSTER_DONE, R_CLUSTER_BEAT, R_COUNT } api_route_id;

typedef struct {
    api_route_id id;
    const char *method, *path;      /* path template: "{id}" matches one segment (a suffix may follow) */
    const char *summary;
    const char *request_schema;     /* components/schemas name, or NULL (no body) */
    int ok_status;                  /* 200 | 202 */
} api_route;

extern const api_route api_routes[R_COUNT];

/* The OpenAPI 3.0 document as JSON text (built once, static storage; any thread). */
const char *api_openapi_json(void);
#endif
