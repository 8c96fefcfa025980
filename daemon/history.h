/* history.h — the training history the dashboard plots (daemon/history.c): a finished rollout
 * or update job's result summarised into one store row. Engine thread (its store handle). */
#ifndef GRPOD_DAEMON_HISTORY_H
#define GRPOD_DAEMON_HISTORY_H
#include "store/store.h"

/* kind "rollout" (stats: reward_mean, reward_std, responses, completion_tokens, ms,
 * tokens_per_s) or "update" (loss, kl, entropy, clip_frac, grad_norm, lr, tokens_packed,
 * tokens_standard, ms, tokens_per_s); other kinds are not recorded. */
void history_record(store *st, const char *kind, const char *result, long long policy_version);
/* The row history_record stores (malloc'd JSON text; NULL for other kinds, a result that does
 * not parse, or out of memory) and the policy version it is plotted at (*v). */
char *history_point(const char *kind, const char *result, long long policy_version, long long *v);
#endif
