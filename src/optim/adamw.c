/* AdamW implementation: hyperparameter checks, the warmup + cosine schedule, a deterministic
 * double-precision gradient norm, and the element-wise update over a range of the flat buffer
 * (OpenMP over elements, with the weight-decay flag looked up per tensor). */
#include "optim/adamw.h"

#include <math.h>
#include <string.h>

#include "core/common.h"
#include "kernels/isa.h"

void adamw_config_default(AdamWConfig *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->lr = 3e-4f;
    cfg->min_lr = 3e-5f;
    cfg->warmup_steps = 0;
    cfg->total_steps = 0;
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.95f;
    cfg->eps = 1e-8f;
    cfg->weight_decay = 0.1f;
    cfg->grad_clip = 1.0f;
    cfg->decay_all = 0;
}

static void validate(const AdamWConfig *c) {
    if (!(c->lr >= 0) || !isfinite(c->lr)) die("AdamW lr %g is invalid: use a finite value >= 0", (double)c->lr);
    if (!(c->min_lr >= 0) || !isfinite(c->min_lr))
        die("AdamW min_lr %g is invalid: use a finite value >= 0", (double)c->min_lr);
    if (!(c->beta1 >= 0 && c->beta1 < 1)) die("AdamW beta1 %g is invalid: use a value in [0, 1)", (double)c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1)) die("AdamW beta2 %g is invalid: use a value in [0, 1)", (double)c->beta2);
    if (!(c->eps > 0) || !isfinite(c->eps)) die("AdamW eps %g is invalid: use a finite value > 0", (double)c->eps);
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        die("AdamW weight_decay %g is invalid: use a finite value >= 0", (double)c->weight_decay);
    if (isnan(c->grad_clip)) die("AdamW grad_clip is NaN: use a positive value, or <= 0 to disable clipping");
    if (c->warmup_steps < 0) die("AdamW warmup_steps %ld is negative: use 0 or more", c->warmup_steps);
}

void adamw_init_unbacked(AdamW *opt, const AdamWConfig *cfg, size_t begin, size_t end) {
    validate(cfg);
    if (begin > end) die("AdamW range [%zu, %zu) is empty or reversed: begin must not exceed end", begin, end);
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    opt->begin = begin;
    opt->end = end;
    opt->step = 0;
}

void adamw_init(AdamW *opt, const AdamWConfig *cfg, size_t begin, size_t end) {
    adamw_init_unbacked(opt, cfg, begin, end);
    size_t n = end - begin;
    opt->m = xcalloc(n ? n : 1, sizeof(float));
    opt->v = xcalloc(n ? n : 1, sizeof(float));
}

void adamw_free(AdamW *opt) {
    xfree(opt->m);
    xfree(opt->v);
    opt->m = opt->v = NULL;
}

float lr_at_step(const AdamWConfig *c, long s) {
    if (s < 0) s = 0;
    if (c->warmup_steps > 0 && s < c->warmup_steps)
        return (float)((double)c->lr * (double)(s + 1) / (double)c->warmup_steps);
    if (c->total_steps <= c->warmup_steps) return c->lr;
    if (s >= c->total_steps) return c->min_lr;
    double progress = (double)(s - c->warmup_steps) / (double)(c->total_steps - c->warmup_steps);
    double cosw = 0.5 * (1.0 + cos(M_PI * progress));
    return (float)((double)c->min_lr + cosw * ((double)c->lr - (double)c->min_lr));
}

#define NORM_BLOCK 4096

double grad_norm_sq(const float *g, size_t n) {
    size_t nb = (n + NORM_BLOCK - 1) / NORM_BLOCK;
    if (nb <= 1) {
        double s = 0;
        for (size_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
        return s;
    }
    double *part = xmalloc(nb * sizeof(double));
    #pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * NORM_BLOCK, hi = lo + NORM_BLOCK < n ? lo + NORM_BLOCK : n;
        double s = 0;
        for (size_t i = lo; i < hi; i++) s += (double)g[i] * (double)g[i];
        part[b] = s;
    }
    double total = 0;
    for (size_t b = 0; b < nb; b++) total += part[b];
    xfree(part);
    return total;
}

float adamw_clip_scale(const AdamWConfig *cfg, double norm_sq) {
    if (!(cfg->grad_clip > 0) || !isfinite(norm_sq)) return 1.0f;
    double coef = (double)cfg->grad_clip / (sqrt(norm_sq) + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

void adamw_update(AdamW *opt, const ParamTable *table, float *params, const float *grads, float lr,
                  float grad_scale) {
    adamw_update_at(opt, table, params, 0, grads, 0, lr, grad_scale);
}

void adamw_update_at(AdamW *opt, const ParamTable *table, float *params, size_t params_base, const float *grads,
                     size_t grads_base, float lr, float grad_scale) {
    AdamWStep s;
    adamw_step_begin(opt, lr, grad_scale, &s);
    adamw_apply(opt, &s, table, params, params_base, grads, grads_base, opt->m, opt->v, opt->begin, opt->end);
}

void adamw_step_begin(AdamW *opt, float lr, float grad_scale, AdamWStep *s) {
    s->lr = lr;
    s->grad_scale = grad_scale;
    s->t = ++opt->step;
}

void adamw_apply(const AdamW *opt, const AdamWStep *s, const ParamTable *table, float *params, size_t params_base,
                 const float *grads, size_t grads_base, float *m, float *v, size_t begin, size_t end) {
    const AdamWConfig *c = &opt->cfg;
    const float lr = s->lr;
    double bc1 = 1.0 - pow((double)c->beta1, (double)s->t);
    double bc2 = 1.0 - pow((double)c->beta2, (double)s->t);
    const float step_size = (float)((double)lr / bc1);
    const float inv_bc2_sqrt = (float)(1.0 / sqrt(bc2));
    const float decay_mul = (float)(1.0 - (double)lr * (double)c->weight_decay);
    const SimdKernels *sk = simd();
    const AdamWConsts base = {c->beta1, c->beta2, 1.0f - c->beta1, 1.0f - c->beta2, c->eps, step_size, inv_bc2_sqrt,
                              decay_mul, s->grad_scale};
    enum { BLOCK = 4096 }; /* elements per dispatched kernel call */

    #pragma omp parallel
    for (int k = 0; k < table->n; k++) {
        const ParamTensor *pt = &table->t[k];
        size_t lo = pt->offset > begin ? pt->offset : begin;
        size_t tend = pt->offset + pt->numel;
        size_t hi = tend < end ? tend : end;
        if (lo >= hi) continue;
        AdamWConsts kc = base;
        if (!(c->decay_all || !pt->no_decay)) kc.decay_mul = 1.0f;
        const long long nb = (long long)((hi - lo + BLOCK - 1) / BLOCK);
        #pragma omp for schedule(static) nowait
        for (long long b = 0; b < nb; b++) {
            size_t i = lo + (size_t)b * BLOCK, len = hi - i < BLOCK ? hi - i : BLOCK;
            sk->adamw(params + (i - params_base), grads + (i - grads_base), m + (i - begin), v + (i - begin), len,
                      &kc);
        }
    }
}
