/* openapi.c — GET /openapi.json: the OpenAPI 3.0 document, built once from the route table
 * (routes.h: paths, summaries, parameters, security, request and success bodies), the schemas in
 * the static text below, and Sampling, Algorithm and Optimizer from their rows in
 * engine/params.c (through api_params_schema). */
#include "api/internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api/params.h"

/* Members both OpenAI request schemas take: vLLM's extras, and the fields grpod accepts only at
 * their neutral value (api/openai_request.c). */
#define OA_EXTRAS \
    "\"skip_special_tokens\":{\"type\":\"boolean\",\"default\":true}," \
    "\"include_stop_str_in_output\":{\"type\":\"boolean\",\"default\":false}," \
    "\"prompt_logprobs\":{\"type\":\"integer\",\"nullable\":true,\"enum\":[null]}," \
    "\"response_format\":{\"type\":\"object\"},\"logit_bias\":{\"type\":\"object\",\"maxProperties\":0}," \
    "\"presence_penalty\":{\"type\":\"number\",\"enum\":[0]},\"frequency_penalty\":{\"type\":\"number\",\"enum\":[0]}," \
    "\"repetition_penalty\":{\"type\":\"number\",\"enum\":[1]},\"length_penalty\":{\"type\":\"number\",\"enum\":[1]}," \
    "\"use_beam_search\":{\"type\":\"boolean\",\"enum\":[false]}," \
    "\"spaces_between_special_tokens\":{\"type\":\"boolean\",\"enum\":[true]},\"priority\":{\"type\":\"number\",\"enum\":[0]}"

static const char schemas[] =
    "{"
    "\"Error\":{\"type\":\"object\",\"properties\":{\"error\":{\"type\":\"object\",\"properties\":{"
    "  \"code\":{\"type\":\"string\"},\"message\":{\"type\":\"string\"},\"field\":{\"type\":\"string\"},"
    "  \"type\":{\"type\":\"string\",\"description\":\"OpenAI's error type\"},"
    "  \"param\":{\"type\":\"string\",\"nullable\":true,\"description\":\"OpenAI's name for field\"}},"
    "  \"required\":[\"code\",\"message\"]}}},"
    "\"Reward\":{\"type\":\"object\",\"properties\":{\"type\":{\"type\":\"string\",\"enum\":[\"exact\",\"math\",\"regex\","
    "\"contains\",\"none\"]},"
    "  \"answer\":{\"type\":\"string\"},\"case_sensitive\":{\"type\":\"boolean\",\"default\":true}},\"required\":[\"type\"]},"
    "\"Message\":{\"type\":\"object\",\"properties\":{\"role\":{\"type\":\"string\",\"enum\":[\"system\",\"user\",\"assistant\","
    "\"tool\"]},"
    "  \"content\":{\"type\":\"string\"},\"name\":{\"type\":\"string\"}},\"required\":[\"role\",\"content\"]},"
    "\"RolloutGroup\":{\"type\":\"object\",\"properties\":{\"prompt\":{\"type\":\"string\"},"
    "  "
    "\"prompt_ids\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}},\"messages\":{\"type\":\"array\",\"items\":{\"$ref\":"
    "\"#/components/schemas/Message\"}},"
    "  \"n\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"at most --max-n "
    "(64)\",\"default\":1},\"reward\":{\"$ref\":\"#/components/schemas/Reward\"},\"metadata\":{}}},"
    "\"RolloutRequest\":{\"type\":\"object\",\"properties\":{\"groups\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":1024,"
    "\"items\":{\"$ref\":\"#/components/schemas/RolloutGroup\"}},"
    "  \"sampling\":{\"$ref\":\"#/components/schemas/Sampling\"},"
    "  "
    "\"overlong_buffer\":{\"type\":\"object\",\"properties\":{\"len\":{\"type\":\"number\",\"minimum\":0},\"penalty_factor\":{"
    "\"type\":\"number\",\"minimum\":0,\"default\":1}}},"
    "  \"metadata\":{}},\"required\":[\"groups\"]},"
    "\"ScoredResponse\":{\"type\":\"object\",\"properties\":{\"token_ids\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}},"
    "  "
    "\"reward\":{\"type\":\"number\"},\"advantage\":{\"type\":\"number\"},\"logprobs\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"number\"}},"
    "  "
    "\"finish_reason\":{\"type\":\"string\",\"enum\":[\"stop\",\"length\"]},\"text\":{\"type\":\"string\"},"
    "  \"loss_mask\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"enum\":[0,1]}}},\"required\":["
    "\"token_ids\"]},"
    "\"ScoredGroup\":{\"type\":\"object\",\"properties\":{\"prompt_ids\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}},"
    "  \"responses\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/components/schemas/ScoredResponse\"}},\"metadata\":{}},"
    "  \"required\":[\"prompt_ids\",\"responses\"]},"
    "\"UpdateRequest\":{\"type\":\"object\",\"properties\":{\"rollout_job_id\":{\"type\":\"string\"},"
    "  \"groups\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/components/schemas/ScoredGroup\"}},"
    "  \"algorithm\":{\"$ref\":\"#/components/schemas/Algorithm\"},\"optimizer\":{\"$ref\":\"#/components/schemas/Optimizer\"},"
    "  \"max_tokens_per_micro_batch\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"default: the memory plan's (GET "
    "/v1/model memory_plan; 32768 where it fits)\"},\"expected_policy_version\":{\"type\":\"integer\",\"minimum\":0}}},"
    "\"LogprobsRequest\":{\"type\":\"object\",\"properties\":{\"groups\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/components/"
    "schemas/ScoredGroup\"}},"
    "  "
    "\"model\":{\"type\":\"string\",\"enum\":[\"policy\",\"reference\"],\"default\":\"policy\"},\"temperature\":{\"type\":"
    "\"number\",\"minimum\":0.001,\"maximum\":100,\"default\":1},"
    "  \"max_tokens_per_micro_batch\":{\"type\":\"integer\",\"minimum\":1,\"description\":\"default: the memory plan's (GET "
    "/v1/model memory_plan; 32768 where it fits)\"},"
    "  \"top_logprobs\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":20,\"default\":0,\"description\":\"each position's "
    "k most likely tokens too: top_ids and top_logprobs per response\"}},\"required\":[\"groups\"]},"
    "\"CheckpointRequest\":{\"type\":\"object\",\"properties\":{\"merged\":{\"type\":\"boolean\",\"default\":false}}},"
    "\"ChatMessage\":{\"type\":\"object\",\"properties\":{\"role\":{\"type\":\"string\",\"enum\":[\"system\",\"developer\","
    "\"user\",\"assistant\",\"tool\"]},"
    "  \"content\":{\"nullable\":true,\"oneOf\":[{\"type\":\"string\"},{\"type\":\"array\",\"items\":{\"type\":\"object\"}}]},"
    "  \"tool_calls\":{\"type\":\"array\",\"items\":{\"type\":\"object\"}},\"tool_call_id\":{\"type\":\"string\"},"
    "  \"name\":{\"type\":\"string\"}},\"required\":[\"role\"],\"additionalProperties\":true},"
    "\"TokenizeRequest\":{\"type\":\"object\",\"properties\":{\"model\":{\"type\":\"string\"},\"prompt\":{\"type\":\"string\"},"
    "  \"messages\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/components/schemas/ChatMessage\"}},"
    "  \"add_special_tokens\":{\"type\":\"boolean\",\"description\":\"default: true with prompt, false with messages\"},"
    "  \"add_generation_prompt\":{\"type\":\"boolean\",\"default\":true},"
    "  \"continue_final_message\":{\"type\":\"boolean\",\"default\":false},"
    "  \"chat_template_kwargs\":{\"type\":\"object\"},\"tools\":{\"type\":\"array\",\"items\":{\"type\":\"object\"}},"
    "  \"return_token_strs\":{\"type\":\"boolean\",\"default\":false}}},"
    "\"TokenizeResponse\":{\"type\":\"object\",\"properties\":{\"tokens\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"integer\"}},\"count\":{\"type\":\"integer\"},\"max_model_len\":{\"type\":\"integer\"},"
    "  \"token_strs\":{\"type\":\"array\",\"nullable\":true,\"items\":{\"type\":\"string\"}}}},"
    "\"DetokenizeRequest\":{\"type\":\"object\",\"properties\":{\"model\":{\"type\":\"string\"},"
    "  \"tokens\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}},"
    "  \"skip_special_tokens\":{\"type\":\"boolean\"}},\"required\":[\"tokens\"]},"
    "\"Job\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\"},\"kind\":{\"type\":\"string\"},"
    "  \"status\":{\"type\":\"string\",\"enum\":[\"queued\",\"running\",\"done\",\"failed\",\"cancelled\"]},"
    "  "
    "\"created_at\":{\"type\":\"number\"},\"started_at\":{\"type\":\"number\",\"nullable\":true},\"finished_at\":{\"type\":"
    "\"number\",\"nullable\":true},"
    "  "
    "\"progress\":{\"type\":\"number\"},\"attempts\":{\"type\":\"integer\"},\"policy_version\":{\"type\":\"integer\","
    "\"nullable\":true},"
    "  \"error\":{\"type\":\"object\",\"nullable\":true},\"result\":{\"type\":\"object\",\"nullable\":true}}},"
    "\"CompletionRequest\":{\"type\":\"object\",\"properties\":{\"model\":{\"type\":\"string\"},"
    "  \"prompt\":{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"array\",\"items\":{\"type\":\"integer\"}},"
    "    "
    "{\"type\":\"array\",\"items\":{\"type\":\"string\"}},{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":"
    "\"integer\"}}}]},"
    "  "
    "\"max_tokens\":{\"type\":\"integer\",\"minimum\":0,\"default\":16},\"n\":{\"type\":\"integer\",\"minimum\":1,\"default\":1},"
    "  "
    "\"logprobs\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":20,\"nullable\":true},\"echo\":{\"type\":\"boolean\"},"
    "\"stream\":{\"type\":\"boolean\"},"
    "  \"stream_options\":{\"type\":\"object\"},\"user\":{\"type\":\"string\"},\"best_of\":{\"type\":\"integer\"},"
    "  \"add_special_tokens\":{\"type\":\"boolean\",\"default\":true}," OA_EXTRAS "},"
    "  \"required\":[\"prompt\"]},"
    "\"ChatCompletionRequest\":{\"type\":\"object\",\"properties\":{\"model\":{\"type\":\"string\"},"
    "  \"messages\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/components/schemas/ChatMessage\"}},"
    "  \"max_tokens\":{\"type\":\"integer\",\"minimum\":1},\"max_completion_tokens\":{\"type\":\"integer\",\"minimum\":1},"
    "  \"n\":{\"type\":\"integer\",\"minimum\":1},"
    "  "
    "\"logprobs\":{\"type\":\"boolean\"},\"top_logprobs\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":20},\"stream\":{"
    "\"type\":\"boolean\"},"
    "  "
    "\"stream_options\":{\"type\":\"object\"},\"user\":{\"type\":\"string\"},"
    "  \"tools\":{\"type\":\"array\",\"items\":{\"type\":\"object\"}},"
    "  \"tool_choice\":{\"oneOf\":[{\"type\":\"string\",\"enum\":[\"none\",\"auto\",\"required\"]},{\"type\":\"object\"}],"
    "    \"description\":\"required and a named function: the answer opens the call (name forced, arguments the model's)\"},"
    "  \"parallel_tool_calls\":{\"type\":\"boolean\",\"default\":true},"
    "  \"chat_template_kwargs\":{\"type\":\"object\",\"description\":\"enable_thinking: Qwen3's switch\"},"
    "  \"add_generation_prompt\":{\"type\":\"boolean\",\"default\":true},"
    "  \"continue_final_message\":{\"type\":\"boolean\",\"default\":false},"
    "  \"add_special_tokens\":{\"type\":\"boolean\",\"default\":false}," OA_EXTRAS "},"
    "  \"required\":[\"messages\"]},"
    "\"Accepted\":{\"type\":\"object\",\"properties\":{\"job_id\":{\"type\":\"string\"},\"status\":{\"type\":\"string\"}}}"
    "}";

/* Request schemas reject unknown members (api_check_keys in api/): every object schema with
 * properties says so, unless it says otherwise; the response schemas stay open. */
static void close_objects(json_object *o) {
    if (json_object_is_type(o, json_type_array)) {
        for (size_t i = 0; i < json_object_array_length(o); i++) close_objects(json_object_array_get_idx(o, i));
        return;
    }
    if (!json_object_is_type(o, json_type_object)) return;
    if (json_object_object_get_ex(o, "properties", NULL) && !json_object_object_get_ex(o, "additionalProperties", NULL))
        json_object_object_add(o, "additionalProperties", json_object_new_boolean(0));
    json_object_object_foreach(o, k, v) {
        (void)k;
        close_objects(v);
    }
}

/* The OpenAI routes take the sampling rows at the top level (api/openai.c), but for max_tokens
 * and logprobs, which OpenAI defines its own way: copy those rows' schemas into theirs. */
/* The sampling rows join an OpenAI request's fields, but for completions top_logprobs: there
 * OpenAI's logprobs k lists the alternatives (chat has its own top_logprobs). */
static void oa_sampling(json_object *schemas, const char *name, json_object *sampling) {
    json_object *props = json_object_object_get(json_object_object_get(schemas, name), "properties");
    int completions = !strcmp(name, "CompletionRequest");
    json_object_object_foreach(json_object_object_get(sampling, "properties"), k, v) {
        if (props && !json_object_object_get_ex(props, k, NULL) && !(completions && !strcmp(k, "top_logprobs")))
            json_object_object_add(props, k, json_object_get(v));
    }
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char *doc_text;

static json_object *ref(const char *name) {
    char buf[128];
    snprintf(buf, sizeof buf, "#/components/schemas/%s", name);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "$ref", json_object_new_string(buf));
    return o;
}

static json_object *content(json_object *schema, const char *type) {
    json_object *c = json_object_new_object(), *t = json_object_new_object();
    json_object_object_add(t, "schema", schema);
    json_object_object_add(c, type, t);
    return c;
}

static void build(void) {
    json_object *d = json_object_new_object(), *info = json_object_new_object(), *paths = json_object_new_object();
    json_object_object_add(d, "openapi", json_object_new_string("3.0.3"));
    json_object_object_add(info, "title", json_object_new_string("grpod"));
    json_object_object_add(info, "version", json_object_new_string("1"));
    json_object_object_add(info, "description",
                           json_object_new_string("GRPO-family RL post-training daemon. /v1 routes need Authorization: Bearer "
                                                  "<key> when grpod runs with --api-key-file."));
    json_object_object_add(d, "info", info);
    for (int i = 0; i < api_n_routes; i++) {
        const api_route *r = &api_routes[i];
        const api_doc *doc = &r->doc;
        int ok_status = doc->ok ? doc->ok : 200;
        json_object *item = NULL, *op = json_object_new_object(), *resps = json_object_new_object();
        if (!json_object_object_get_ex(paths, r->path, &item)) {
            item = json_object_new_object();
            json_object_object_add(paths, r->path, item);
        }
        char lower[8];
        size_t k;
        for (k = 0; r->method[k] && k < 7; k++) lower[k] = (char)(r->method[k] | 0x20);
        lower[k] = 0;
        json_object_object_add(op, "summary", json_object_new_string(doc->summary));
        json_object *params = json_object_new_array();
        if (strstr(r->path, "{id}")) {
            json_object *p = json_object_new_object(), *sch = json_object_new_object();
            json_object_object_add(p, "name", json_object_new_string("id"));
            json_object_object_add(p, "in", json_object_new_string("path"));
            json_object_object_add(p, "required", json_object_new_boolean(1));
            json_object_object_add(sch, "type", json_object_new_string("string"));
            json_object_object_add(p, "schema", sch);
            json_object_array_add(params, p);
        }
        json_object *qa = doc->query ? json_tokener_parse(doc->query) : NULL;
        for (size_t k = 0; qa && k < json_object_array_length(qa); k++)
            json_object_array_add(params, json_object_get(json_object_array_get_idx(qa, k)));
        json_object_put(qa);
        if (json_object_array_length(params)) json_object_object_add(op, "parameters", params);
        else json_object_put(params);
        if (r->auth == API_KEY) {
            json_object *sec = json_object_new_array(), *req = json_object_new_object();
            json_object_object_add(req, "bearerAuth", json_object_new_array());
            json_object_array_add(sec, req);
            json_object_object_add(op, "security", sec);
        }
        if (doc->body) {
            json_object *rb = json_object_new_object();
            json_object_object_add(rb, "required", json_object_new_boolean(!doc->body_optional));
            json_object_object_add(rb, "content", content(ref(doc->body), "application/json"));
            json_object_object_add(op, "requestBody", rb);
        }
        json_object *ok = json_object_new_object();
        json_object_object_add(ok, "description", json_object_new_string(ok_status == 202 ? "accepted" : "ok"));
        if (doc->ok_body && strchr(doc->ok_body, '/')) {
            json_object *str = json_object_new_object();
            json_object_object_add(str, "type", json_object_new_string("string"));
            json_object_object_add(ok, "content", content(str, doc->ok_body));
        } else if (doc->ok_body) {
            json_object_object_add(ok, "content", content(ref(doc->ok_body), "application/json"));
        }
        char code[8];
        snprintf(code, sizeof code, "%d", ok_status);
        json_object_object_add(resps, code, ok);
        json_object *er = json_object_new_object();
        json_object_object_add(er, "description", json_object_new_string("error"));
        json_object_object_add(er, "content", content(ref("Error"), "application/json"));
        json_object_object_add(resps, "default", er);
        json_object_object_add(op, "responses", resps);
        json_object_object_add(item, lower, op);
    }
    json_object_object_add(d, "paths", paths);
    json_object *comp = json_object_new_object(), *sch = json_tokener_parse(schemas), *ss = json_object_new_object(),
                *bearer = json_object_new_object();
    json_object *samp = api_params_schema(&eng_sampling_params);
    oa_sampling(sch, "CompletionRequest", samp);
    oa_sampling(sch, "ChatCompletionRequest", samp);
    json_object_object_add(sch, "Sampling", samp);
    json_object_object_add(sch, "Algorithm", api_params_schema(&eng_loss_params));
    json_object_object_add(sch, "Optimizer", api_params_schema(&eng_optim_params));
    json_object_object_foreach(sch, name, def) {
        if (strcmp(name, "Error") && strcmp(name, "Job") && strcmp(name, "Accepted")) close_objects(def);
    }
    json_object_object_add(comp, "schemas", sch);
    json_object_object_add(bearer, "type", json_object_new_string("http"));
    json_object_object_add(bearer, "scheme", json_object_new_string("bearer"));
    json_object_object_add(bearer, "description",
                           json_object_new_string("the key of --api-key-file; needed when grpod runs with one"));
    json_object_object_add(ss, "bearerAuth", bearer);
    json_object_object_add(comp, "securitySchemes", ss);
    json_object_object_add(d, "components", comp);
    doc_text = strdup(json_object_to_json_string_ext(d, JSON_C_TO_STRING_PLAIN));
    json_object_put(d);
}

enum MHD_Result api_openapi_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    pthread_once(&once, build);
    return api_reply_json(c, x, 200, doc_text ? doc_text : "{}");
}
