/* Tests for the AdamW optimizer: the update against a double-precision reference of the
 * torch.optim.AdamW formulas (with clip scaling, no_decay tensors and decay_all), a range update
 * that starts and ends mid-tensor matching the same elements of a full update, the learning-rate
 * schedule, the clip factor, and grad_norm_sq against a plain double sum. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/param_table.h"
#include "optim/adamw.h"
#include "testlib.h"

/* embed [2,7] (no decay), weight [5,6] (decay), norm [9] (no decay): 53 elements. */
static ParamTensor g_tensors[3];
static ParamTable make_table(void) {
    ParamTensor *t = g_tensors;
    memset(t, 0, sizeof g_tensors);
    strcpy(t[0].name, "model.embed_tokens.weight");
    t[0].ndim = 2; t[0].shape[0] = 2; t[0].shape[1] = 7; t[0].offset = 0; t[0].numel = 14; t[0].no_decay = 1;
    strcpy(t[1].name, "model.layers.0.mlp.up_proj.weight");
    t[1].ndim = 2; t[1].shape[0] = 5; t[1].shape[1] = 6; t[1].offset = 14; t[1].numel = 30; t[1].no_decay = 0;
    strcpy(t[2].name, "model.norm.weight");
    t[2].ndim = 1; t[2].shape[0] = 9; t[2].offset = 44; t[2].numel = 9; t[2].no_decay = 1;
    ParamTable tab = { t, 3, 53 };
    return tab;
}

static int decays(const ParamTable *tab, size_t i, int decay_all) {
    for (int k = 0; k < tab->n; k++)
        if (i >= tab->t[k].offset && i < tab->t[k].offset + tab->t[k].numel) return decay_all || !tab->t[k].no_decay;
    return 0;
}

/* Runs `steps` steps of the float optimizer and the double reference on the same gradients and
 * returns the worst tolerance violation of params, m and v. */
static double run_vs_reference(const AdamWConfig *cfg, int steps, float grad_mag, int *clipped_steps) {
    ParamTable tab = make_table();
    size_t n = tab.total;
    float *p = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    double *rp = calloc(n, sizeof(double)), *rm = calloc(n, sizeof(double)), *rv = calloc(n, sizeof(double));
    Rng rng; rng_seed(&rng, 1234);
    for (size_t i = 0; i < n; i++) { p[i] = (float)rng_normal(&rng); rp[i] = p[i]; }
    AdamW opt; adamw_init(&opt, cfg, 0, n);
    double worst = 0;
    *clipped_steps = 0;
    for (int s = 0; s < steps; s++) {
        for (size_t i = 0; i < n; i++) g[i] = (float)(grad_mag * rng_normal(&rng));
        float lr = lr_at_step(cfg, s);
        double nsq = grad_norm_sq(g, n);
        float scale = adamw_clip_scale(cfg, nsq);
        if (scale < 1.0f) (*clipped_steps)++;
        /* reference: clip coefficient as torch.nn.utils.clip_grad_norm_ */
        double rscale = 1.0;
        if (cfg->grad_clip > 0) {
            double c = (double)cfg->grad_clip / (sqrt(nsq) + 1e-6);
            if (c < 1) rscale = c;
        }
        CHECK(fabs(rscale - scale) <= 1e-6 * rscale, "clip scale %g vs %g", (double)scale, rscale);
        adamw_update(&opt, &tab, p, g, lr, scale);
        int t = s + 1;
        double b1 = cfg->beta1, b2 = cfg->beta2;
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * rscale;
            if (decays(&tab, i, cfg->decay_all)) rp[i] -= (double)lr * cfg->weight_decay * rp[i];
            rm[i] = b1 * rm[i] + (1 - b1) * gi;
            rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
            double mhat = rm[i] / (1 - pow(b1, t)), vhat = rv[i] / (1 - pow(b2, t));
            rp[i] -= (double)lr * mhat / (sqrt(vhat) + cfg->eps);
        }
        double w;
        w = tl_max_violation(p, rp, n, 1e-6, 1e-5, NULL); if (w > worst) worst = w;
        w = tl_max_violation(opt.m, rm, n, 1e-9, 1e-5, NULL); if (w > worst) worst = w;
        w = tl_max_violation(opt.v, rv, n, 1e-12, 1e-5, NULL); if (w > worst) worst = w;
    }
    CHECK(opt.step == steps, "step count %ld, expected %d", opt.step, steps);
    adamw_free(&opt);
    free(p); free(g); free(rp); free(rm); free(rv);
    return worst;
}

static void test_reference(void) {
    AdamWConfig cfg; adamw_config_default(&cfg);
    cfg.lr = 1e-2f; cfg.min_lr = 1e-3f; cfg.warmup_steps = 2; cfg.total_steps = 6;
    int clipped = 0;
    /* large gradients: every step clipped */
    double w = run_vs_reference(&cfg, 6, 1.0f, &clipped);
    CHECK(w <= 1, "clipped steps: violation %g", w);
    CHECK(clipped == 6, "expected 6 clipped steps, got %d", clipped);
    /* small gradients: never clipped */
    w = run_vs_reference(&cfg, 6, 0.01f, &clipped);
    CHECK(w <= 1, "unclipped steps: violation %g", w);
    CHECK(clipped == 0, "expected no clipped steps, got %d", clipped);
    /* decay_all, clipping disabled, large weight decay to make the decay visible */
    cfg.decay_all = 1; cfg.grad_clip = 0; cfg.weight_decay = 0.5f;
    w = run_vs_reference(&cfg, 5, 1.0f, &clipped);
    CHECK(w <= 1, "decay_all: violation %g", w);
    CHECK(clipped == 0, "clipping disabled but %d steps clipped", clipped);
}

/* With zero gradients the only change is weight decay: no_decay tensors stay exactly as they are. */
static void test_no_decay_exact(void) {
    ParamTable tab = make_table();
    size_t n = tab.total;
    float p[53], p0[53], g[53];
    for (size_t i = 0; i < n; i++) { p[i] = p0[i] = 1.0f + (float)i; g[i] = 0; }
    AdamWConfig cfg; adamw_config_default(&cfg); cfg.weight_decay = 0.1f;
    AdamW opt; adamw_init(&opt, &cfg, 0, n);
    adamw_update(&opt, &tab, p, g, 0.5f, 1.0f);
    int ok_nd = 1, ok_d = 1;
    for (size_t i = 0; i < n; i++) {
        if (decays(&tab, i, 0)) { if (fabsf(p[i] - p0[i] * 0.95f) > 1e-5f * p0[i]) ok_d = 0; }
        else if (p[i] != p0[i]) ok_nd = 0;
    }
    CHECK(ok_nd, "no_decay tensors changed under zero gradients");
    CHECK(ok_d, "decayed tensors not scaled by 1 - lr*wd");
    adamw_free(&opt);
}

static void test_range_update(void) {
    ParamTable tab = make_table();
    size_t n = tab.total, b = 10, e = 49; /* starts mid-embed, spans up_proj, ends mid-norm */
    float *pa = malloc(n * sizeof(float)), *pb = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    Rng rng; rng_seed(&rng, 99);
    for (size_t i = 0; i < n; i++) pa[i] = pb[i] = (float)rng_normal(&rng);
    float *orig = malloc(n * sizeof(float)); memcpy(orig, pb, n * sizeof(float));
    AdamWConfig cfg; adamw_config_default(&cfg); cfg.lr = 1e-2f; cfg.weight_decay = 0.3f;
    AdamW full, part;
    adamw_init(&full, &cfg, 0, n);
    adamw_init(&part, &cfg, b, e);
    for (int s = 0; s < 4; s++) {
        for (size_t i = 0; i < n; i++) g[i] = (float)rng_normal(&rng);
        float scale = adamw_clip_scale(&cfg, grad_norm_sq(g, n));
        adamw_update(&full, &tab, pa, g, 1e-2f, scale);
        adamw_update(&part, &tab, pb, g, 1e-2f, scale);
    }
    int in_eq = 1, out_untouched = 1, mv_eq = 1;
    for (size_t i = 0; i < n; i++) {
        if (i >= b && i < e) {
            if (memcmp(&pa[i], &pb[i], sizeof(float))) in_eq = 0;
            if (memcmp(&full.m[i], &part.m[i - b], sizeof(float)) || memcmp(&full.v[i], &part.v[i - b], sizeof(float)))
                mv_eq = 0;
        } else if (memcmp(&pb[i], &orig[i], sizeof(float))) out_untouched = 0;
    }
    CHECK(in_eq, "range update differs from the full update inside [%zu, %zu)", b, e);
    CHECK(mv_eq, "range m/v differ from the full update's");
    CHECK(out_untouched, "range update touched elements outside [%zu, %zu)", b, e);
    CHECK(part.step == 4 && full.step == 4, "step counts %ld %ld", part.step, full.step);
    adamw_free(&full); adamw_free(&part);
    free(pa); free(pb); free(g); free(orig);
}

static int close_to(float a, double b) { return fabs((double)a - b) <= 1e-6 * fabs(b) + 1e-12; }

static void test_schedule(void) {
    AdamWConfig c; adamw_config_default(&c);
    c.lr = 1e-3f; c.min_lr = 1e-4f; c.warmup_steps = 10; c.total_steps = 110;
    CHECK(close_to(lr_at_step(&c, 0), 1e-4), "warmup step 0: %g", (double)lr_at_step(&c, 0));
    CHECK(close_to(lr_at_step(&c, 4), 5e-4), "warmup step 4: %g", (double)lr_at_step(&c, 4));
    CHECK(lr_at_step(&c, 9) == c.lr, "last warmup step: %g", (double)lr_at_step(&c, 9));
    CHECK(lr_at_step(&c, 10) == c.lr, "peak after warmup: %g", (double)lr_at_step(&c, 10));
    CHECK(close_to(lr_at_step(&c, 60), 5.5e-4), "cosine midpoint: %g", (double)lr_at_step(&c, 60));
    double near_end = 1e-4 + 0.5 * 9e-4 * (1 + cos(M_PI * 99.0 / 100.0));
    CHECK(close_to(lr_at_step(&c, 109), near_end), "last decay step: %g", (double)lr_at_step(&c, 109));
    CHECK(lr_at_step(&c, 110) == c.min_lr, "end of decay: %g", (double)lr_at_step(&c, 110));
    CHECK(lr_at_step(&c, 100000) == c.min_lr, "past total: %g", (double)lr_at_step(&c, 100000));
    int mono = 1;
    for (long s = 10; s < 120; s++) if (lr_at_step(&c, s + 1) > lr_at_step(&c, s)) mono = 0;
    CHECK(mono, "decay not monotone");
    c.warmup_steps = 0;
    CHECK(lr_at_step(&c, 0) == c.lr, "no warmup: step 0 should be the peak, got %g", (double)lr_at_step(&c, 0));
    c.warmup_steps = 5; c.total_steps = 0;
    CHECK(lr_at_step(&c, 1000) == c.lr, "no decay (total <= warmup): %g", (double)lr_at_step(&c, 1000));
}

static void test_clip_scale(void) {
    AdamWConfig c; adamw_config_default(&c); c.grad_clip = 1.0f;
    CHECK(adamw_clip_scale(&c, 0.25) == 1.0f, "norm 0.5 < clip: scale should be 1");
    CHECK(close_to(adamw_clip_scale(&c, 16.0), 1.0 / (4.0 + 1e-6)), "norm 4: %g", (double)adamw_clip_scale(&c, 16.0));
    c.grad_clip = 0;
    CHECK(adamw_clip_scale(&c, 1e6) == 1.0f, "clip disabled: scale should be 1");
    c.grad_clip = 1.0f;
    CHECK(adamw_clip_scale(&c, INFINITY) == 1.0f, "non-finite norm: scale should be 1");
}

static void test_grad_norm(void) {
    Rng rng; rng_seed(&rng, 7);
    size_t small = 1000, big = 1000003;
    float *g = malloc(big * sizeof(float));
    for (size_t i = 0; i < big; i++) g[i] = (float)(rng_normal(&rng) * (i % 17 == 0 ? 100.0 : 0.01));
    double ref = 0;
    for (size_t i = 0; i < small; i++) ref += (double)g[i] * (double)g[i];
    CHECK(grad_norm_sq(g, small) == ref, "small grad_norm_sq %.17g vs %.17g", grad_norm_sq(g, small), ref);
    ref = 0;
    for (size_t i = 0; i < big; i++) ref += (double)g[i] * (double)g[i];
    double got = grad_norm_sq(g, big);
    CHECK(fabs(got - ref) <= 1e-13 * ref, "big grad_norm_sq %.17g vs %.17g", got, ref);
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    double one = grad_norm_sq(g, big);
    omp_set_num_threads(nt > 1 ? nt : 4);
    double many = grad_norm_sq(g, big);
    omp_set_num_threads(nt);
    CHECK(one == many, "grad_norm_sq depends on the thread count: %.17g vs %.17g", one, many);
    CHECK(grad_norm_sq(g, 0) == 0, "empty grad_norm_sq");
    free(g);
}

int main(void) {
    test_reference();
    test_no_decay_exact();
    test_range_update();
    test_schedule();
    test_clip_scale();
    test_grad_norm();
    return test_summary("test_optim");
}
