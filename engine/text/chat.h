/* chat.h — chat prompts: [{role, content}] rendered as the model's chat_template would render them,
 * without a Jinja engine. The template in tokenizer_config.json is recognised by its markers and
 * reproduced by built-in code:
 *   ChatML ("<|im_start|>"): Qwen3 (with its <think> handling of assistant turns after the last
 *       user query), Qwen2.5 / Qwen2 (their default system prompt), plain ChatML (grpod's default
 *       model);
 *   Llama 3 ("<|start_header_id|>"): bos + header + trimmed content + <|eot_id|> per message.
 * Anything else (no template, other markers, Llama 3.1+ templates with tools/date headers) is
 * refused with GE_UNSUPPORTED. Tool calls are not rendered (plain content only); role "tool"
 * follows the Qwen3 template. Output equals HF apply_chat_template(tokenize=False). */
#ifndef GRPOD_CHAT_H
#define GRPOD_CHAT_H
#include "engine/text/tokenizer.h"

typedef struct {
    const char *role, *content;
} chat_msg;

/* *out: malloc'd NUL-terminated prompt text (caller frees). GE_INVALID for n < 1 or a NULL
 * role/content; GE_UNSUPPORTED for an unknown template. */
int chat_render(const tok *t, const chat_msg *msgs, int n, int add_generation_prompt, char **out);
#endif
