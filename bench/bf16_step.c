/* fp32 against bf16 training steps of the reference model (4 layers, hidden 256, 4 heads / 2 KV,
 * ffn 1024, vocab 256), interleaved in one process (fp32, bf16, fp32, bf16, ...) so that both
 * see the same machine load: medians of wall-clock and process-CPU seconds per forward +
 * backward, and the bf16 / fp32 ratio. Not a test; built by `make bench-bf16`.
 * usage: build/bench/bf16_step [S] [repeats] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "attention/seq_attention.h"
#include "core/common.h"
#include "kernels/bf16.h"
#include "bench/sgemm_bench.h"
#include "model/llama.h"

int main(int argc, char **argv) {
    int S = argc > 1 ? atoi(argv[1]) : 8192, repeats = argc > 2 ? atoi(argv[2]) : 5;
    if (S < 16 || repeats < 1) die("usage: bf16_step [S >= 16] [repeats >= 1]");
    LlamaConfig c = llama_reference_config();
    LlamaModel m;
    llama_build(&m, &c);
    llama_init_random(&m, 1);
    SeqAttention *attn[2]; /* the bf16 step's attention takes bf16 inputs (its kernel: attn_kernel_name) */
    LlamaActs *acts[2];
    for (int p = 0; p < 2; p++) {
        const Precision prec = p ? PRECISION_BF16 : PRECISION_FP32;
        attn[p] = local_attention_create((AttnHeads){.n_local = S, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64,
                                                     .precision = prec});
        LlamaActsOptions o = {.checkpoint = LLAMA_CKPT_NONE, .precision = prec};
        acts[p] = llama_acts_create_opts(&m, attn[p], S, &o);
    }
    int *in = xmalloc(sizeof(int) * S), *tg = xmalloc(sizeof(int) * S), *pos = xmalloc(sizeof(int) * S);
    Rng r;
    rng_seed(&r, 7);
    for (int i = 0; i < S; i++) {
        in[i] = (int)rng_below(&r, 256);
        tg[i] = (int)rng_below(&r, 256);
        pos[i] = i;
    }
    double *wall[2], *cpu[2];
    for (int p = 0; p < 2; p++) {
        wall[p] = xmalloc(sizeof(double) * repeats);
        cpu[p] = xmalloc(sizeof(double) * repeats);
    }
    for (int k = -1; k < repeats; k++) /* k = -1: warm-up of both */
        for (int p = 0; p < 2; p++) {
            memset(m.grads, 0, sizeof(float) * m.table.total);
            double w0 = now_seconds(), c0 = cpu_seconds();
            llama_forward_backward(&m, acts[p], attn[p], in, tg, pos, S, 1.0f / S, 1, NULL);
            if (k >= 0) {
                wall[p][k] = now_seconds() - w0;
                cpu[p][k] = cpu_seconds() - c0;
            }
        }
    double w32 = median_of(wall[0], repeats), w16 = median_of(wall[1], repeats);
    double c32 = median_of(cpu[0], repeats), c16 = median_of(cpu[1], repeats);
    printf("S = %d, %d interleaved repeats, bf16 path %s, bf16 attention %s: fp32 %.3f s (%.3f CPU s) | bf16 %.3f s "
           "(%.3f CPU s) | bf16 speed-up %.2fx wall, %.2fx CPU\n", S, repeats, bf16_path_name(bf16_kernels()->path),
           attn_kernel_name(PRECISION_BF16), w32, c32, w16, c16, w32 / w16, c32 / c16);
    return 0;
}
