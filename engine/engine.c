/* engine.c — opening a model on a backend (the memory plan ends it: plan.c), text helpers and
 * scoring (eng_logprobs). Rollouts are rollout/, the update step and checkpoints train/. */
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/text/chat.h"
#include "engine/rollout/decode.h"
#include "engine/engine_internal.h"
#include "engine/format/json.h"
#include "engine/model/lora.h"
#include "engine/format/safetensors.h"
#include "engine/model/split.h"
#include "engine/train/state.h"

/* ---------------------------------------------------------------- open / close */

const char *eng_backend_resolve(const char *name) {
    if (!name || !strcmp(name, "auto")) return backend_cuda_available() ? "cuda" : "cpu";
    return name;
}

static int open_backend(const char *name, int n_threads, int device, eng_backend **be) {
    name = eng_backend_resolve(name);
    if (!strcmp(name, "cpu")) return backend_cpu_create(be, n_threads);
    if (!strcmp(name, "cuda")) {
        /* the host's part (the offloaded AdamW, conversions) on n_threads OpenMP threads of this
         * engine's thread, as on cpu: ranks of one process then share the cores, not each take all */
        if (n_threads > 0) omp_set_num_threads(n_threads);
        return backend_cuda_create(be, device);
    }
    return err_set(GE_INVALID, "unknown backend \"%s\" (auto, cpu or cuda)", name);
}


static int has_file(const char *dir, const char *name) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, R_OK) == 0;
}

/* Rank, alpha and targets from the flags, or from the adapter the run starts from (which must
 * then agree with any flag given). *from: that adapter's directory or NULL. */
static int lora_settings(const eng_open_opts *o, int *r, float *alpha, unsigned *targets, const char **from) {
    *from = o->resume_dir && *o->resume_dir && has_file(o->resume_dir, "adapter_model.safetensors") ? o->resume_dir
        : o->lora_init && *o->lora_init                                                             ? o->lora_init
                                                                                                    : NULL;
    *r = o->lora_rank;
    *alpha = o->lora_alpha;
    *targets = 0;
    int rc = o->lora_targets && *o->lora_targets ? lora_parse_targets(o->lora_targets, targets) : 0;
    if (rc || (!*r && !*from)) return rc;
    if (o->resume_dir && *o->resume_dir && *from != o->resume_dir)
        return err_set(GE_INVALID,
                       "%s is a full checkpoint, not a LoRA adapter: resume it without --lora-rank, "
                       "or use another --data-dir",
                       o->resume_dir);
    if (*from) {
        int fr;
        float fa;
        unsigned ft;
        if ((rc = lora_read_config(*from, &fr, &fa, &ft))) return rc;
        if ((*r && *r != fr) || (*alpha > 0 && *alpha != fa) || (*targets && *targets != ft))
            return err_set(GE_INVALID,
                           "%s: the adapter has rank %d, alpha %g and other targets than the flags ask "
                           "(--lora-rank %d --lora-alpha %g): drop the flags or match them",
                           *from, fr, fa, *r, *alpha);
        *r = fr;
        *alpha = fa;
        *targets = ft;
    }
    if (*alpha <= 0) *alpha = 2.0f * *r;
    if (!*targets) *targets = (1u << LORA_N) - 1;
    return 0;
}

/* Adapters on the device: from `from` (PEFT) or fresh (A seeded, B = 0); policy views. */
static int open_adapters(eng *e, const char *from) {
    eng_backend *be = e->be;
    size_t n = (size_t)e->m.l_elems;
    float *host = malloc(n * sizeof(float));
    if (!host) return err_set(GE_NOMEM, "engine: out of memory");
    int rc = 0;
    if (from) rc = lora_load_peft(&e->m, from, host);
    else lora_init_host(&e->m, host, 0x10a5eedULL);
    int CD = e->m.cfg.C > e->m.cfg.D ? e->m.cfg.C : e->m.cfg.D;
    e->lora_master = rc ? NULL : be->alloc(be, n * sizeof(float));
    e->lora_sink = rc ? NULL : be->alloc(be, (size_t)CD * sizeof(float));
    if (!rc && (!e->lora_master || !e->lora_sink)) rc = GE_NOMEM;
    if (!rc) rc = be->to_dev(be, e->lora_master, host, n * sizeof(float));
    if (!rc && be->act_bytes == 4) e->lora_act = e->lora_master;
    else if (!rc) {
        e->lora_act = be->alloc(be, n * (size_t)be->act_bytes);
        rc = e->lora_act ? be->act_from_f32(be, e->lora_act, host, n) : GE_NOMEM;
    }
    free(host);
    if (!rc) lora_views(&e->m, e->lora_act, (size_t)be->act_bytes, &e->wv);
    return rc;
}

int eng_open(const eng_open_opts *o, eng **out) {
    *out = NULL;
    double t0 = clock_mono_ms();
    eng *e = calloc(1, sizeof *e);
    if (!e) return err_set(GE_NOMEM, "engine: out of memory");
    snprintf(e->model_dir, sizeof e->model_dir, "%s", o->model_dir);
    model_config cfg;
    float *host = NULL;
    int lr_rank;
    float lr_alpha;
    unsigned lr_targets;
    const char *lr_from;
    int rc = lora_settings(o, &lr_rank, &lr_alpha, &lr_targets, &lr_from);
    if (!rc) rc = eng_moments_check(o->optimizer_moments, &e->m16);
    if (!rc && e->m16 && lr_rank)
        rc = err_set(GE_UNSUPPORTED, "optimizer_moments bf16: the adapters' optimizer state stays fp32 (LoRA); drop one of them");
    if (!rc) rc = config_load(o->model_dir, &cfg);
    if (rc) goto fail;
    if (cfg.vision) /* a qwen3_5 vision-language checkpoint: its text model is what runs */
        log_event(LOG_INFO, "vision_tower_skipped",
                  "\"model_type\":\"qwen3_5\",\"note\":\"the text model runs; "
                  "model.visual.* tensors are not loaded\"");
    char tpath[PATH_MAX];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", o->model_dir);
    if (access(tpath, R_OK) == 0 && (rc = tok_load(o->model_dir, &e->tok))) goto fail;
    if (e->tok && tok_vocab_size(e->tok) > cfg.V) { /* every id must index the embedding */
        rc = err_set(GE_FORMAT, "%s: tokenizer.json has token id %d beyond the model's vocab_size %d", o->model_dir,
                     tok_vocab_size(e->tok) - 1, cfg.V);
        goto fail;
    }
    if ((rc = open_backend(o->backend, o->n_threads, o->device, &e->be))) goto fail;
    e->comm = o->comm;
    if (o->nccl_id && !o->comm) {
        if ((rc = comm_nccl_open(o->nccl_id, o->rank, o->world, e->be, o->nccl_cancel, &e->comm))) goto fail;
        e->own_comm = 1;
    }
    e->rank = e->comm ? comm_rank(e->comm) : 0;
    e->W = e->comm ? comm_size(e->comm) : 1;
    e->dp = e->comm != NULL;
    if (e->dp && lr_rank) {
        rc = err_set(GE_UNSUPPORTED, "LoRA with a comm (%d ranks) is not built: train adapters on one rank, without one", e->W);
        goto fail;
    }
    if (config_n_moe(&cfg) && (e->be->no_moe || (lr_rank && e->be->no_moe_lora))) {
        rc = err_set(GE_UNSUPPORTED, "%s: a mixture-of-experts model (%d experts) cannot run here: %s", o->model_dir, cfg.E,
                     e->be->no_moe ? e->be->no_moe : e->be->no_moe_lora);
        goto fail;
    }
    if (cfg.arch == ARCH_QWEN3_5 && (e->be->no_hybrid || lr_rank)) {
        rc = err_set(GE_UNSUPPORTED, "%s: a hybrid linear-attention model (%d gated DeltaNet layers) cannot run here: %s",
                     o->model_dir, config_n_linear(&cfg),
                     e->be->no_hybrid ? e->be->no_hybrid : "LoRA adapters on hybrid models are not built yet");
        goto fail;
    }
    if (e->be->max_head_dim && cfg.D > e->be->max_head_dim) {
        rc = err_set(GE_UNSUPPORTED, "%s: attention head dim %d is above the %s backend's %d (run it with --backend cpu)",
                     o->model_dir, cfg.D, e->be->name, e->be->max_head_dim);
        goto fail;
    }
    if ((rc = o->expert_parallel ? ep_model_init(e, &cfg, o, lr_rank || (o->lora_init && *o->lora_init))
                                 : model_init(&e->m, &cfg, e->be)) ||
        (rc = model_check_files(&e->m, o->model_dir)))
        goto fail;
    if (lr_rank && (rc = lora_init(&e->m, lr_rank, lr_alpha, lr_targets))) goto fail;
    size_t n = (size_t)e->m.n_elems;
    eng_backend *be = e->be;
    if (lr_rank) {
        /* the base is frozen and is the reference: one act-typed copy, no fp32 master on cuda,
         * loaded tensor by tensor (no host copy of the whole model) */
        e->w_act = be->alloc(be, n * (size_t)be->act_bytes);
        if (!e->w_act || (rc = model_load_act(&e->m, o->model_dir, e->w_act))) {
            rc = rc ? rc : GE_NOMEM;
            goto fail;
        }
        if (be->act_bytes == 4) e->w_master = e->w_act;
        if ((rc = model_views_make(&e->m, e->w_act, (size_t)be->act_bytes, &e->wv)) ||
            (rc = model_views_make(&e->m, e->w_act, (size_t)be->act_bytes, &e->rv)) || (rc = open_adapters(e, lr_from)))
            goto fail;
    } else {
        if ((rc = state_fits(e, o->model_dir))) goto fail; /* before the weights are read */
        host = malloc(n * sizeof(float));
        if (!host) {
            rc = err_set(GE_NOMEM, "engine: %zu MiB host buffer for the weights", n * 4 >> 20);
            goto fail;
        }
        /* The reference is always the model directory's weights; the policy resumes from a checkpoint. */
        if ((rc = model_load_host(&e->m, o->model_dir, host))) goto fail;
        e->ref_act = be->alloc(be, n * (size_t)be->act_bytes);
        if (!e->ref_act) {
            rc = GE_NOMEM;
            goto fail;
        }
        if ((rc = be->act_from_f32(be, e->ref_act, host, n))) goto fail;
        if (o->resume_dir && *o->resume_dir && (rc = model_load_host(&e->m, o->resume_dir, host))) goto fail;
        if ((rc = state_open(e, &host, o->optimizer_offload))) goto fail;
        free(host); /* placed (or taken as the master): free before the moments are read */
        host = NULL;
        if ((rc = model_views_make(&e->m, e->w_act, (size_t)be->act_bytes, &e->wv)) ||
            (rc = model_views_make(&e->m, e->ref_act, (size_t)be->act_bytes, &e->rv)))
            goto fail;
    }
    if (o->resume_dir && *o->resume_dir && (rc = eng_checkpoint_load_state(e, o->resume_dir))) goto fail;
    /* the plan's gradients first (the decode copy may lie in them), then the copy: every rank opens together */
    if (e->ep_full && !o->no_training && (rc = state_alloc(e))) goto fail;
    if ((rc = ep_decode_refresh(e))) goto fail;
    double t1 = clock_mono_ms();
    if (!o->no_training && (rc = plan_make(e, o))) goto fail;
    e->plan.ms_load = t1 - t0;
    e->plan.ms_plan = clock_mono_ms() - t1;
    free(host);
    *out = e;
    return 0;
fail:
    free(host);
    eng_close(e);
    return rc;
}

comm *eng_comm(eng *e) { return e->comm; }
int eng_device_count(void) { return backend_cuda_device_count(); }

void eng_close(eng *e) {
    if (!e) return;
    eng_backend *be = e->be;
    if (be) {
        model_acts_free(&e->m, &e->acts_ng);
        model_acts_free(&e->m, &e->acts_g);
        model_acts_free(&e->m, &e->acts_pad);
        dec_free(e);
        split_mem_free(be, &e->split);
        void *bufs[] = {e->w_act != e->w_master ? e->w_act : NULL,          e->ref_act,     e->grad,
                        e->lora_act != e->lora_master ? e->lora_act : NULL, e->lora_master, e->lora_sink};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) be->free(be, bufs[i]);
        state_free(e); /* the master and moments, where they live */
        model_views_free(&e->wv);
        model_views_free(&e->rv);
        model_views_free(&e->gv);
        if (e->m.params) model_free(&e->m);
        ep_decode_free(e);
        ep_model_free(e);
        snap_free(e);
        if (e->dp_buf) be->free(be, e->dp_buf);
        if (e->own_comm) comm_free(e->comm); /* before the stream it runs on goes */
        be->destroy(be);
    }
    jg_vocab_free(e->jg_vocab);
    if (e->tok) tok_free(e->tok);
    free(e);
}

void eng_get_info(eng *e, eng_info *o) {
    const model_config *c = &e->m.cfg;
    memset(o, 0, sizeof *o);
    snprintf(o->arch, sizeof o->arch, "%s", c->arch_name);
    snprintf(o->backend, sizeof o->backend, "%s", e->be->name);
    snprintf(o->model_dir, sizeof o->model_dir, "%s", e->model_dir);
    snprintf(o->dtype, sizeof o->dtype, "%s", c->dtype);
    o->n_layers = c->L;
    o->d_model = c->C;
    o->n_heads = c->H;
    o->n_kv_heads = c->K;
    o->head_dim = c->D;
    o->d_ff = c->F;
    o->vocab = c->V;
    o->max_pos = c->max_pos;
    o->n_params = config_n_params(c);
    o->policy_version = e->policy_version;
    o->n_eos = c->n_eos;
    o->moe_layers = config_n_moe(c);
    o->top_k = o->moe_layers ? c->top_k : 0;
    o->n_experts = o->moe_layers ? c->E : 0;
    o->lora_rank = e->m.lora_r; /* all 0 and "" without adapters */
    o->lora_alpha = e->m.lora_alpha;
    lora_targets_str(e->m.lora_targets, o->lora_targets, sizeof o->lora_targets);
    for (int i = 0; i < e->m.n_lparams; i++) o->lora_params += e->m.lparams[i].numel;
    memcpy(o->eos_ids, c->eos_ids, sizeof o->eos_ids);
    o->plan = e->plan;
    if (e->tok) { /* the tokenizer's eos (e.g. <|im_end|> for chat models) ends responses too */
        const char *eos = tok_eos(e->tok);
        int id = eos ? tok_token_id(e->tok, eos) : -1, seen = 0;
        for (int i = 0; i < o->n_eos; i++) seen |= o->eos_ids[i] == id;
        if (id >= 0 && !seen && o->n_eos < 8) o->eos_ids[o->n_eos++] = id;
    }
}

/* ---------------------------------------------------------------- text */

static int need_tok(eng *e) {
    return e->tok ? 0 : err_set(GE_UNSUPPORTED, "%s has no tokenizer.json: send token ids", e->model_dir);
}
int eng_tokenize(eng *e, const char *text, size_t len, int add_special, int **ids, int *n) {
    int rc = need_tok(e);
    if (rc || (rc = tok_encode(e->tok, text, len, add_special, 1, ids, n))) return rc;
    for (int i = 0; i < *n; i++)
        if ((*ids)[i] < 0 || (*ids)[i] >= e->m.cfg.V) {
            rc = err_set(GE_INVALID, "token id %d is outside the model's vocabulary (size %d)", (*ids)[i], e->m.cfg.V);
            free(*ids);
            *ids = NULL;
            *n = 0;
            return rc;
        }
    return 0;
}
int eng_detokenize(eng *e, const int *ids, int n, int skip_special, char **text, size_t *len) {
    int rc = need_tok(e);
    return rc ? rc : tok_decode(e->tok, ids, n, skip_special, text, len);
}
/* eng_message and eng_chat_opts are chat.h's types under the engine's names */
_Static_assert(sizeof(eng_message) == sizeof(chat_msg) && sizeof(eng_tool_call) == sizeof(chat_tool_call) &&
                   sizeof(eng_chat_opts) == sizeof(chat_opts),
               "eng_message/eng_chat_opts must mirror chat_msg/chat_opts");
_Static_assert((int)ENG_TOOLS_HERMES == (int)CHAT_TOOLS_HERMES && (int)ENG_TOOLS_LLAMA3 == (int)CHAT_TOOLS_LLAMA3, "tool formats");
int eng_tool_format(eng *e) { return need_tok(e) ? (err_clear(), ENG_TOOLS_NONE) : chat_tool_format(e->tok); }
int eng_guided_schema_check(const char *schema) {
    jg_schema *g = NULL;
    int rc = jg_schema_compile(schema, strlen(schema), &g);
    jg_schema_free(g);
    return rc;
}
int eng_render_chat(eng *e, const eng_message *m, int n, int agp, const eng_chat_opts *o, char **text) {
    int rc = need_tok(e);
    return rc ? rc : chat_render_opts(e->tok, (const chat_msg *)m, n, agp, (const chat_opts *)o, text);
}

/* ---------------------------------------------------------------- scoring */

/* Device memory a training step needs beside its activations (kernel scratch, cuBLASLt
 * workspace, the chunked logprob head): the activations' budget is the free memory less this. */
#define ACTS_HEADROOM ((size_t)4 << 30)

int eng_acts_reserve(eng *e, model_acts *a, int T, int M, int grad) {
    if (a->mem && a->cap_T >= T && a->cap_M >= M) return 0;
    int cT = a->cap_T > T ? a->cap_T : T, cM = a->cap_M > M ? a->cap_M : M;
    size_t fr = 0, tot = 0;
    if (a == &e->acts_g && e->acts_ng.borrowed) model_acts_free(&e->m, &e->acts_ng); /* its memory goes */
    model_acts_free(&e->m, a);
    if (!grad) return model_acts_init(&e->m, a, cT, cM, 0);
    if (e->test_ckpt) return model_acts_init_ckpt(&e->m, a, cT, cM, e->test_ckpt - 1);
    /* as many layers kept whole as the free device memory holds (model.h); all on cpu */
    size_t held = e->be->scratch_held ? e->be->scratch_held(e->be) : 0;
    size_t budget = 0, beside = (size_t)plan_ep_beside(e, cT, held), head = ACTS_HEADROOM + beside;
    if (e->be->mem_info && !e->be->mem_info(e->be, &fr, &tot)) budget = fr > head ? fr - head : 1;
    err_clear();
    int rc = model_acts_init_budget(&e->m, a, cT, cM, budget);
    if (rc == GE_NOMEM && budget) /* what the plan counted against what is free now, for whoever reads the failure */
        err_set(rc,
                "%s (free now %zu MiB, kept free beside: %zu MiB of headroom, %zu MiB of expert-parallel buffers; "
                "ops' scratch held %zu MiB; the plan gave activations %lld MiB for up to %lld tokens)",
                err_msg(), fr >> 20, ACTS_HEADROOM >> 20, beside >> 20, held >> 20, e->plan.acts_bytes >> 20,
                e->plan.micro_batch_tokens_max);
    return rc;
}

/* The top_k most likely tokens of the micro-batch model_forward just ran (its final norm's output
 * is still in the activations): ids, lps (b.M, top_k) on the host. */
static int score_top(eng *e, const model_views *w, const model_input *in, int M, float temperature, int top_k, int *ids,
                     float *lps) {
    eng_backend *be = e->be;
    model_dev_input d;
    size_t bytes = (size_t)M * top_k * 4;
    int rc = model_input_upload(&e->m, &e->acts_ng, in, &d); /* the same arrays again: their device pointers */
    if (rc) return rc;
    int *di = be->alloc(be, bytes);
    float *dl = be->alloc(be, bytes);
    if (!di || !dl) rc = err_set(GE_NOMEM, "logprobs: out of memory for the top %d tokens of %d positions", top_k, M);
    if (!rc) {
        be->logprob_top(be, di, dl, e->acts_ng.lnf, d.out_pos, w->lm_head, M, e->m.cfg.C, e->m.cfg.V, temperature, top_k);
        if (!(rc = be->to_host(be, ids, di, bytes))) rc = be->to_host(be, lps, dl, bytes);
    }
    if (di) be->free(be, di);
    if (dl) be->free(be, dl);
    return rc;
}

int eng_score(eng *e, const model_views *w, const pack_group *groups, int n, long long max_tokens, float temperature, float *out,
              float *ent, int top_k, int *top_ids, float *top_lps) {
    pack_plan plan;
    int rc = pack_plan_make(&plan, groups, n, max_tokens, model_pack_layout(&e->m));
    if (rc) return rc;
    long long done = 0;
    ep_gate_ud gu = {e, w};
    for (int k = 0; k < plan.n_mb && !rc; k++) {
        if (plan.mb_split[k]) { /* too large for a micro-batch: the prompt once (engine/model/split.h) */
            const pack_group *g = &groups[plan.mb_first[k]];
            split_opts so = {max_tokens, temperature, -1, &e->split, e->ep_full ? ep_gate_split : NULL, &gu};
            rc = split_forward(&e->m, w, g, &so, out + done, ent ? ent + done : NULL, NULL);
            long long m0 = done;
            for (int r = 0; r < g->N; r++) done += g->R[r];
            for (long long i = m0 * top_k; top_k && i < done * top_k; i++) {
                top_ids[i] = -1;
                top_lps[i] = -INFINITY;
            }
            continue;
        }
        pack_batch b;
        if ((rc = pack_build(&b, groups, plan.mb_first[k], plan.mb_count[k], model_pack_layout(&e->m)))) break;
        model_input in;
        model_input_from_batch(&in, &b);
        rc = eng_acts_reserve(e, &e->acts_ng, b.T, b.M, 0);
        if (!rc) rc = ep_gate(e, w, MODEL_PASS_FWD); /* expert parallelism: meets the other ranks' pass */
        if (!rc) rc = model_forward(&e->m, w, &e->acts_ng, NULL, &in, temperature, ent != NULL);
        if (!rc) rc = e->be->to_host(e->be, out + done, e->acts_ng.logp, (size_t)b.M * 4);
        if (!rc && ent) rc = e->be->to_host(e->be, ent + done, e->acts_ng.ent, (size_t)b.M * 4);
        if (!rc && top_k && b.M)
            rc = score_top(e, w, &in, b.M, temperature, top_k, top_ids + done * top_k, top_lps + done * top_k);
        done += b.M;
        pack_batch_free(&b);
    }
    pack_plan_free(&plan);
    return rc;
}

pack_group eng_pack_group(const eng *e, const eng_update_group *g) {
    return (pack_group){.prompt = g->prompt,
                        .P = g->P,
                        .N = g->n,
                        .resp = g->resp,
                        .R = g->R,
                        .prompt_routes = g->prompt_routes,
                        .resp_routes = g->resp_routes,
                        .rl = config_n_moe(&e->m.cfg),
                        .rk = e->m.cfg.top_k};
}

int eng_logprobs(eng *e, const eng_update_group *g, int n, int use_reference, float temperature, long long max_tokens,
                 float ***out) {
    return eng_logprobs_top(e, g, n, use_reference, temperature, max_tokens, 0, out, NULL, NULL);
}

int eng_logprobs_top(eng *e, const eng_update_group *g, int n, int use_reference, float temperature, long long max_tokens, int k,
                     float ***out, int ***top_ids, float ***top_lps) {
    *out = NULL;
    if (k) *top_ids = NULL, *top_lps = NULL;
    pack_group *pg = calloc((size_t)n, sizeof *pg);
    long long M = 0, nresp = 0;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < g[i].n; r++) {
            M += g[i].R[r];
            nresp++;
        }
    size_t nr = (size_t)(nresp ? nresp : 1), mk = (size_t)(M ? M : 1) * (size_t)(k ? k : 1);
    float *all = malloc((size_t)(M ? M : 1) * sizeof(float));
    float **res = calloc(nr, sizeof *res);
    int *all_ids = k ? malloc(mk * sizeof(int)) : NULL, **ids = k ? calloc(nr, sizeof *ids) : NULL;
    float *all_lps = k ? malloc(mk * sizeof(float)) : NULL, **lps = k ? calloc(nr, sizeof *lps) : NULL;
    int rc = pg && all && res && (!k || (all_ids && ids && all_lps && lps)) ? 0 : err_set(GE_NOMEM, "logprobs: out of memory");
    if (!rc) {
        for (int i = 0; i < n; i++) pg[i] = eng_pack_group(e, &g[i]);
        rc = eng_score(e, use_reference ? &e->rv : &e->wv, pg, n, max_tokens, temperature, all, NULL, k, all_ids, all_lps);
    }
    rc = ep_gate_end(e, use_reference ? &e->rv : &e->wv, rc); /* every rank scored the same passes */
    for (long long i = 0, q = 0, off = 0; !rc && i < n; i++)
        for (int r = 0; r < g[i].n; r++, q++) {
            size_t R = (size_t)g[i].R[r];
            res[q] = malloc((R ? R : 1) * sizeof(float));
            if (k) {
                ids[q] = malloc((R ? R : 1) * (size_t)k * sizeof(int));
                lps[q] = malloc((R ? R : 1) * (size_t)k * sizeof(float));
            }
            if (!res[q] || (k && (!ids[q] || !lps[q]))) {
                rc = err_set(GE_NOMEM, "logprobs: out of memory");
                break;
            }
            memcpy(res[q], all + off, R * sizeof(float));
            if (k) {
                memcpy(ids[q], all_ids + off * k, R * (size_t)k * sizeof(int));
                memcpy(lps[q], all_lps + off * k, R * (size_t)k * sizeof(float));
            }
            off += (long long)R;
        }
    free(pg);
    free(all);
    free(all_ids);
    free(all_lps);
    if (rc) {
        eng_logprobs_free(res, g, n);
        eng_logprobs_top_free(ids, lps, g, n);
        return rc;
    }
    *out = res;
    if (k) *top_ids = ids, *top_lps = lps;
    return 0;
}

void eng_logprobs_top_free(int **ids, float **lps, const eng_update_group *g, int n) {
    long long q = 0;
    for (int i = 0; i < n; i++) q += g[i].n;
    for (long long i = 0; i < q; i++) {
        if (ids) free(ids[i]);
        if (lps) free(lps[i]);
    }
    free(ids);
    free(lps);
}

void eng_logprobs_free(float **out, const eng_update_group *g, int n) {
    if (!out) return;
    long long k = 0;
    for (int i = 0; i < n; i++) k += g[i].n;
    for (long long i = 0; i < k; i++) free(out[i]);
    free(out);
}
