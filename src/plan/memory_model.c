/* The memory model: see memory_model.h. Every term names the allocation it stands for. */
#include "plan/memory_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attention/flash_attention.h"
#include "core/common.h"
#include "kernels/attn_bf16.h"
#include "kernels/bf16.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "model/llama.h"
#include "parallel/block_attention.h"
#include "parallel/head_exchange.h"

static const char *const NAMES[MEM_COMPONENTS] = {
    "parameters", "gradients", "optimizer moments", "saved activations",
    "layer working set + transient", "attention / communication buffers", "token buffers"};

const char *memory_component_name(MemComponent c) { return c >= 0 && c < MEM_COMPONENTS ? NAMES[c] : "?"; }

/* Floats of the units data_parallel.c shards: the embedding, one layer, the tail. */
/* Elements of [b, e) inside [ub, ue). */
static double overlap(double b, double e, double ub, double ue) {
    const double lo = b > ub ? b : ub, hi = e < ue ? e : ue;
    return hi > lo ? hi - lo : 0;
}

void memory_model_unit_sizes(const LlamaConfig *c, double *embed, double *layer, double *tail) {
    double D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    double qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
    *embed = V * D;
    *layer = 2 * D + 2 * qd * D + 2 * kvd * D + 3 * F * D + (c->qkv_bias ? qd + 2 * kvd : 0) + (c->o_bias ? D : 0) +
             (c->qk_norm ? 2.0 * c->head_dim : 0);
    *tail = D + (c->tie_word_embeddings ? 0 : V * D);
}

/* hp rank of world rank w under the placement (topology.h: context-first d sp + h cp + c; the
 * others d sp + c hp + h). */
static int hp_rank_of(int w, int hp, int cp, Placement pl) {
    int in_replica = w % (hp * cp);
    return pl == PLACEMENT_CONTEXT_FIRST ? in_replica / cp : in_replica % hp;
}

/* The transient buffers of flash attention's kernels for one call of nq query rows and nk key
 * rows (kv_heads key / value heads, group query heads each): per-thread tiles; the compact copies
 * made once per call forward (K and V of every kv head of the call: K in the score product's panels,
 * whole key tiles) and once per pass backward (Q and dO of the pass's query heads and rows:
 * attn_backward_pass_rows), as fp32 or, with the bf16 tiles (attn_bf16.h, bt non-NULL), as pair
 * words (K panels, or rows where the table has none, and V pairs; Q and dO rows and pairs; V^T,
 * Q^T and dO^T in rows a tile at a time instead of the pairs where the table accumulates
 * transposed) with
 * per-thread pair-word tiles; in backward one dq copy of the pass per dq slot beyond
 * the first (attn_backward_dq_slots), and with several passes the kv head's dK and dV (flash_attention.c), with
 * bf16_inputs (AttnShape.q16) a tile of them widened per thread. Floats (a pair word is one). */
static double flash_transient(int threads, double nq, double nk, int kv_heads, int group, int d,
                              const AttnBf16Tiles *bt, int bf16_inputs) {
    const SimdKernels *sk = simd();
    const double fbq = bt ? bt->fwd_bq : sk->fwd_bq, fbk = bt ? bt->fwd_bk : sk->fwd_bk;
    const double bbq = bt ? bt->bwd_bq : sk->bwd_bq, bbk = bt ? bt->bwd_bk : sk->bwd_bk;
    const double skew = 16, ldt = fbq + skew, ldc = d + skew, ldp = bbk + skew;
    double fwd = threads * ((double)d * ldt + fbk * ldt + fbq * d + 6.0 * fbq + 16);
    const double pr = attn_backward_pass_rows((int)nq, (int)nk, group, d, (int)bbq, bt != NULL, threads);
    const double ph = pr < nq ? 1 : group; /* query heads per pass */
    double bwd = threads * (2.0 * d * ldp + 2.0 * bbq * ldp + 2.0 * bbk * d + bbk * ldc + 16 +
                            (bf16_inputs ? (bbq > bbk ? bbq : bbk) * d : 0)) + /* a tile of bf16 inputs widened */
                 (attn_backward_dq_slots(threads) - 1.0) * pr * ph * d + (pr < nq ? 2.0 * nk * d : 0);
    if (!bt) { /* K in panels of the kernel's micro-kernel rows, whole key tiles; V compact rows */
        const double mr = sk->gemm_mr, bkp = ceil(fbk / mr) * mr;
        fwd += kv_heads * (ceil(nk / fbk) * bkp * d + nk * ldc);
        bwd += 2.0 * ph * pr * ldc;
    } else {
        const double d2 = (d + 1) / 2, bk2 = ((int)fbk + 1) / 2, ldkw = (double)attn_bf16_rows_ld(bt, (int)d2), ldvw = d + skew / 2;
        /* K a key tile at a time: in the table's panels, or (AMX) rows of ldkw words */
        const double ktile = bt->panel_mr ? ceil(fbk / bt->panel_mr) * bt->panel_mr * d2 : fbk * ldkw;
        /* V pairs, or (fwd_acc_transposed) V^T rows a key tile at a time, d x ceil16(bk2) words each */
        const double vall = bt->fwd_acc_transposed ? ceil(nk / fbk) * d * ceil(bk2 / 16) * 16
                                                   : (double)(((long)nk + 1) / 2) * ldvw;
        fwd += threads * (fbq * d2 + d2 * ldt + bk2 * ldt + 16) + kv_heads * (ceil(nk / fbk) * ktile + vall);
        const double b_bk2 = ((int)bbk + 1) / 2, b_bq2 = ((int)bbq + 1) / 2, ldsw = b_bk2 + skew;
        /* Q and dO pairs, or (bwd_acc_transposed) Q^T and dO^T rows a query tile at a time */
        const double qpairs = bt->bwd_acc_transposed && b_bq2 <= ldp ? ceil(pr / bbq) * d * ceil(b_bq2 / 16) * 16
                                                                     : (double)(((long)pr + 1) / 2) * ldvw;
        bwd += threads * (2.0 * d2 * ldp + b_bk2 * ldc + bbk * d2 + b_bq2 * ldp + bbq * ldsw + 16) +
               2.0 * ph * pr * ldkw + 2.0 * ph * qpairs;
    }
    return fwd > bwd ? fwd : bwd;
}

double memory_model_flash_floats(int threads, double nq, double nk, int kv_heads, int group, int d) {
    return flash_transient(threads, nq, nk, kv_heads, group, d, NULL, 0);
}

/* The bf16 GEMMs' operand copies (ops.c's Bf16Scratch, kept across calls: as large as the
 * largest call's two operand copies together) over R rows of the attention half's projections
 * and fr rows of the MLP's (F-wide rows ldF apart), as llama.c calls them: bf16 copies on the
 * VDPBF16PS path, fp32 copies of bf16 values on the conversion path (ops.h), which copies only W
 * and the operands llama.c has not made as bf16 values already (BF16_IN_ROUNDED,
 * BF16_DOUT_ROUNDED: the residual stream's gradient, the output gradient of o and down). Floats. */
static double gemm_bf16_scratch(double R, double fr, double D, double qd, double kvd, double F, double ldF) {
    /* rows, n_in, n_out, the row strides of in and out, whether the backward call has an input /
     * a weight gradient, and whether its input / output gradient is rounded already */
    const struct { double n, in, out, ld_in, ld_out; int din, dW, x_r, d_r; } calls[] = {
        {R, D, qd, D, qd, 1, 1, 1, 1}, {R, D, kvd, D, kvd, 1, 1, 1, 1}, {R, qd, D, qd, D, 1, 1, 1, 0}, /* q, k|v, o */
        {fr, D, F, D, ldF, 1, 1, 1, 1}, {fr, F, D, ldF, D, 0, 1, 1, 0}, {fr, F, D, ldF, D, 1, 0, 1, 0}}; /* gate|up; down: dW, then din */
    double scratch = 0, conv = 0;
#define MAX_INTO(x, y) ((x) = (y) > (x) ? (y) : (x))
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        const double n = calls[i].n, in = calls[i].in, out = calls[i].out;
        const double rows_in = n * calls[i].ld_in, rows_out = n * calls[i].ld_out;
        const double w = calls[i].din ? out * in : 0, x = calls[i].dW ? rows_in : 0;
        const double x_copy = calls[i].x_r ? 0 : x, w_or_x = w > x_copy ? w : x_copy;
        MAX_INTO(scratch, (double)bf16_scratch_elems((size_t)rows_in, (size_t)(out * in)));   /* forward */
        MAX_INTO(scratch, (double)bf16_scratch_elems((size_t)rows_out, (size_t)(w > x ? w : x))); /* backward */
        MAX_INTO(conv, (double)bf16_scratch_f32_elems(calls[i].x_r ? 0 : (size_t)rows_in, (size_t)(out * in)));
        MAX_INTO(conv, (double)bf16_scratch_f32_elems(calls[i].d_r ? 0 : (size_t)rows_out, (size_t)w_or_x));
    }
#undef MAX_INTO
    return bf16_products_on_sgemm() ? conv : 0.5 * scratch;
}

char *batch_split_error(int batch, int dp) {
    if (dp > 0 && batch % dp == 0) return NULL;
    return xstrdup_printf("--batch %d does not split over --dp %d replicas: use a batch divisible by %d", batch, dp, dp);
}

char *memory_model_estimate(const MemoryModelInput *in, MemoryEstimate *out) {
    memset(out, 0, sizeof *out);
    const LlamaConfig *c = &in->model;
    const ParallelConfig *pc = &in->par;
    const int world = in->world > 0 ? in->world : 1;
    if (in->precision != PRECISION_FP32 && in->precision != PRECISION_BF16)
        return xstrdup_printf("precision %d is not fp32 or bf16: use --precision fp32 or bf16", in->precision);
    const int bf16 = in->precision == PRECISION_BF16;
    /* the kernel's bf16 tiles where this CPU has them (else the fp32 kernel on bf16 inputs) */
    const AttnBf16Tiles *bt = bf16 ? attn_bf16_tiles() : NULL;
    const Strategy *s = strategy_named(pc->strategy);
    if (!s) return strategy_unknown_message(pc->strategy);
    int sp_ranks = pc->dp > 0 ? (world % pc->dp == 0 ? world / pc->dp : 0) : world, hp, cp;
    char *err = strategy_grid(s, pc->hp, pc->cp, sp_ranks, c->num_attention_heads, &hp, &cp);
    if (err) return err;
    int dp = pc->dp > 0 ? pc->dp : (world % (hp * cp) == 0 ? world / (hp * cp) : 1);
    if (dp * hp * cp != world)
        return xstrdup_printf("dp %d x hp %d x cp %d is not the %d ranks: give --dp, --hp, --cp (or --ranks) whose product "
                       "is the ranks", dp, hp, cp, world);
    const int sp = hp * cp, own = s->own != NULL;
    StrategyParams sp_params;
    strategy_params_init(s, pc, dp, hp, cp, in->seq_len, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
                         bf16, &sp_params);
    char *unread = parallel_flags_check(s, pc);
    if (unread) return unread;
    if (cp % sp_params.ring_inner != 0) /* topology_init's refusal, which the strategies' checks skip at sp = 1 */
        return xstrdup_printf("--ring-inner %d does not divide --cp %d: pick an inner ring size that divides the "
                              "context group (W = cp is the plain ring)", sp_params.ring_inner, cp);
    if (pc->offload_dir && !(s->reads & KNOB_CHUNK_OFFLOAD) && in->checkpoint == LLAMA_CKPT_NONE)
        return strategy_knob_refusal(KNOB_CHUNK_OFFLOAD, s, pc);
    if (sp > 1 || own) {
        err = strategy_check(s, &sp_params);
        if (err) return err;
    } else if (knobs_given(&pc->knobs)) { /* as seq_parallel_create */
        err = strategy_sp1_check(s, &sp_params);
        if (err) return err;
    }
    if (in->seq_len % sp != 0) return xstrdup_printf("--seq-len %ld does not split over %d sequence-parallel ranks: use a multiple of %d", in->seq_len, sp, sp);
    const int zero = pc->zero, group = pc->zero_group > 0 ? pc->zero_group : world;
    err = zero_flags_error(zero, pc->zero_group, world); /* grad_sync_init's refusals */
    if (!err) err = optimizer_offload_flags_error(pc->offload_optimizer, pc->offload_master, zero, world);
    if (err) return err;
    err = batch_split_error(in->batch, dp);
    if (err) return err;
    const int threads = pc->threads > 0 ? pc->threads : (in->cores / world > 1 ? in->cores / world : 1);

    /* sizes, floats (double: no overflow) */
    const double N = (double)(in->seq_len / sp), S = (double)in->seq_len;
    const double D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size, L = c->num_hidden_layers;
    const double ldF = linear_row_stride(c->intermediate_size); /* the MLP's rows, as the model lays them out (layer_memory.c) */
    const double qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
    const double d = c->head_dim;
    double E, Lu, T;
    memory_model_unit_sizes(c, &E, &Lu, &T);
    const double P = E + L * Lu + T;
    const int per_replica = in->batch / dp;
    const int ckpt = in->checkpoint;
    /* chunk streaming (llama.h): a streaming strategy's chunk calls exist for --chunks > 1 */
    const int su = strategy_attention_chunks(s, &sp_params);
    const int stream = s->streams && llama_streams(su, ckpt, in->no_stream);
    const double Cr = stream ? N / su : N; /* rows of the layer's scratch */
    /* FFN chunks exactly as llama_acts_create_opts */
    long Nl = (long)N, K = in->ffn_chunks > 0 ? in->ffn_chunks : llama_ffn_chunks_default(c, Nl, stream, su), rows;
    const long chunks = llama_ffn_chunk_count(Nl, K, stream ? su : 1, stream ? Nl / su : Nl, &rows);
    const int store_gate_up = ckpt == LLAMA_CKPT_NONE && chunks == 1;
    /* rows of xn, dxn and of the attention projections' calls: a chunk's (streaming) or an FFN
     * chunk's (whole layers: every token-wise part runs over FFN chunks) */
    const double Xr = stream ? Cr : (double)rows;
    /* layer-input offload (--offload-dir with layer or selective checkpointing) */
    const int offload_inputs = pc->offload_dir && ckpt != LLAMA_CKPT_NONE;
    long in_chunks = llama_input_chunks(Nl), in_rows = Nl > 0 ? (Nl + in_chunks - 1) / in_chunks : 1;

    /* what a rank's attention holds depends on its head-parallel rank alone: each hp rank's once */
    HeadSplit hs = {0};
    AttnMemory *am_of = NULL;
    if (sp > 1 || own) {
        am_of = xmalloc(sizeof *am_of * (size_t)hp);
        for (int h = 0; h < hp; h++) strategy_memory(s, &sp_params, h, &am_of[h]);
        err = head_split_init(&hs, hp, c->num_attention_heads, c->num_key_value_heads);
        if (err) {
            xfree(am_of);
            return err;
        }
    }
    /* the kernel's transient buffers depend on the rank's head-parallel rank alone (its heads and
     * rows a call), and the bf16 products' scratch on none: each once, not once a rank */
    double *flash_of = xmalloc(sizeof(double) * (size_t)hp);
    for (int h = 0; h < hp; h++) flash_of[h] = NAN;
    double bf16_scratch = 0;
    if (bf16) { /* the products' shared scratch (the head's chunks too) and the head's bf16 copy */
        const double ce = N < 256 ? N : 256, head = 0.5 * (double)lm_head_bf16_scratch_elems((int)ce, (int)D, (int)V);
        const double mm = gemm_bf16_scratch(Xr, (double)rows, D, qd, kvd, F, ldF);
        bf16_scratch = (bf16_products_on_sgemm() || mm > head ? mm : head) + bf16_weight_bytes((size_t)(V * D)) / 4.0;
    }
    double best = -1;
    MemoryEstimate cur;
    for (int w = 0; w < world; w++) {
        memset(cur.ram, 0, sizeof cur.ram);
        memset(cur.disk, 0, sizeof cur.disk);
        const int hr = hp_rank_of(w, hp, cp, pc->placement);
        /* attention strategy: saved state per layer, what selective keeps, buffers */
        double saved, kept, attn_buf, nq_call, group_q, saved_bf16 = 0, disk_layer = 0, disk_once = 0;
        int keeps_inputs, kv_heads_call, reads_bf16;
        if (sp > 1 || own) {
            const AttnMemory am = am_of[hr];
            saved = (double)am.saved_per_layer;
            kept = (double)am.kept_per_layer;
            saved_bf16 = (double)am.bf16_per_layer;
            attn_buf = (double)am.workspace;
            if (!own) attn_buf += S * (double)(sizeof(PosRun) / sizeof(float)); /* the schedule's run index */
            keeps_inputs = 1;
            reads_bf16 = 0; /* moot: the strategy keeps its own copies */
            nq_call = (double)am.rows_per_call;
            disk_layer = am.disk_per_layer;
            disk_once = am.disk_workspace;
            group_q = hs.hk[hr] > 0 ? (double)hs.hl[hr] / hs.hk[hr] : 1;
            kv_heads_call = hs.hk[hr];
        } else { /* local_attention.c: lse kept, positions and delta */
            saved = kept = N * c->num_attention_heads;
            attn_buf = N + N * c->num_attention_heads;
            keeps_inputs = 0;
            reads_bf16 = 1; /* its backward_bf16 */
            nq_call = N;
            group_q = (double)c->num_attention_heads / c->num_key_value_heads;
            kv_heads_call = c->num_key_value_heads;
        }
        /* bf16 (layer_memory.c): under none each layer keeps its own q, k, v (when the strategy
         * keeps no copies), o and the strategy's copies of q, k, v (saved_bf16) as bf16, the rest of
         * saved as fp32; under selective its o as bf16; one shared fp32 set of each is widened into
         * before the layer's backward (working set) */
        const int low = bf16 && ckpt != LLAMA_CKPT_LAYER && !stream;
        double qkv_layer = keeps_inputs ? 0 : N * (qd + 2 * kvd), o_layer = N * qd, saved_layer = saved,
               widened = 0;
        /* bf16 none, single process: the kernel reads the layers' bf16 q, k, v as they are
         * (backward_bf16), the fp32 set they are made in lies over dq, dk, dv, dout */
        const int qkv16_read = llama_reads_qkv16(ckpt, in->precision, stream, keeps_inputs, reads_bf16);
        if (low && ckpt == LLAMA_CKPT_NONE) {
            widened += (qkv16_read ? 0 : qkv_layer) + o_layer + (saved_bf16 > 0 ? saved : 0);
            qkv_layer /= 2;
            o_layer /= 2;
            saved_layer = saved - saved_bf16 / 2;
        } else if (low) { /* selective */
            widened += N * qd;
        }
        /* one full set of a layer's activations (layer_acts_alloc) and the partial one (selective);
         * bf16 none keeps no x_mid per layer but one shared (llama_rebuilds_x_mid) */
        const int x_mid_shared = !stream && llama_rebuilds_x_mid(ckpt, in->precision, 0);
        double common = N /* rstd1 */ + qkv_layer + (x_mid_shared ? 0 : N * D) /* x_mid */ + N /* rstd2 */ +
                        (store_gate_up ? 2 * N * ldF : 0);
        double full_set = common + o_layer + saved_layer;
        double partial_set = common + (kept < saved ? saved : 0);
        double per_layer_sel = (low ? N * qd / 2 : N * qd) + (kept < saved ? kept : saved);
        /* layer inputs: all L + 1 in RAM, or two working buffers with the rest on disk (the tier's
         * staging and read buffers, two each of one chunk, are working set) */
        double saved_acts = offload_inputs ? (stream ? 1 : 2) * N * D : (L + 1) * N * D;
        double layer_set = offload_inputs ? 4 * (double)in_rows * D : 0;
        if (stream) { /* a layer keeps only the strategy's state; one chunk's x_mid, o, rstd1, rstd2 */
            if (ckpt == LLAMA_CKPT_NONE && bf16 && saved_bf16 > 0) /* its q_h, kv_h in bf16; one fp32 set */
                saved_acts += L * (saved - saved_bf16 / 2), layer_set += saved;
            else if (ckpt == LLAMA_CKPT_NONE) saved_acts += L * saved;
            else layer_set += saved;
            layer_set += Cr * D + Cr * qd + 2 * Cr;
        } else if (ckpt == LLAMA_CKPT_NONE) saved_acts += L * full_set;
        else if (ckpt == LLAMA_CKPT_LAYER) layer_set += full_set;
        else saved_acts += L * per_layer_sel, layer_set += partial_set;
        if (x_mid_shared) layer_set += N * D;
        layer_set += N * d /* rope */ + (stream ? 1 : N) /* rstd_final */ + N * D /* dx */ +
                     2 * Xr * D /* xn, dxn */ + (N < 256 ? N : 256) * V;
        if (c->qk_norm) { /* per-head q/k norms: rstd, the projection made again, its gradient */
            const double heads = c->num_attention_heads > c->num_key_value_heads ? c->num_attention_heads
                                                                                  : c->num_key_value_heads;
            layer_set += Xr * heads * (1 + 2 * d);
        }
        /* the MLP's h (dgate, dup go into gate, up), gate_c, up_c; the attention half's dq, dk, dv,
         * dout and under none the widened set: on whole layers one buffer as large as the larger
         * of the two (layer_memory.c's phases_alloc) */
        const double mlp_phase = (double)rows * ldF * (store_gate_up ? 1 : 3);
        const double attn_phase = 2 * Cr * qd + 2 * Cr * kvd + (ckpt == LLAMA_CKPT_NONE ? widened : 0);
        if (stream) layer_set += mlp_phase + attn_phase;
        else layer_set += mlp_phase > attn_phase ? mlp_phase : attn_phase;
        if (ckpt != LLAMA_CKPT_NONE) layer_set += widened; /* selective: o, widened before the MLP's backward */
        if (bf16) layer_set += bf16_scratch;
        if (isnan(flash_of[hr]))
            flash_of[hr] = flash_transient(threads, nq_call, nq_call, kv_heads_call, (int)group_q, c->head_dim, bt, qkv16_read);
        layer_set += flash_of[hr];
        cur.ram[MEM_SAVED] = 4 * saved_acts;
        cur.ram[MEM_LAYER] = 4 * layer_set;
        cur.ram[MEM_ATTN] = 4 * attn_buf;
        if (offload_inputs) cur.disk[MEM_SAVED] += 4 * L * N * D;
        /* the strategy's own chunks on disk: per layer whose state is kept (one buffer under layer
         * checkpointing) and its buffer every layer reuses */
        cur.disk[MEM_SAVED] += (ckpt == LLAMA_CKPT_LAYER ? 1 : L) * disk_layer;
        cur.disk[MEM_ATTN] += disk_once;
        /* parameters, gradients, optimizer (data_parallel.c) */
        const int sharded = zero > 0 && world > 1, r = w % group;
        double shard = sharded ? (double)((size_t)P * (size_t)(r + 1) / (size_t)group - (size_t)P * (size_t)r / (size_t)group)
                               : P;
        /* --offload-master: ZeRO-3's parameter shard in the same file */
        const int master = pc->offload_optimizer && pc->offload_master && zero == 3 && sharded;
        if (pc->offload_optimizer) { /* the moments in their file; the tier's buffers in RAM (optimizer_offload.h) */
            cur.ram[MEM_OPTIMIZER] = optimizer_offload_ram_bytes((size_t)shard, master);
            cur.disk[MEM_OPTIMIZER] = optimizer_offload_disk_bytes((size_t)shard, 0);
            if (master)
                cur.disk[MEM_PARAMS] = optimizer_offload_disk_bytes((size_t)shard, 1) - cur.disk[MEM_OPTIMIZER];
        } else {
            cur.ram[MEM_OPTIMIZER] = 4 * 2 * shard;
        }
        /* the gradient allreduce's scratch (comm.h: one message of the rank's block, where comm_allreduce
         * sums the floats itself): over the world under zero 0, the shard over the groups under a group */
        const int G = sharded ? world / group : 1;
        const double ar_n = !sharded ? P : G > 1 ? shard : 0, ar_p = !sharded ? world : G;
        double ar_scratch = 0;
        if (ar_p > 1 && ar_n >= (double)COMM_ALLREDUCE_OWN_MIN) {
            const int ar_r = !sharded ? w : w / group;
            ar_scratch = floor(ar_n / ar_p) + (ar_r < fmod(ar_n, ar_p) ? 1 : 0);
            if (ar_scratch > (double)COMM_AR_PIECE) ar_scratch = (double)COMM_AR_PIECE;
        }
        if (!sharded) {
            cur.ram[MEM_PARAMS] = 4 * P;
            cur.ram[MEM_GRADS] = 4 * (P + ar_scratch);
        } else {
            double sb = shard + 1; /* shard_buf */
            sb += ar_scratch;
            if (zero == 1) {
                cur.ram[MEM_PARAMS] = 4 * P;
                cur.ram[MEM_GRADS] = 4 * (P + sb);
            } else {
                /* the embedding and tail units: back to back with a tied head, else taking turns
                 * in one buffer as large as the larger (data_parallel.h) */
                const double outer = c->tie_word_embeddings ? E + T : (E > T ? E : T);
                /* later micro-batches: per unit a temporary of its own part (data_parallel.h): two
                 * of a layer's largest, the tail's (taking turns with the embedding's), a tied
                 * head's embedding's; or the whole shard where that is no more */
                double acc = 0;
                if (per_replica > 1) {
                    const double b = (double)((size_t)P * (size_t)r / (size_t)group);
                    const double e = (double)((size_t)P * (size_t)(r + 1) / (size_t)group);
                    double lay = 0;
                    for (int l = 0; l < (int)L; l++) {
                        const double o = overlap(b, e, E + l * Lu, E + (l + 1) * Lu);
                        lay = o > lay ? o : lay;
                    }
                    const double oe = overlap(b, e, 0, E), ot = overlap(b, e, E + L * Lu, P);
                    acc = 2 * (lay + 1) + (c->tie_word_embeddings ? ot + 1 + oe + 1 : (oe > ot ? oe : ot) + 1);
                    if (acc >= shard + 1) acc = shard + 1; /* one whole-shard temporary instead */
                }
                cur.ram[MEM_GRADS] = 4 * (outer + 2 * Lu + sb + acc);
                /* zero 3: the shard, two gathered layers (in use, prefetched), embedding and tail */
                cur.ram[MEM_PARAMS] = zero == 3 ? 4 * ((master ? 0 : shard + 1) + 2 * Lu + outer) : 4 * P;
            }
        }
        /* the trainer's tokens: the global batch, this rank's share, positions, recall distances */
        cur.ram[MEM_DATA] = 4 * (2 * S * in->batch + 2 * N * per_replica + N + (in->recall_data ? S : 0)) +
                            4 * in->data_tokens;
        double tot = 0;
        for (int k = 0; k < MEM_COMPONENTS; k++) tot += cur.ram[k];
        if (tot > best) {
            best = tot;
            memcpy(out->ram, cur.ram, sizeof cur.ram);
            memcpy(out->disk, cur.disk, sizeof cur.disk);
            out->rank = w;
        }
    }
    if (am_of) head_split_free(&hs);
    xfree(am_of);
    xfree(flash_of);
    out->ram_total = out->disk_total = 0;
    for (int k = 0; k < MEM_COMPONENTS; k++) out->ram_total += out->ram[k], out->disk_total += out->disk[k];
    out->dp = dp;
    out->hp = hp;
    out->cp = cp;
    out->n_local = (int)N;
    out->threads = threads;
    out->ffn_chunks = (int)chunks;
    out->zero = zero;
    out->zero_group = group;
    out->layer_chunks = offload_inputs ? (int)in_chunks : 0;
    out->streams = stream;
    out->strategy = strategy_run_name(s, sp, dp);

    out->params = sp_params;
    return NULL;
}

static void print_row(FILE *out, const char *name, double ram, double disk, double total) {
    fprintf(out, "  %-36s %12.2f MiB %6.1f%%", name, ram / 1048576.0, total > 0 ? 100.0 * ram / total : 0.0);
    if (disk > 0) fprintf(out, "   disk %10.2f MiB", disk / 1048576.0);
    fprintf(out, "\n");
}
void memory_estimate_print(FILE *out, const MemoryModelInput *in, const MemoryEstimate *m) {
    const LlamaConfig *c = &in->model;
    char groups[48] = "";
    if (m->zero > 0 && m->zero_group < in->world) snprintf(groups, sizeof groups, " (groups of %d)", m->zero_group);
    fprintf(out, "memory model of one %s training step: %d layers, hidden %d, heads %d (kv %d), head_dim %d, ffn %d, vocab %d\n",
           precision_name(in->precision), c->num_hidden_layers, c->hidden_size, c->num_attention_heads,
           c->num_key_value_heads, c->head_dim, c->intermediate_size, c->vocab_size);
    fprintf(out, "S = %ld, batch %d, %d rank%s: %s, dp %d x hp %d x cp %d, %d local tokens, --precision %s, --checkpoint %s, "
           "%d FFN chunk%s, zero %d%s, %d thread%s/rank%s%s\n",
           in->seq_len, in->batch, in->world, in->world == 1 ? "" : "s", m->strategy, m->dp, m->hp, m->cp, m->n_local,
           precision_name(in->precision),
           llama_checkpoint_name(in->checkpoint), m->ffn_chunks, m->ffn_chunks == 1 ? "" : "s", m->zero, groups,
           m->threads, m->threads == 1 ? "" : "s", in->par.offload_dir ? ", offload to " : "",
           in->par.offload_dir ? in->par.offload_dir : "");
    fprintf(out, "rank %d (the largest), RAM by component:\n", m->rank);
    for (int k = 0; k < MEM_COMPONENTS; k++) print_row(out, memory_component_name((MemComponent)k), m->ram[k], m->disk[k], m->ram_total);
    fprintf(out, "  %-36s %12.2f MiB          disk %10.2f MiB\n", "total", m->ram_total / 1048576.0, m->disk_total / 1048576.0);
    fprintf(out, "  RAM per token: %.2f KiB per global token, %.2f KiB per local token\n", m->ram_total / 1024.0 / (double)in->seq_len,
           m->ram_total / 1024.0 / m->n_local);
    if (m->layer_chunks) fprintf(out, "  layer inputs offloaded in %d chunks each\n", m->layer_chunks);
    if (in->par.offload_optimizer)
        fprintf(out, "  AdamW moments on disk in %s, streamed through each step in chunks of at most %zu MiB\n",
                in->par.offload_optimizer, OPT_OFFLOAD_CHUNK * sizeof(float) >> 20);
    const int chunk_calls = strategy_attention_chunks(strategy_named(in->par.strategy), &m->params);
    if (m->streams)
        fprintf(out, "  layers streamed chunk by chunk: %d chunks of %d rows (--no-stream: whole layers)\n", chunk_calls,
               m->n_local / chunk_calls);
    else if (chunk_calls > 1 && in->checkpoint == LLAMA_CKPT_SELECTIVE)
        fprintf(out, "  whole layers: --checkpoint selective keeps each layer's output whole, so it does not stream\n");
    fprintf(out, "papers' terms (fp32, this rank):\n");
    const PaperMemoryInput pin = {.p = &m->params, .D = c->hidden_size, .L = c->num_hidden_layers};
    for (int i = 0; strategy_at(i); i++) {
        PaperMemory pm;
        strategy_paper_memory(strategy_at(i), &pin, &pm);
        for (int k = 0; k < pm.n; k++) fprintf(out, "%s\n", pm.line[k]);
    }
}
