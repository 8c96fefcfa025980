/* routes.h — the experts a rollout's tokens were routed to (MoE models), kept with its result so
 * an update can replay them (routing replay, kernels/moe.h; model.h model_input.routes).
 *
 * A token's record is W = Lm·k ints: the k experts of each of the model's Lm MoE layers, in layer
 * order, for the token as an input to the forward (a response's token i is an input at the step
 * that draws token i + 1, so a response's last token has none: -1). Records are token-major, one
 * row per token, -1 where nothing was recorded (the trainer routes such a token itself).
 *
 * rt_rec is the scheduler's staging of one dec_step: buf receives the step's routes, dst says
 * where each token's row goes (NULL: nowhere). Engine thread only; the caller owns the rows. */
#ifndef GRPOD_ROUTES_H
#define GRPOD_ROUTES_H

typedef struct {
    int W; /* ints a token: Lm·k; 0 for a dense model (nothing recorded) */
    int cap_T;
    int *buf; /* (cap_T, W) a step's routes (dec_step) */
    int **dst; /* (cap_T) each token's destination row, or NULL */
} rt_rec;

/* Room for a step of T tokens; 0 or GE_NOMEM. */
int rt_reserve(rt_rec *r, int T);
void rt_free(rt_rec *r);
/* n rows of W ints, every one -1 (malloc'd; NULL with GE_NOMEM set, or W == 0 and no error). */
int *rt_rows(int W, int n);
/* A response's rows grow as it decodes (max_tokens rows up front would hold W ints for every
 * token a response may never draw): row i of *rows (cap rows now), grown to hold it (new rows
 * -1), or NULL when memory ran out (the row is not recorded). */
int *rt_row(int **rows, int *cap, int i, int W);
/* At a response's end: *rows holds exactly n rows (those past cap -1); out of memory frees
 * them (NULL: the response has no routes). */
void rt_fit(int **rows, int *cap, int n, int W);
/* Rows [0, T) of buf to their destinations. */
void rt_scatter(const rt_rec *r, int T);
#endif
