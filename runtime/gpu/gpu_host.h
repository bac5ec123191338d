/* Private to the GPU module (runtime/gpu): the model on the device, shared
 * by the forward pass (forward.c) and the weight upload (upload.c). */
#ifndef MF_GPU_HOST_H
#define MF_GPU_HOST_H

#include "mf_runtime.h"
#include "gpu_api.h"

#define MAX_CALLS 8192

/* MF_GPU_PROFILE=1: wait after each step and add its time to its part
 * (printed when the model is closed); for finding where the time goes. */
enum { P_NORM, P_QKV, P_QKNORM, P_ROPE, P_SCORES, P_SOFTMAX, P_PV, P_O, P_ROUTER, P_ROUTE, P_DISPATCH, P_GATHER,
       P_EXPERTS, P_COMBINE, P_SHARED, P_DENSE, P_HEAD, P_OUTPUT, P_N };
/* A weight on the device: one copy, in the dtype the model keeps it in; or, block-scaled (FP8, MXFP4), its
 * codes and scales as the checkpoint stores them, widened by the products as they read them. */
typedef struct gw {
    void *w;           /* [rows][kp] of dt, rows = experts * n, zeros past k; NULL when block-scaled */
    int dt;            /* GK_BF16, GK_F16 or GK_F32: a block-scaled weight's values are rounded to it (q.round) */
    gk_wq q;           /* q.kind != GK_WQ_NONE: block-scaled, q.codes and q.scales its experts' device pointers */
    void *qtab;        /* the device table q.codes and q.scales point into ([2][experts] pointers) */
    bool shared;       /* w is another weight's (the tied head: the embedding's) */
    int n, k, kp, experts;
    float *bias;       /* [n] or NULL */
} gw;

typedef struct glayer {
    double *attn_norm, *ffn_norm, *q_norm, *k_norm;
    gw q, k, v, o;
    gw mlp_gate, mlp_up, mlp_down;
    gw router, exp_gate, exp_up, exp_down;
    gw sh_gate, sh_up, sh_down, sh_router;
    /* DeepSeek's latent attention: q_a (+ its norm) and q_b, or q; kv_a (+ its norm) and kv_b */
    gw q_a, q_b, kv_a, kv_b;
    double *q_a_norm, *kv_a_norm;
    double *e_bias;   /* the sigmoid routers' e_score_correction_bias, as stored */
    /* gpt-oss: attention sinks [n_heads]; the experts' biases, gate_up's [E][2I] (interleaved, as exp_gate's
     * rows: gpt-oss's exp_gate is the fused gate_up, 2I rows an expert, and exp_up is empty) and down's [E][H],
     * each added to its projection's rounded product, so not in the product's epilogue */
    double *sinks, *eb_gate_up, *eb_down;
} glayer;

typedef struct gpu {
    gk_ctx *ctx;
    char desc[256];
    mf_model *m;
    mf_precision prec;
    mf_numerics num;
    int engine16;          /* engine of products with bf16/f16 operands */
    bool fixed;
    glayer *layers;
    gw embed;              /* [V][H] (kp = H) */
    double *final_norm;
    gw head;
    size_t weight_bytes;
    /* the cuBLAS operand of one weight that is not one already: its fp32 copy (fp32 operands of a weight kept
     * narrower), or its widened values (a block-scaled weight, in the product's operand dtype) */
    void *wide;
    size_t wide_cap;       /* its capacity, in bytes */
    const void *wide_of;   /* whose copy it holds now (the gw) */
    int wide_fmt;
    /* the block-scaled checkpoint tensors (codes and scales) on the device, each once, in one allocation */
    void *qarena;
    size_t qarena_bytes;
    struct gq_tensor *qt;  /* sorted by host address */
    size_t n_qt;
    size_t q_wide_bytes;   /* the largest widened copy cuBLAS needs of a dense block-scaled weight */
    /* widths of a position's rows: queries, keys, values, attention output (GQA: heads x head_dim; MLA: heads x
     * (nope + rope) for queries and keys, heads x v_head_dim for values and output), and the rotating dims */
    int qw, kw, vw, cw, rdim;
    /* scratch, sized for cap_T tokens */
    int cap_T;
    double *mla_a, *mla_ckv, *mla_kv, *sel;   /* q_a's output, kv_a's, kv_b's; the grouped routers' selection rows */
    double *h, *x, *y, *q, *k, *v, *ctxv, *s, *g, *u, *ye, *sh, *probs;
    float *cf;
    void *opA, *opB;
    void *opH;             /* the down projection's operand when gate and up run as one product */
    bool glu_fused;        /* CUDA: they do (MF_GPU_GLU=0 runs them as three steps, for benchmarks) */
    double *cos_t, *sin_t;
    int32_t *tokens;
    double *topk_w, *router, *shared_gate, *router_in;   /* the MoE layer at work; its routing leaves in route_dev */
    int *offset, *token, *row_of;
    void *logits;          /* device [T][V] in the head's dtype (bf16, f16: 2 bytes; else fp32) */
    void *logits_host;     /* pinned, the same */
    /* the routing on its way out, layer by layer as each is done: router
     * logits, top-k weights and shared gates narrowed to fp32 (every one is
     * an fp32, bf16 or f16 value, so exactly), then the ids, which the router
     * writes there itself (route_layout) */
    float *route_dev;
    void *route_host;      /* pinned, the same */
    mf_dtype logits_dtype;
    /* sessions (generation): every layer's keys and values of the positions so far, on the device
     * ([n_layers][2][cache_T][n_kv_heads * head_dim] doubles), and the RoPE tables of all cache_T positions
     * where they do not depend on the length (all but dynamic NTK) */
    int cache_T, pos;
    double *kv, *rope_cos, *rope_sin;
    /* routing replay (NULL: the router's own choices): the leading positions of the sequence so far whose
     * tokens are the source's, and the source's experts and weights of the new positions, on the device */
    const mf_replay *replay;
    int replay_agree;
    uint16_t *rep_ids;     /* [n_moe][cap_T][K] */
    double *rep_w;         /* [n_moe][cap_T][K] */
    /* which product a call id is, for messages */
    int ncalls;
    char calls[MAX_CALLS][40];
    char msg[512];
    bool prof;
    double prof_t[P_N], prof_last;
    int prof_forwards;
} gpu;


static inline int round16(int k) { return (k + 15) / 16 * 16; }

static inline int gk_dt(mf_dtype t) {
    switch (t) {
    case MF_F32: return GK_F32;
    case MF_BF16: return GK_BF16;
    case MF_F16: return GK_F16;
    default: return GK_F64;
    }
}

/* The device layout of every weight (dtype, padding) and its bytes, before
 * anything is allocated. */
size_t GPU_FN(weights_plan)(gpu *G);
/* Allocates the weights and streams the checkpoint's files into them: each
 * file read once, in order, through pinned slots, hashed on the way when the
 * weights digest is still to be made; norms and biases uploaded beside. */
int GPU_FN(weights_upload)(gpu *G, mf_error *err);
void GPU_FN(weights_free)(gpu *G);
/* One weight of `experts` matrices in host memory (plain: F32, BF16 or F16; or block-scaled), for the
 * product check; weight_free frees it. */
int GPU_FN(weight_of_mats)(gpu *G, gw *w, const mf_mat *mats, int experts, mf_error *err);
void GPU_FN(weight_free)(gpu *G, gw *w);

#endif
