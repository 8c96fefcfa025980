/* optim.c — optim.h: the learning-rate schedule and the clip coefficient, in double. */
#include "engine/train/optim.h"

#include <math.h>

double grad_clip_coef(double total_norm, double max_norm) {
    if (max_norm <= 0) return 1.0;
    double c = max_norm / (total_norm + 1e-6);
    return c < 1.0 ? c : 1.0;
}

float lr_schedule(float base_lr, int step, int warmup_steps, int schedule, int total_steps, float min_lr_ratio) {
    if (warmup_steps > 0 && step <= warmup_steps) return (float)((double)base_lr * (step - 1) / warmup_steps);
    if (schedule != 1) return base_lr;
    int span = total_steps - warmup_steps;
    double progress = (double)(step - 1 - warmup_steps) / (span > 1 ? span : 1);
    progress = progress < 0 ? 0 : progress > 1 ? 1 : progress;
    double cosv = 0.5 * (1.0 + cos(M_PI * progress));
    return (float)((double)base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosv));
}
