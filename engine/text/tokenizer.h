/* tokenizer.h — grpod's tokenizer: reads a Hugging Face tokenizer.json (byte-level BPE, as
 * Qwen2/Qwen2.5/Qwen3 and Llama 3 ship it) and produces exactly the ids the `tokenizers` library
 * produces. What it supports, and refuses at load with GE_UNSUPPORTED:
 *   model         BPE (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges, byte_fallback,
 *                 unk_token, fuse_unk); WordPiece, Unigram, WordLevel and BPE dropout are refused.
 *   normalizer    null or NFC.
 *   pre_tokenizer Sequence[Split(Qwen2 or Llama 3 regex, Isolated), ByteLevel(use_regex=false)].
 *   decoder       ByteLevel.  post_processor  null, ByteLevel, TemplateProcessing (single only).
 *   added tokens  matched before everything else (leftmost-longest), lstrip/rstrip/normalized;
 *                 single_word is refused.
 *
 * A tok is immutable after load and may be used from any number of threads at once (its word
 * cache is taken with a try-lock; a busy cache is bypassed, not waited for). */
#ifndef GRPOD_TOKENIZER_H
#define GRPOD_TOKENIZER_H
#include <stddef.h>

typedef struct tok tok;

/* Read DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (bos/eos, chat template). */
int tok_load(const char *model_dir, tok **out);
/* From memory: tokenizer.json text; no tokenizer_config (bos/eos/chat template NULL). */
int tok_load_json(const char *json, size_t len, tok **out);
/* From memory with a tokenizer_config.json text (cfg may be NULL). */
int tok_load_json_cfg(const char *json, size_t len, const char *cfg, size_t cfg_len, tok **out);
void tok_free(tok *t);

int tok_vocab_size(const tok *t); /* max id + 1, added tokens included */

/* Encode text[0..len) (UTF-8; GE_INVALID otherwise). add_special: the post-processor's special
 * tokens (e.g. a BOS), as HF's add_special_tokens. parse_special: special added tokens in the
 * text become their ids (HF's default); 0 encodes them as plain text (HF's
 * encode_special_tokens=True; non-special added tokens such as "<think>" still match, as in HF).
 * *ids is malloc'd (caller frees), *n its length. */
int tok_encode(const tok *t, const char *text, size_t len, int add_special, int parse_special, int **ids, int *n);
/* Decode ids (unknown ids are skipped, as HF does); skip_special drops special added tokens.
 * Bytes that are not valid UTF-8 become U+FFFD as Rust's String::from_utf8_lossy does.
 * *text is malloc'd and NUL-terminated, *len excludes the NUL. */
int tok_decode(const tok *t, const int *ids, int n, int skip_special, char **text, size_t *len);

int tok_token_id(const tok *t, const char *token_str); /* -1 if absent (e.g. "<|im_end|>") */
const char *tok_bos(const tok *t); /* from tokenizer_config.json, or NULL */
const char *tok_eos(const tok *t);
const char *tok_chat_template(const tok *t); /* or NULL */
int tok_is_special(const tok *t, int id);
/* The bytes id decodes to (raw bytes: a byte-level token may hold part of a UTF-8 character), *n
 * their count; NULL for an unused or out-of-range id. Borrowed from t. */
const char *tok_token_bytes(const tok *t, int id, size_t *n);

/* The tokenizer of grpod's embedded default model: 256 byte tokens (id = byte value, spelled with
 * the GPT-2 byte-to-unicode mapping), no merges, and "<|endoftext|>" 256, "<|im_start|>" 257,
 * "<|im_end|>" 258. Returned as malloc'd tokenizer.json / tokenizer_config.json texts (eos
 * "<|im_end|>", a ChatML chat_template) that HF `tokenizers` loads too. */
char *tok_default_tokenizer_json(void);
char *tok_default_tokenizer_config_json(void);

/* CLI: `grpod tokenize ...` / `grpod detokenize ...` (argv[0] is the subcommand). Return the
 * process exit code: 0, 1 (runtime error) or 2 (usage), with a one-line error on stderr. */
int tok_cli_tokenize(int argc, char **argv);
int tok_cli_detokenize(int argc, char **argv);
#endif
