/* The CPU forward pass, read top to bottom like a transformers modeling
 * file (forward_body.h, over double activations for fp64 runs and float
 * ones otherwise). Each part (norm, attention, MLP,
 * router, head) computes in its own dtype D under the precision policy:
 * rd(D, x) rounds to it (a no-op in fp64 runs) and ro() to PyTorch's fp32
 * opmath (also a no-op in fp64), placed exactly where transformers rounds.
 * A part's output is cast back to the residual stream's dtype, as CroVA's
 * selective hooks do; the head's logits keep the head's dtype. */
#include "mf_runtime.h"
#include "mf_router.h"
#include "mf_experts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct fwd {
    const mf_model *m;
    const mf_config *c;
    const mf_run_opts *o;
    mf_dtype R;    /* residual stream dtype */
    mf_dtype O;    /* opmath dtype */
    mf_mm mm;      /* matrix products: compute type, threads, numerics */
    int T;         /* new positions this step */
    int pos;       /* the first of them */
    int replay_n;  /* the first this many of them dispatch the replayed experts (o->replay) */
} fwd;

/* A sequence's state on the CPU: the keys and values of every layer for the
 * positions so far (keep), or, for one pass over a whole sequence, one
 * layer's worth reused by every layer. */
struct mf_cpu_session {
    const mf_model *m;
    mf_run_opts o;
    int max_T, pos;
    bool keep, f64;
    void **kc, **vc;   /* [n_layers] (keep) or [1]: [max_T][kv_widths] activations */
    int replay_agree;  /* the leading positions whose tokens are the replay source's (o.replay) */
};

/* Of n new tokens at the session's position, how many replay: the source's tokens must agree up to and
 * including a position for it to replay, so the replayed positions are a prefix of the sequence. */
static int replay_positions(mf_cpu_session *s, const int32_t *tokens, int n) {
    const mf_replay *rp = s->o.replay;
    if (!rp) return 0;
    for (int t = 0; t < n; t++) {
        const int p = s->pos + t;
        if (s->replay_agree == p && p < rp->len && tokens[t] == rp->tokens[p]) s->replay_agree++;
    }
    const int n_rep = s->replay_agree - s->pos;
    return n_rep < 0 ? 0 : n_rep > n ? n : n_rep;
}

static inline double rd(mf_dtype D, double x) { return mf_round_to(D, x); }
static inline double ro(const fwd *f, double x) { return mf_round_to(f->O, x); }

/* Products inside a part computing in D: operands hold D values, results are rounded to D. */
static mf_mm mm_in(const fwd *f, mf_dtype D) {
    mf_mm m = f->mm;
    m.in = m.out = D;
    return m;
}


#define FN(name) name##_f64
#define ACT double
#define ACT_DTYPE MF_F64
#define ACT_IS_DOUBLE 1
#define LINEAR mf_linear_apply
#define MATMUL mf_matmul
#define FFN mf_ffn_apply
#define COMBINE mf_combine
#define RDA(D, x) rd(D, x)
#define ROA(x) ro(f, x)
#include "forward_body.h"
#undef FN
#undef ACT
#undef ACT_DTYPE
#undef ACT_IS_DOUBLE
#undef LINEAR
#undef MATMUL
#undef FFN
#undef COMBINE
#undef RDA
#undef ROA

#define FN(name) name##_f32
#define ACT float
#define ACT_DTYPE MF_F32
#define ACT_IS_DOUBLE 0
#define LINEAR mf_linear_apply_f32
#define MATMUL mf_matmul_f32
#define FFN mf_ffn_apply_f32
#define COMBINE mf_combine_f32
#define RDA(D, x) mf_roundf_to(D, x)
#define ROA(x) (x)
#include "forward_body.h"

static uint64_t umax(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* The values a position's key and value take in the cache: grouped heads' n_kv_heads x head_dim each, latent
 * attention's heads x (nope + rope) keys and heads x v values. */
static void kv_widths(const mf_config *c, size_t *k, size_t *v) {
    if (c->attn == MF_ATTN_MLA) {
        *k = (size_t)c->n_heads * (c->qk_nope_dim + c->qk_rope_dim);
        *v = (size_t)c->n_heads * c->v_head_dim;
    } else {
        *k = *v = (size_t)c->n_kv_heads * c->head_dim;
    }
}

uint64_t mf_forward_cpu_bytes(const mf_config *c, int T_, int threads, bool router_in) {
    const uint64_t T = (uint64_t)(T_ > 0 ? T_ : 1), H = c->hidden, V = c->vocab, hd = c->head_dim;
    size_t kw, vw;
    kv_widths(c, &kw, &vw);
    /* latent attention also holds q's low-rank rows and kv_b's output, within 2 x the key width */
    const uint64_t nq = c->attn == MF_ATTN_MLA ? umax(kw, (uint64_t)c->q_lora_rank) : (uint64_t)c->n_heads * hd;
    const uint64_t nk = c->attn == MF_ATTN_MLA ? kw + vw : umax(kw, vw), th = threads > 0 ? threads : 1;
    const uint64_t E = c->n_experts > 0 ? c->n_experts : 1, K = c->top_k > 0 ? c->top_k : 1, nm = c->n_moe_layers;
    const uint64_t I = umax(umax(c->intermediate, c->moe_intermediate), c->shared_intermediate);
    const uint64_t sel = c->route_rule == MF_ROUTE_SIGMOID_GROUP || c->route_rule == MF_ROUTE_SOFTMAX_GREEDY ||
                         c->route_rule == MF_ROUTE_TOPK_SOFTMAX ? E * 8 : 0;
    const uint64_t result = T * V * 8 + nm * T * (E * 8 + sel + K * 10 + 8) + (router_in ? nm * T * H * 8 : 0);
    const uint64_t stream = 3 * T * H * 8 + 2 * T * hd * 8;
    const uint64_t attn = T * (2 * nq + 2 * nk) * 8 + th * T * T * 8 + T * umax(nq, H) * 8;
    const uint64_t ffn = th * (T * I * 16 + T * umax(I, H) * 8) + T * K * H * 8 + th * T * H * 8;
    const uint64_t head = T * H * 4 + T * V * 4;
    /* the run writer keeps a shard of up to 64 MB and a copy of the sequence's record */
    return result + stream + umax(umax(attn, ffn), head) + result + (64u << 20);
}

static mf_cpu_session *session_new(const mf_model *m, const mf_run_opts *o, int max_T, bool keep) {
    mf_cpu_session *s = mf_xcalloc(1, sizeof *s);
    s->m = m;
    s->o = *o;
    s->max_T = max_T;
    s->keep = keep;
    /* fp32 activations need every product in fp32 compute (the fp64 policy alone computes in double) */
    s->f64 = o->prec.compute == MF_F64 || o->prec.opmath == MF_F64;
    const int layers = keep ? m->cfg.n_layers : 1;
    size_t kw, vw;
    kv_widths(&m->cfg, &kw, &vw);
    const size_t rows = (size_t)(max_T > 0 ? max_T : 1), elem = s->f64 ? 8 : 4;
    s->kc = mf_xcalloc((size_t)layers, sizeof *s->kc);
    s->vc = mf_xcalloc((size_t)layers, sizeof *s->vc);
    for (int l = 0; l < layers; l++) {
        s->kc[l] = mf_xmalloc(rows * kw * elem);
        s->vc[l] = mf_xmalloc(rows * vw * elem);
    }
    return s;
}

int mf_cpu_session_open(mf_cpu_session **out, const mf_model *m, const mf_run_opts *o, int max_T, mf_error *err) {
    *out = NULL;
    if (max_T <= 0) return mf_fail(err, MF_EINVAL, "a session needs room for at least one position");
    *out = session_new(m, o, max_T, true);
    return MF_OK;
}

void mf_cpu_session_close(mf_cpu_session *s) {
    if (!s) return;
    const int layers = s->keep ? s->m->cfg.n_layers : 1;
    for (int l = 0; l < layers; l++) {
        free(s->kc[l]);
        free(s->vc[l]);
    }
    free(s->kc);
    free(s->vc);
    free(s);
}

int mf_cpu_session_length(const mf_cpu_session *s) { return s->pos; }

int mf_cpu_session_rewind(mf_cpu_session *s, int pos, mf_error *err) {
    if (pos < 1 || pos > s->pos)
        return mf_fail(err, MF_EINVAL, "a session at position %d cannot rewind to %d", s->pos, pos);
    s->pos = pos;   /* the cache's rows from pos on are written again by the next steps */
    /* the replay's agreement ends where the forgotten positions began: the next ones are checked afresh */
    if (s->replay_agree > pos) s->replay_agree = pos;
    return MF_OK;
}

int mf_cpu_session_forward(mf_cpu_session *s, const int32_t *tokens, int n, mf_seq_result *r, mf_error *err) {
    memset(r, 0, sizeof *r);
    if (n <= 0) return mf_fail(err, MF_EINVAL, "empty sequence");
    if (s->pos > 0 && n != 1)
        return mf_fail(err, MF_EUNSUPPORTED, "after the prompt, the tokens of a sequence come one at a time");
    if (s->pos + n > s->max_T)
        return mf_fail(err, MF_EINVAL, "position %d is past the %d the session was opened for", s->pos + n - 1,
                       s->max_T);
    return s->f64 ? step_f64(s, tokens, n, r, err) : step_f32(s, tokens, n, r, err);
}

int mf_forward_cpu(const mf_model *m, const mf_run_opts *o, const int32_t *tokens, int T, mf_seq_result *r,
                   mf_error *err) {
    memset(r, 0, sizeof *r);
    if (T <= 0) return mf_fail(err, MF_EINVAL, "empty sequence");
    /* one pass over the whole sequence: one layer's keys and values, reused by every layer */
    mf_cpu_session *s = session_new(m, o, T, false);
    const int rc = s->f64 ? step_f64(s, tokens, T, r, err) : step_f32(s, tokens, T, r, err);
    mf_cpu_session_close(s);
    return rc;
}
