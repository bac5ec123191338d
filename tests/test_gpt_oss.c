/* gpt-oss's checkpoint formats on hand-made checkpoints: the fused interleaved experts (gate_up_proj [E, H, 2I],
 * gate = even columns; down_proj [E, I, H]) as the products read them, MXFP4 blocks decoded per the OCP
 * microscaling spec (e2m1 elements: sign bit 3, exponent bits 2-1 with bias 1, mantissa bit 0; E8M0 scales
 * 2^(s - 127); two elements a byte, the low nibble first, as transformers' convert_moe_packed_tensors reads them),
 * hostile inputs refused with the tensor named, and the clamped SwiGLU on hand-computed values. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mf_experts.h"
#include "mf_models.h"
#include "testutil.h"

enum { H = 32, NH = 2, HD = 16, NKV = 1, V = 8, E = 2, K = 1, I = 32, G_GU = H / 32, G_DN = I / 32 };

/* bf16-exact distinct values */
static double val(int a, int b, int c) { return (double)((a * 7 + b * 3 + c * 5) % 251 - 125) / 64.0; }

/* The OCP e2m1 value of a 4-bit code, from its fields. */
static double e2m1_spec(int code) {
    const int s = code >> 3, e = (code >> 1) & 3, m = code & 1;
    const double mag = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, e - 1);
    return s ? -mag : mag;
}

static uint8_t blk_byte(int e, int r, int g, int j) { return (uint8_t)((e * 31 + r * 7 + g * 5 + j * 3 + 1) % 256); }
static uint8_t scale_byte(int e, int r, int g) { return (uint8_t)(120 + (e + r + g) % 10); }

/* The expected decoded value of input c of output row r of expert e. */
static double mx_expect(int e, int r, int c) {
    const uint8_t b = blk_byte(e, r, c / 32, (c % 32) / 2);
    const int code = c % 2 ? b >> 4 : b & 15;
    return ldexp(e2m1_spec(code), scale_byte(e, r, c / 32) - 127);
}

typedef enum { PLAIN, MXFP4, MX_NO_SCALES, MX_BAD_SHAPE, MX_SCALE_255, MX_OVERFLOW, MX_WITHOUT_CONFIG } variant;

static void add_bf16(mf_st_writer *w, const char *name, int ndim, const int64_t *shape, double (*f)(size_t)) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    uint16_t *b = malloc(n * 2);
    for (size_t i = 0; i < n; i++) b[i] = mf_f64_to_bf16(f(i));
    mf_st_writer_add(w, name, MF_BF16, ndim, shape, b);
    free(b);
}

static double small(size_t i) { return (double)((int)(i * 37 % 17) - 8) / 128.0; }
static double one(size_t i) { return 1.0 + (double)(i % 3) / 8.0; }
static double gu_val(size_t i) { return val((int)(i / (H * 2 * I)), (int)(i / (2 * I) % H), (int)(i % (2 * I))); }
static double dn_val(size_t i) { return val((int)(i / (I * H)) + 3, (int)(i / H % I), (int)(i % H)); }
static double bias_val(size_t i) { return (double)((int)(i % 13) - 6) / 32.0; }

static const char *write_ckpt(variant v) {
    const char *dir = temp_dir();
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"gpt_oss\", \"hidden_size\": %d, \"num_attention_heads\": %d, \"head_dim\": %d,"
             " \"num_key_value_heads\": %d, \"vocab_size\": %d, \"num_hidden_layers\": 1, \"num_local_experts\": %d,"
             " \"num_experts_per_tok\": %d, \"intermediate_size\": %d, \"sliding_window\": 4,"
             " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}%s}",
             H, NH, HD, NKV, V, E, K, I,
             v == PLAIN || v == MX_WITHOUT_CONFIG ? "" : ", \"quantization_config\": {\"quant_method\": \"mxfp4\"}");
    write_text(dir, "config.json", cfg);
    mf_st_writer *w = mf_st_writer_new();
    const int64_t vh[2] = {V, H}, hv[1] = {H}, q[2] = {NH * HD, H}, kv[2] = {NKV * HD, H}, o[2] = {H, NH * HD};
    const int64_t qb[1] = {NH * HD}, kb[1] = {NKV * HD}, sk[1] = {NH}, rw[2] = {E, H}, rb[1] = {E};
    add_bf16(w, "model.embed_tokens.weight", 2, vh, small);
    add_bf16(w, "lm_head.weight", 2, vh, small);
    add_bf16(w, "model.norm.weight", 1, hv, one);
    add_bf16(w, "model.layers.0.input_layernorm.weight", 1, hv, one);
    add_bf16(w, "model.layers.0.post_attention_layernorm.weight", 1, hv, one);
    add_bf16(w, "model.layers.0.self_attn.q_proj.weight", 2, q, small);
    add_bf16(w, "model.layers.0.self_attn.k_proj.weight", 2, kv, small);
    add_bf16(w, "model.layers.0.self_attn.v_proj.weight", 2, kv, small);
    add_bf16(w, "model.layers.0.self_attn.o_proj.weight", 2, o, small);
    add_bf16(w, "model.layers.0.self_attn.q_proj.bias", 1, qb, bias_val);
    add_bf16(w, "model.layers.0.self_attn.k_proj.bias", 1, kb, bias_val);
    add_bf16(w, "model.layers.0.self_attn.v_proj.bias", 1, kb, bias_val);
    add_bf16(w, "model.layers.0.self_attn.o_proj.bias", 1, hv, bias_val);
    add_bf16(w, "model.layers.0.self_attn.sinks", 1, sk, bias_val);
    add_bf16(w, "model.layers.0.mlp.router.weight", 2, rw, small);
    add_bf16(w, "model.layers.0.mlp.router.bias", 1, rb, bias_val);
    const int64_t gub[2] = {E, 2 * I}, dnb[2] = {E, H};
    add_bf16(w, "model.layers.0.mlp.experts.gate_up_proj_bias", 2, gub, bias_val);
    add_bf16(w, "model.layers.0.mlp.experts.down_proj_bias", 2, dnb, bias_val);
    if (v == PLAIN) {
        const int64_t gu[3] = {E, H, 2 * I}, dn[3] = {E, I, H};
        add_bf16(w, "model.layers.0.mlp.experts.gate_up_proj", 3, gu, gu_val);
        add_bf16(w, "model.layers.0.mlp.experts.down_proj", 3, dn, dn_val);
    } else {
        /* gate_up: [E, 2I, H/32, 16] and [E, 2I, H/32]; down: [E, H, I/32, 16] and [E, H, I/32] */
        const int rows[2] = {2 * I, H}, groups[2] = {G_GU, G_DN};
        const char *names[2] = {"gate_up_proj", "down_proj"};
        for (int t = 0; t < 2; t++) {
            const int R = rows[t], G = groups[t];
            uint8_t *bl = malloc((size_t)E * R * G * 16), *sc = malloc((size_t)E * R * G);
            for (int e = 0; e < E; e++)
                for (int r = 0; r < R; r++)
                    for (int g = 0; g < G; g++) {
                        sc[((size_t)e * R + r) * G + g] = scale_byte(e + t, r, g);
                        for (int j = 0; j < 16; j++) bl[(((size_t)e * R + r) * G + g) * 16 + j] = blk_byte(e + t, r, g, j);
                    }
            if (t == 0 && v == MX_SCALE_255) sc[5] = 255;
            if (t == 1 && v == MX_OVERFLOW) {
                sc[3] = 253;             /* 2^126: 2.0 stays finite, 4.0 reaches 2^128 */
                bl[3 * 16 + 7] = 0x46;   /* codes 6 (4.0) in the high nibble */
            }
            char nm[128];
            const int64_t bs[4] = {E, R, G, v == MX_BAD_SHAPE && t == 1 ? 8 : 16}, ss[3] = {E, R, G};
            snprintf(nm, sizeof nm, "model.layers.0.mlp.experts.%s_blocks", names[t]);
            mf_st_writer_add(w, nm, MF_U8, 4, bs, bl);
            snprintf(nm, sizeof nm, "model.layers.0.mlp.experts.%s_scales", names[t]);
            if (!(v == MX_NO_SCALES && t == 0)) mf_st_writer_add(w, nm, MF_U8, 3, ss, sc);
            free(bl);
            free(sc);
        }
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    mf_error err = {0};
    cr_assert_eq(mf_st_writer_write(w, path, &err), MF_OK, "%s", err.msg);
    mf_st_writer_free(w);
    return dir;
}

/* Either as the CPU's relaid copy, or (MF_LOAD_NO_CONVERT, a GPU's load) as strided views of the file's tensors,
 * nothing copied: the same value at every (expert, output, input). */
static void check_fused_experts(unsigned flags) {
    const char *dir = write_ckpt(PLAIN);
    mf_model *m;
    mf_error err = {0};
    cr_assert_eq(mf_model_load(&m, dir, MF_BF16, flags, &err), MF_OK, "%s", err.msg);
    const mf_layer *L = &m->layers[0];
    if (flags & MF_LOAD_NO_CONVERT) {
        cr_assert_eq(m->n_owned, 0, "views only: %zu converted copies", m->n_owned);
        cr_assert_eq(L->exp_up[1].w.cs, (size_t)2 * I, "a column of gate_up is a row of the file");
    }
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < I; i++)
            for (int h = 0; h < H; h++) {
                cr_assert_eq(mf_mat_get(&L->exp_gate[e].w, i, h), val(e, h, 2 * i), "gate e%d i%d h%d", e, i, h);
                cr_assert_eq(mf_mat_get(&L->exp_up[e].w, i, h), val(e, h, 2 * i + 1), "up e%d i%d h%d", e, i, h);
                cr_assert_eq(mf_mat_get(&L->exp_down[e].w, h, i), val(e + 3, i, h), "down e%d h%d i%d", e, h, i);
            }
        for (int i = 0; i < I; i++) {
            cr_assert_eq(L->exp_gate[e].bias[i], bias_val((size_t)e * 2 * I + 2 * i));
            cr_assert_eq(L->exp_up[e].bias[i], bias_val((size_t)e * 2 * I + 2 * i + 1));
        }
        cr_assert_eq(L->exp_down[e].bias[H - 1], bias_val((size_t)e * H + H - 1));
    }
    cr_assert(L->sinks && L->sinks[1] == bias_val(1));
    cr_assert(L->router.bias && L->router.bias[1] == bias_val(1));
    cr_assert(L->o.bias, "attention_bias puts a bias on o_proj too");
    mf_model_free(m);
}

Test(gpt_oss, fused_experts_deinterleaved_and_transposed) { check_fused_experts(0); }
Test(gpt_oss, fused_experts_as_views_for_a_gpu) { check_fused_experts(MF_LOAD_NO_CONVERT); }

Test(gpt_oss, mxfp4_blocks_decoded_per_the_spec) {
    const char *dir = write_ckpt(MXFP4);
    mf_model *m;
    mf_error err = {0};
    cr_assert_eq(mf_model_load(&m, dir, MF_F64, 0, &err), MF_OK, "%s", err.msg);
    const mf_layer *L = &m->layers[0];
    int checked = 0, nonzero = 0;
    for (int e = 0; e < E; e++)
        for (int i = 0; i < I; i++)
            for (int h = 0; h < H; h++) {
                /* gate_up's output row 2i is gate i, 2i + 1 up i; down's output row h */
                cr_assert_eq(mf_mat_get(&L->exp_gate[e].w, i, h), mx_expect(e, 2 * i, h), "gate e%d i%d h%d", e, i, h);
                cr_assert_eq(mf_mat_get(&L->exp_up[e].w, i, h), mx_expect(e, 2 * i + 1, h), "up e%d i%d h%d", e, i, h);
                cr_assert_eq(mf_mat_get(&L->exp_down[e].w, h, i), mx_expect(e + 1, h, i), "down e%d h%d i%d", e, h, i);
                checked += 3;
                nonzero += mx_expect(e, 2 * i, h) != 0;
            }
    cr_assert(checked == 3 * E * I * H && nonzero > E * I * H / 2);
    mf_model_free(m);
    /* a narrower policy rounds the decoded values as it rounds any bf16 weight */
    cr_assert_eq(mf_model_load(&m, dir, MF_BF16, 0, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(mf_mat_get(&m->layers[0].exp_down[1].w, 3, 5), mx_expect(2, 3, 5));
    mf_model_free(m);
}

static void load_fails(variant v, const char *want1, const char *want2) {
    const char *dir = write_ckpt(v);
    mf_model *m = NULL;
    mf_error err = {0};
    cr_assert_neq(mf_model_load(&m, dir, MF_BF16, 0, &err), MF_OK, "variant %d loaded", v);
    cr_assert_null(m);
    cr_assert(strstr(err.msg, want1) && strstr(err.msg, want2), "variant %d: %s", v, err.msg);
    cr_assert(!strchr(err.msg, '\n'), "one line: %s", err.msg);
}

Test(gpt_oss, mxfp4_hostile_inputs_name_the_tensor) {
    load_fails(MX_NO_SCALES, "missing tensor model.layers.0.mlp.experts.gate_up_proj_scales", "blocks");
    load_fails(MX_BAD_SHAPE, "model.layers.0.mlp.experts.down_proj_blocks", "[2, 32, 1, 16]");
    load_fails(MX_SCALE_255, "model.layers.0.mlp.experts.gate_up_proj_scales", "scale 255");
    load_fails(MX_OVERFLOW, "model.layers.0.mlp.experts.down_proj_scales", "overflow");
    load_fails(MX_WITHOUT_CONFIG, "gate_up_proj_blocks", "quantization_config");
}

/* GptOssExperts' activation at limit 0.6, alpha 1.702, in fp64: g = min(gate, 0.6), u = clamp(up, -0.6, 0.6),
 * (u + 1) * g * sigmoid(1.702 g); identity projections with biases 0 so the numbers are the activation's. */
Test(gpt_oss, clamped_swiglu_by_hand) {
    const double one1[1] = {1.0};
    mf_linear g = {1, 1, mf_mat_rows(one1, MF_F64, 1, 1), NULL}, u = g, d = g;
    double ub[1] = {0.25};
    u.bias = ub;   /* up = x + 0.25 */
    mf_ffn f = {&g, &u, &d, MF_ACT_SILU, true, 1.702, 0.6};
    const mf_mm mm = {MF_F64, MF_F64, 1, NULL, MF_F64};
    const double x[4] = {2.0, -3.0, 0.3, -0.5};
    double y[4];
    mf_ffn_apply(&mm, &f, MF_F64, x, 4, y);
    const double sig = 1.0 / (1.0 + exp(-0.6 * 1.702));
    cr_assert_float_eq(y[0], 1.6 * 0.6 * sig, 1e-15, "both clamps at 0.6: %.17g", y[0]);
    cr_assert_float_eq(y[1], 0.4 * (-3.0 / (1.0 + exp(3.0 * 1.702))), 1e-15, "gate unclamped below, up at -0.6");
    cr_assert_float_eq(y[2], 1.55 * (0.3 / (1.0 + exp(-0.3 * 1.702))), 1e-15);
    cr_assert_float_eq(y[3], 0.75 * (-0.5 / (1.0 + exp(0.5 * 1.702))), 1e-15);
}

/* The importers refuse gpt_oss by name (its routing is the CPU's alone for now). */
Test(gpt_oss, import_refuses_it_by_name) {
    const char *dir = write_ckpt(PLAIN);
    char err[4096], npy[4200], tok[4200];
    snprintf(npy, sizeof npy, "%s/vllm/s0.npy", fixture("engines/olmoe"));
    snprintf(tok, sizeof tok, "%s/tokens.jsonl", fixture("engines/olmoe"));
    cr_assert_eq(run_moeflip(err, sizeof err, "import vllm '%s' --model '%s' --tokens '%s' -o '%s/imp'", npy, dir, tok,
                             temp_dir()), 1, "%s", err);
    cr_assert(strstr(err, "gpt_oss"), "%s", err);
}

/* What a load will hold, from the headers: MXFP4 blocks and scales are used in place (numerics' MXFP4 views), the
 * fused bf16 experts are the one converted copy (relaid out: their own bytes again). */
Test(gpt_oss, measure_counts_mxfp4_in_place_and_the_fused_copy) {
    mf_model_bytes b;
    mf_error err = {0};
    cr_assert_eq(mf_model_measure(write_ckpt(MXFP4), MF_BF16, 0, &b, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(b.converted, 0);
    cr_assert_eq(mf_model_measure(write_ckpt(PLAIN), MF_BF16, 0, &b, &err), MF_OK, "%s", err.msg);
    cr_assert_eq(b.converted, (uint64_t)E * (2 * I * H + I * H) * 2, "the gate_up and down copies: %llu",
                 (unsigned long long)b.converted);
}
