/* moeflip experts: token -> expert dispatch, the expert FFN (SwiGLU), and
 * the combine of the k weighted expert outputs of each token.
 *
 * Dispatch groups (token, slot) pairs by expert, experts in ascending id and
 * tokens ascending within one, so each expert runs one matrix product over
 * all its tokens. The combine follows transformers v5's grouped_mm path
 * (the default since v5): each slot's product y * w, summed over slots in
 * slot order with fp32 accumulation, rounded once to the activation dtype. */
#ifndef MF_EXPERTS_H
#define MF_EXPERTS_H

#include "mf_core.h"
#include "mf_numerics.h"

typedef struct mf_dispatch {
    int n_experts, n_tokens, top_k;
    int *offset;   /* [E + 1]: expert e owns rows offset[e] .. offset[e+1]-1 */
    int *token;    /* [T * k]: token of each row */
    int *slot;     /* [T * k]: slot (rank) of each row */
    int *row_of;   /* [T * k]: row of (t, slot) = row_of[t * k + slot] */
} mf_dispatch;

void mf_dispatch_build(mf_dispatch *d, const uint16_t *ids, int T, int k, int E);
void mf_dispatch_free(mf_dispatch *d);

typedef struct mf_ffn {
    const mf_linear *gate, *up, *down;
    mf_act act;
    /* gpt-oss's clamped SwiGLU (GptOssExperts) in place of act: g = min(gate x, limit), u = clamp(up x, -limit,
     * limit), h = (u + 1) * (g * sigmoid(g * alpha)); each projection's product is rounded to the act dtype and
     * its bias then added and rounded again (grouped_mm, then add_(bias)) */
    bool clamped;
    double alpha, limit;
} mf_ffn;

/* y[M, H] = down(round(round(act(gate x)) * round(up x))), every product
 * and elementwise result rounded to `act_dtype` (HF's cast points); the clamped form rounds each of its steps
 * (the clamps, g * alpha in fp32 opmath, the sigmoid, g * sigmoid, u + 1, the product) to act_dtype. */
void mf_ffn_apply(const mf_mm *mm, const mf_ffn *f, mf_dtype act_dtype, const double *x, int M, double *y);

typedef struct mf_combine_spec {
    mf_dtype product;   /* dtype of y * w: the activation dtype when w was rounded to it, else F32 (or F64) */
    mf_dtype sum;       /* accumulation dtype of the slot sum (F32, or F64 for the reference) */
    mf_dtype out;       /* the result's dtype */
} mf_combine_spec;

/* out[t, :] = round_out(sum over slots s of round_product(y[row_of(t,s)] * w[t, s])) */
void mf_combine(const mf_combine_spec *spec, const mf_dispatch *d, const double *y, int H, const double *w,
                double *out);

/* The same over fp32 activations (policies whose opmath is fp32). */
void mf_ffn_apply_f32(const mf_mm *mm, const mf_ffn *f, mf_dtype act_dtype, const float *x, int M, float *y);
void mf_combine_f32(const mf_combine_spec *spec, const mf_dispatch *d, const float *y, int H, const double *w,
                    float *out);

#endif
