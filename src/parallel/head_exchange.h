/* The head exchange of head-parallel attention (the heads-only strategy's all-to-all, LoongTrain's SeqAlltoAll):
 * inside a head group of hp ranks, local tokens with all heads become the group's tokens with a
 * share of the heads, and back.
 *
 *   q (N, H, d), k, v (N, Hkv, d) on each member   ->   q_h (hp N, Hl, d), kv_h = k_h | v_h
 *   (2, hp N, Hk, d) on member p, rows of member m at [m N, (m+1) N) (member order, so a context
 *   slot holds its token set in order: layout.h).
 *
 * Heads need not divide: member p takes floor or ceil of H / hp consecutive query heads (the
 * first H mod hp members one more), at least one each (hp <= H). Its KV heads are those its query
 * heads read (head h reads KV head h / (H / Hkv)); when its query heads map onto them evenly
 * (every KV head serves the same number of consecutive local query heads, as the kernel's GQA
 * indexing requires) it receives each once, otherwise one KV copy per query head. KV heads shared
 * by several members are sent to each of them (LoongTrain's KV replication when Hkv < hp); their
 * gradients are SUMMED back into the owner's dk, dv.
 *
 * Bytes member p sends per layer (fp32, 4 bytes; 2 with bf16 on the wire): forward qkv: sum over other members m of
 * 4 N (Hl_m + 2 Hk_m) d, output: (hp-1) 4 N Hl_p d; backward dout: sum over m != p of 4 N Hl_m d
 * (and 4 N Hl_m more, on either wire, where dout carries delta: head_exchange_dout_delta),
 * gradients: (hp-1) 4 N (Hl_p + 2 Hk_p) d. With hp | H these are LoongTrain's
 * (hp-1)/hp (2 Size(q) + Size(kv)) each way. One all-to-all message to each other member per
 * exchange: 2 (hp-1) messages forward and backward. hp = 1 is a copy with no communication. */
#ifndef SEQPAR_HEAD_EXCHANGE_H
#define SEQPAR_HEAD_EXCHANGE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "parallel/comm.h"

/* How the heads are split over the hp members (no communication; for checks and formulas). */
typedef struct {
    int hp, H, Hkv;
    int *h0, *hl;    /* (hp) first query head and query head count of each member */
    int *hk;         /* (hp) KV heads each member receives */
    int *kv_off;     /* (hp + 1) offsets into kv_src */
    int *kv_src;     /* global KV head of member p's local KV head j: kv_src[kv_off[p] + j] */
} HeadSplit;

/* NULL on success; otherwise an xmalloc'd one-line message (hp > H, Hkv not dividing H). */
char *head_split_init(HeadSplit *s, int hp, int H, int Hkv);
void head_split_free(HeadSplit *s);

typedef struct {
    HeadSplit split;
    Comm *comm;
    MPI_Comm head_comm;
    int me;          /* rank in the head group */
    int N, d;        /* local tokens, head_dim */
    int Hl, Hk;      /* this member's query and KV heads */
    float *send, *recv;
    int wire_bf16;                              /* the all-to-alls carry bf16 (head_exchange_set_wire_bf16) */
    size_t *scounts, *sdispls, *rcounts, *rdispls; /* (hp) in elements of the exchange's type */
    size_t *ssize, *rsize;                      /* (hp) block sizes of the exchange in progress */
    size_t most;                                /* elements of send (and recv) */
    size_t most_any;                            /* the largest most of any member */
} HeadExchange;

/* Collective-free set-up (the split must be valid: check it with head_split_init first). */
void head_exchange_init(HeadExchange *x, Comm *comm, MPI_Comm head_comm, int hp, int me, int N, int H, int Hkv, int d);
void head_exchange_free(HeadExchange *x);
/* bf16 on the wire (--precision bf16): every exchange packs its send buffer to bf16 (round to
 * nearest even), sends half the bytes and widens what it receives. q, k, v, dout and o are
 * bf16 values already under --precision bf16 (o is rounded where the model uses it), so only
 * dq, dk, dv are rounded by the wire. The bf16 words need no buffers of their own: they are
 * packed into the receive buffer (idle until the all-to-all lands) and received into the send
 * buffer (idle once packed), whose fp32 contents an exchange therefore does not keep. */
void head_exchange_set_wire_bf16(HeadExchange *x);

/* With hp = 1 every call below is one copy (the local layout is the head-parallel one) and
 * communicates nothing; a caller may also pass the same array on both sides (no copy).
 * Forward: local q, k, v -> q_h (hp N, Hl, d) and kv_h (2, hp N, Hk, d). Collective. */
void head_exchange_qkv(HeadExchange *x, const float *q, const float *k, const float *v, float *q_h, float *kv_h);
/* Forward: o_h (hp N, Hl, d) -> local o (N, H, d). Collective. */
void head_exchange_out(HeadExchange *x, const float *o_h, float *o);
/* Where head_exchange_out sends from: a caller may write o_h there directly (hp N Hl d floats)
 * after head_exchange_qkv and pass it as o_h, saving a buffer and a copy; no other call of this
 * exchange may come in between. */
float *head_exchange_out_buffer(HeadExchange *x);
/* Backward: local dout (N, H, d) -> dout_h (hp N, Hl, d). Collective. */
void head_exchange_dout(HeadExchange *x, const float *dout, float *dout_h);
/* Backward: local dout (N, H, d) and delta = rowsum(dout * o) (N, H) -> dout_h (hp N, Hl, d) and
 * delta_h (hp N, Hl), in the one all-to-all of head_exchange_dout: each block carries its delta
 * rows after its dout rows, and delta travels exactly (fp32, 4 bytes per row and head; on the
 * bf16 wire as the two 16-bit halves of each float, dout rounded as always). Collective. delta
 * (and delta_h) NULL: dout alone, as head_exchange_dout. */
void head_exchange_dout_delta(HeadExchange *x, const float *dout, const float *delta, float *dout_h, float *delta_h);
/* Backward: dq_h, dkv_h -> local dq (N, H, d), dk, dv (N, Hkv, d) (overwritten; replicas summed). */
void head_exchange_grads(HeadExchange *x, const float *dq_h, const float *dkv_h, float *dq, float *dk, float *dv);

/* Bytes and messages member `me` sends in the forward (qkv + out) and the backward (dout +
 * grads), elem_bytes an element (4: fp32, 2: bf16 on the wire). */
void head_exchange_volume(const HeadSplit *s, int me, long N, int d, int elem_bytes, unsigned long long *fwd_bytes,
                          unsigned long long *bwd_bytes, unsigned long long *msgs_each_way);
/* Bytes member `me` sends beyond head_exchange_volume's when its backward's dout carries delta
 * (head_exchange_dout_delta): 4 N Hl_m to each other member m, on either wire. */
unsigned long long head_exchange_delta_bytes(const HeadSplit *s, int me, long N);

#endif
