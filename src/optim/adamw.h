/* AdamW with decoupled weight decay (torch.optim.AdamW semantics), a warmup + cosine learning-rate
 * schedule and global-norm gradient clipping. The optimizer state (first and second moments)
 * covers a range [begin, end) of the flat parameter buffer described by a ParamTable: the whole
 * buffer today, a ZeRO-1 shard later. Parameters and gradients are always passed as FULL flat
 * buffers indexed by absolute offset; only [begin, end) is read or written. */
#ifndef SEQPAR_ADAMW_H
#define SEQPAR_ADAMW_H

#include <stddef.h>

#include "core/param_table.h"

typedef struct {
    float lr;           /* peak learning rate (reached at the end of warmup) */
    float min_lr;       /* learning rate at the end of the cosine decay and after it */
    long warmup_steps;  /* linear warmup length; 0 = none */
    long total_steps;   /* end of the cosine decay; <= warmup_steps = constant lr after warmup */
    float beta1, beta2; /* 0.9, 0.95 */
    float eps;          /* 1e-8 */
    float weight_decay; /* 0.1, decoupled: p -= lr * wd * p */
    float grad_clip;    /* max global L2 norm of the gradient, 1.0; <= 0 disables clipping */
    int decay_all;      /* 0: tensors with no_decay = 1 (norms, embeddings) get no weight decay */
} AdamWConfig;

typedef struct {
    AdamWConfig cfg;
    size_t begin, end; /* the range of the flat buffer this state covers */
    float *m, *v;      /* end - begin elements each; m[i - begin] belongs to element i (NULL: the moments
                          live elsewhere, streamed through adamw_apply by their keeper) */
    long step;         /* updates applied so far (t in the bias corrections) */
} AdamW;

/* The defaults above: lr 3e-4, min_lr 3e-5, warmup 0, total 0, betas 0.9/0.95, eps 1e-8,
 * weight decay 0.1, clip 1.0, decay_all 0. */
void adamw_config_default(AdamWConfig *cfg);

/* Allocates zeroed m and v for [begin, end) and sets step = 0. Dies if begin > end or the
 * hyperparameters are unusable (lr < 0, betas outside [0, 1), eps <= 0, ...). */
void adamw_init(AdamW *opt, const AdamWConfig *cfg, size_t begin, size_t end);
/* The same with m and v left NULL: the moments are kept elsewhere (the optimizer offload's file,
 * parallel/optimizer_offload.h), which streams them through adamw_step_begin and adamw_apply. */
void adamw_init_unbacked(AdamW *opt, const AdamWConfig *cfg, size_t begin, size_t end);
void adamw_free(AdamW *opt);

/* Learning rate for 0-based step s (the step about to be taken):
 *   s < warmup:               lr * (s + 1) / warmup
 *   warmup <= s < total:      min_lr + 0.5 (lr - min_lr) (1 + cos(pi (s - warmup) / (total - warmup)))
 *   s >= total (and total > warmup): min_lr
 *   total <= warmup:          lr after warmup (no decay)
 * So the first step after warmup uses exactly lr, and step `total` is the first at min_lr. */
float lr_at_step(const AdamWConfig *cfg, long step);

/* Sum of g[i]^2 accumulated in double. The summation order is fixed (blocks of 4096 elements,
 * then the block sums in order), so the result is identical for any number of OpenMP threads.
 * A distributed caller allreduces (MPI_SUM) the per-rank values before taking the sqrt. */
double grad_norm_sq(const float *g, size_t n);

/* The clip factor for a global squared norm, like torch.nn.utils.clip_grad_norm_:
 * min(1, grad_clip / (sqrt(norm_sq) + 1e-6)); 1 when clipping is disabled. A non-finite norm
 * returns 1 (the caller should detect it and skip the step). */
float adamw_clip_scale(const AdamWConfig *cfg, double norm_sq);

/* One AdamW step on elements [opt->begin, opt->end) of params, using grads * grad_scale:
 *   t = ++opt->step; g = grad * grad_scale
 *   p -= lr * wd * p                  (only for tensors with decay: decay_all or !no_decay)
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * The decay flag is looked up per tensor of `table`, so the range may start and end mid-tensor.
 * Elements of the range not covered by any tensor are left untouched. OpenMP-parallel. */
void adamw_update(AdamW *opt, const ParamTable *table, float *params, const float *grads, float lr,
                  float grad_scale);
/* The same step where params and grads hold only part of the flat buffer: element i is
 * params[i - params_base] and grads[i - grads_base] (ZeRO-2/3 keep only a shard of the
 * gradient, ZeRO-3 also of the parameters). adamw_update is adamw_update_at with bases 0. */
void adamw_update_at(AdamW *opt, const ParamTable *table, float *params, size_t params_base, const float *grads,
                     size_t grads_base, float lr, float grad_scale);

/* adamw_update_at in two parts, for moments held in pieces: adamw_step_begin counts the step and
 * fixes its constants; adamw_apply updates elements [lo, hi) (inside [begin, end)) with m[i - lo]
 * and v[i - lo] the moments of element i. The update is element-wise, so pieces applied in any
 * order give the same bits as one adamw_update_at over the range. */
typedef struct {
    float lr, grad_scale;
    long t;
} AdamWStep;
void adamw_step_begin(AdamW *opt, float lr, float grad_scale, AdamWStep *s);
void adamw_apply(const AdamW *opt, const AdamWStep *s, const ParamTable *table, float *params, size_t params_base,
                 const float *grads, size_t grads_base, float *m, float *v, size_t lo, size_t hi);

#endif
