/* chat.h — chat prompts: [{role, content}] rendered as the model's chat_template would render them,
 * without a Jinja engine. The template in tokenizer_config.json is recognised by its markers and
 * reproduced by built-in code:
 *   ChatML ("<|im_start|>"): Qwen3 (with its <think> handling of assistant turns after the last
 *       user query), Qwen2.5 / Qwen2 (their default system prompt), plain ChatML (grpod's default
 *       model);
 *   Llama 3 ("<|start_header_id|>"): bos + header + trimmed content + <|eot_id|> per message;
 *   Llama 3.1 / 3.2 (also "Cutting Knowledge Date"): the date header, tools in the first user
 *       message, calls as {"name", "parameters"}, results as ipython turns (chat.c).
 * Anything else (no template, other markers) is refused with GE_UNSUPPORTED. Tools and assistant
 * tool calls are rendered by the Qwen3 template (its <tools> system block and <tool_call> turns)
 * and Llama 3.1's; the other templates have no tool format and refuse them. Output equals HF
 * apply_chat_template(tokenize=False) with the same tools and enable_thinking. */
#ifndef GRPOD_CHAT_H
#define GRPOD_CHAT_H
#include "engine/text/tokenizer.h"

/* An assistant's call: arguments is JSON text, written into the prompt as it is. */
typedef struct {
    const char *name, *arguments;
} chat_tool_call;

typedef struct {
    const char *role, *content;
    const chat_tool_call *tool_calls; /* an assistant's calls (n_tool_calls), or NULL */
    int n_tool_calls;
} chat_msg;

typedef struct {
    /* the tools offered, each one's JSON as the template's tojson writes it (Python's json.dumps) */
    const char *const *tools;
    int n_tools;
    int thinking_off; /* chat_template_kwargs enable_thinking false: Qwen3's empty think block */
} chat_opts;

/* The template's tool format: how it renders calls, so how the model writes them. */
enum { CHAT_TOOLS_NONE, CHAT_TOOLS_HERMES /* Qwen3's <tool_call> */, CHAT_TOOLS_LLAMA3 /* Llama 3.1's JSON */ };
int chat_tool_format(const tok *t);

/* *out: malloc'd NUL-terminated prompt text (caller frees). o may be NULL (no tools, defaults).
 * GE_INVALID for n < 1 or a NULL role/content; GE_UNSUPPORTED for an unknown template, or tools
 * or tool calls given to a template without a tool format. */
int chat_render_opts(const tok *t, const chat_msg *msgs, int n, int add_generation_prompt, const chat_opts *o, char **out);
static inline int chat_render(const tok *t, const chat_msg *msgs, int n, int add_generation_prompt, char **out) {
    return chat_render_opts(t, msgs, n, add_generation_prompt, NULL, out);
}
#endif
