/* openai.h — what the OpenAI-compatible files share: the served model's name, chat prompts
 * (messages, tools and the template's switches rendered and tokenized) and tool calls.
 *
 * Files: openai.c (completions and chat completions: jobs and replies), openai_request.c (their
 * requests → a native rollout request), openai_chat.c (messages → prompt ids),
 * openai_tools.c (tool definitions, tool_choice, the model's output parsed into tool_calls, JSON
 * written as Python's json.dumps writes it), openai_vllm.c (vLLM's routes beside them: /health,
 * /version, /tokenize, /detokenize, /tokenizer_info, GET /v1/models/{id}).
 *
 * Threading: any thread (the engine's text functions are thread-safe); the caller owns every
 * tree it passes and frees what it gets back. Not a public header: api/ only. */
#ifndef GRPOD_API_OPENAI_H
#define GRPOD_API_OPENAI_H
#include <json-c/json.h>

#include "api/internal.h"
#include "api/sbuf.h"
#include "api/validate.h"
#include "engine/engine.h"

/* ---------------------------------------------------------------- the served model (openai_vllm.c) */

/* The name /v1/models serves: the model directory's last component ("policy" when empty). */
void oa_model_name(eng *e, char *out, size_t n);
/* 0 when name is NULL, the served name or the model directory; else GE_NOT_FOUND (404) naming
 * "model", as vLLM answers a model it does not serve. */
int oa_model_or_reply(eng *e, const char *name, api_error *err);

/* ---------------------------------------------------------------- ids, tools (openai_tools.c) */

/* prefix + 32 random hex digits ("chatcmpl-…", "chatcmpl-tool-…"), unique per call. */
void oa_new_id(char *out, size_t n, const char *prefix);

typedef enum { OA_TOOLS_NONE, OA_TOOLS_AUTO, OA_TOOLS_REQUIRED, OA_TOOLS_NAMED } oa_tool_choice;

/* A request's tools: each definition as the chat template's tojson writes it, and the choice. */
typedef struct {
    char **json; /* n of them, malloc'd */
    char **names; /* n function names, malloc'd */
    char **params; /* n: each one's parameters as JSON text (json.dumps), or NULL */
    int n;
    oa_tool_choice choice;
    int named; /* tool_choice names a function: its index in names; else -1 */
    int parallel; /* parallel_tool_calls (default true): false keeps the first call only */
} oa_tools;

/* Reads tools, tool_choice and parallel_tool_calls of req (absent: no tools, choice none). */
int oa_tools_or_reply(json_object *req, oa_tools *t, api_error *err);
void oa_tools_free(oa_tools *t);

/* v as Python's json.dumps(v, ensure_ascii=False) writes it (", " and ": " between members, key
 * order kept): what HF's tojson filter puts into a prompt. malloc'd; NULL when out of memory. */
char *oa_pydumps(json_object *v);

/* The model's text parsed as vLLM's parser of the template's family parses it (format: eng.h's
 * ENG_TOOLS_*): hermes (Qwen's <tool_call>{"name", "arguments"}</tool_call>, the text before
 * the first call its content) or llama3_json (a text that opens with {"name", "parameters"} —
 * or "arguments" —, calls separated by ';', no content). A new array of OpenAI tool_calls ({id,
 * type: "function", function: {name, arguments: JSON text}}) with *content_len the content's
 * length; NULL when the text holds no well-formed call (then all of it is content). max: 1
 * keeps the first. arguments: oa_canon_json of the arguments as written. */
json_object *oa_parse_tool_calls(int format, const char *text, size_t *content_len, int max);
/* JSON text as json.dumps(json.loads(text), ensure_ascii=False) writes it, numbers as written; a
 * prefix of the text gives a prefix of the form (an escape not finished is left out). malloc'd. */
char *oa_canon_json(const char *text, size_t n);
/* The calls of a text being written (a stream's): each call's name once its string is closed
 * and its arguments' form so far (oa_canon_json of what is written; each a prefix of the next
 * one's and of the parsed reply's), NULL while not begun; both malloc'd. Returns how many calls
 * have begun (at most cap), -1 when what is written is not a call. */
typedef struct {
    char *name, *args;
} oa_call_progress;
int oa_calls_progress(int format, const char *text, oa_call_progress *out, int cap);

/* tool_choice "required" or a named function: the answer starts with the call's opening in the
 * template's format (<tool_call>\n{"name": NAME, "arguments":  or {"name": NAME, "parameters": ),
 * which grpod appends to the prompt; the model writes the arguments (a JSON object under the
 * grammar). malloc'd; NULL when out of memory. */
char *oa_call_opening(int format, const char *name);
/* What the forced call's arguments are followed by: the call object's close (and </tool_call>)
 * (sampling.guided_suffix: the arguments are decoded as a JSON object, then this). */
const char *oa_call_closing(int format);
/* The calls of a forced answer: opening + text parsed as oa_parse_tool_calls does; when that
 * finds no well-formed call (max_tokens too small for the grammar to close them), one call of
 * name whose arguments are the form of the JSON prefix written (what a stream sent), or the text
 * as written less the call's close when it is not JSON. Never NULL but when out of memory. */
json_object *oa_forced_calls(int format, const char *opening, const char *name, const char *text, int max);

/* ---------------------------------------------------------------- requests (openai_request.c) */

#define OA_MAX_LOGPROBS 20

/* One completions or chat request across its jobs and suspends (api_req.ext). */
typedef struct {
    int chat, stream, include_usage, echo, logprobs; /* logprobs: -1 off, else top-n asked */
    int n, n_prompts, max_tokens;
    int skip_special, include_stop; /* skip_special_tokens, include_stop_str_in_output */
    int return_ids; /* vLLM's return_token_ids: the prompt's and each choice's token ids */
    oa_tool_choice tool_choice; /* none: the output is content; auto: parsed into tool_calls */
    int tool_format; /* the template's (ENG_TOOLS_*): how calls are written and parsed */
    int parallel_tool_calls;
    /* required / named: the forced call's name and opening (malloc'd; appended to the prompt ids);
     * NULL until chosen. Required with several tools: each tool's opening as ids (cands: an array
     * of {"name", "ids"}), scored by a logprobs job first (choosing) and one drawn by the policy's
     * probabilities of them at the request's temperature (greedy: the likeliest). */
    char *forced, *forced_name;
    json_object *cands;
    int choosing;
    char id[64]; /* "cmpl-…" / "chatcmpl-…", unique */
    char model[128];
    long long created, policy_version;
    json_object *rollout; /* the canonical rollout payload (groups[].prompt_ids) */
    json_object *sampled; /* the rollout job's result, or NULL (max_tokens 0) */
    json_object *scored; /* the logprobs job's result (echo + logprobs) */
    int stage; /* 0 rollout, 1 logprobs, 2 done */
} oa_req;

/* Reads a completions (chat 0) or chat completions request into q, with its native rollout
 * payload validated by api_rollout_or_reply (q->rollout). Errors name the request's fields. */
int oa_parse_or_reply(eng *e, json_object *req, int chat, const api_limits *l, const api_model *m, oa_req *q, api_error *err);
/* Forces candidate i of q->cands: its ids appended to the rollout request's groups[0].prompt_ids,
 * its tool's parameters (when it has them) its sampling.guided_schema, q->forced and
 * q->forced_name set, q->choosing cleared. 0, or GE_NOMEM. */
int oa_force(oa_req *q, json_object *rollout, int i);
/* The tool calls of an answer's text under q's tool_choice (NULL: none; *content_len then
 * unchanged): auto parses them out, required and named (q->forced) always return the forced
 * call (oa_forced_calls) with no content. */
json_object *oa_answer_calls(const oa_req *q, const char *text, size_t *content_len);
/* The native validator names its fields (groups[0].prompt, sampling.max_tokens): as the request does. */
void oa_rename_field(api_error *err, int chat);

/* ---------------------------------------------------------------- replies (openai.c) */

void oa_req_free(void *q);
json_object *oa_prompt_ids(const oa_req *q, int i); /* prompt i's ids (borrowed) */
json_object *oa_response(const oa_req *q, int i, int k); /* the rollout's response k of prompt i (borrowed), or NULL */
char *oa_ids_text(eng *e, json_object *ids, int skip); /* malloc'd; "" when it cannot be decoded */
/* The text of a sampled response as the request asks for it (special tokens, stop string). */
char *oa_response_text(eng *e, const oa_req *q, json_object *resp);
/* A response's alternatives from the scoring job (top_ids, top_logprobs: per position k of them);
 * logprob index i (token i + lp_offset) has them at i + from. ids NULL: none, top_logprobs then
 * list the chosen token. */
typedef struct {
    json_object *ids, *lps;
    int from;
} oa_tops;
/* Completions' {tokens, token_logprobs, top_logprobs, text_offset} (lps starts lp_offset tokens
 * late), chat's {"content": [...]}: new objects. tp may be NULL. */
json_object *oa_completion_logprobs(eng *e, json_object *ids, json_object *lps, int lp_offset, size_t offset0, const oa_tops *tp);
json_object *oa_chat_logprobs(eng *e, json_object *ids, json_object *lps, const oa_tops *tp);
json_object *oa_usage(const oa_req *q, long long completion);
json_object *oa_envelope(const oa_req *q, const char *id, const char *object);
void oa_sse(api_sbuf *b, json_object *o); /* "data: <o>\n\n"; takes o */
/* tool_calls as a stream's delta carries them: each with its "index" (a new array). */
json_object *oa_streamed_calls(json_object *calls);

/* ---------------------------------------------------------------- streaming (openai_stream.c) */

/* Answers q (stream: true, its rollout submitted as job_id) with server-sent events sent as the
 * scheduler samples the tokens (chunked, no Content-Length). Takes q (x->ext is cleared). */
enum MHD_Result oa_stream_reply(api_server *s, struct MHD_Connection *c, api_req *x, oa_req *q, const char *job_id);

/* ---------------------------------------------------------------- chat prompts (openai_chat.c) */

/* The prompt of a chat request: messages (OpenAI's shapes: text parts, an assistant's tool_calls,
 * tool results), t's tools, chat_template_kwargs (enable_thinking), add_generation_prompt
 * (default true) and continue_final_message (default false), rendered by the model's chat
 * template and tokenized (add_special_tokens, default false). *ids is malloc'd. Errors name the
 * request's fields (messages[2].tool_calls[0].function.name). */
int oa_chat_prompt_or_reply(eng *e, json_object *req, const oa_tools *t, int **ids, int *n, api_error *err);
/* The members oa_chat_prompt_or_reply reads beside messages (for a route's list of keys). */
extern const char *const oa_chat_prompt_keys[];
#endif
